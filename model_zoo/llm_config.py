"""``LLMConfig``: every option of :class:`~hwplug.LLM` (and ``hwplug generate``), declared once.

Each option is one field of the frozen :class:`LLMConfig`: its name, type and default, and
in its metadata an :class:`Option` with the check every value passes (a wrong type, an
empty string or a value out of range is a :class:`~hwplug.errors.ConfigError` naming the
option), its help, how the CLI spells it, and the ``HWPLUG_*`` variable read when the
option is not given. :meth:`LLMConfig.create` applies them all, once, before anything
loads; ``LLM``'s signature, the CLI's flags (:mod:`hwplug.cli.llm_flags`) and ``hwplug
info``'s option table are generated from the fields. :class:`ResolvedConfig` adds what
the platform settled when the model was built.
"""

from __future__ import annotations

import inspect
import json
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from hwplug import checks, envs
from hwplug.connector import Connector, KVLoadFailurePolicy
from hwplug.dtypes import AUTO, FLOAT_DTYPES, FNUZ_DTYPES, FP8_KV_DTYPES
from hwplug.errors import ConfigError

#: Share of the platform's free memory the KV cache takes at most when ``num_kv_blocks``
#: is None (what ``max_num_seqs`` sequences of ``max_model_len`` tokens use, if less).
DEFAULT_KV_CACHE_FRACTION = 0.02
#: ``max_model_len`` when None: the model's context length, at most this many tokens
#: (llama.cpp's default context), so a model of a 128k context does not size its KV cache
#: for 128k tokens unless asked.
DEFAULT_MAX_MODEL_LEN = 4096
KV_SCALE_GRANULARITIES = ("tensor", "head")
#: ``rendezvous_timeout_s``'s default: spawned ranks import torch and hwplug before they
#: join, which takes seconds, not minutes.
DEFAULT_RENDEZVOUS_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Option:
    """How one :class:`LLMConfig` field is checked, documented and spelt on the CLI.

    ``parse`` turns a CLI string into a value (None: the string itself; boolean options
    are ``--name`` / ``--no-name`` flags). ``cli=False`` keeps an option off the command
    line (a value only Python can give, e.g. a class). ``env`` names the ``HWPLUG_*``
    variable read when the option is not given (a string there is parsed by ``parse``,
    as on the command line).
    """

    help: str
    check: checks.Check
    parse: Callable[[str], Any] | None = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    cli: bool = True
    env: str | None = None


def option(default: Any, help: str, check: checks.Check, **spelling: Any) -> Any:
    """A :class:`LLMConfig` field: ``default`` and an :class:`Option` of the rest."""
    return field(default=default, metadata={"option": Option(help, check, **spelling)})


def _model(name: str, value: Any) -> Any:
    """None, or a path or alias as a non-empty string (the loaders check what it names)."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ConfigError(f"{name} must be None (the default model), an alias or a path, "
                          f"got {checks.describe(value)}")
    return value


def _connector(name: str, value: Any) -> Any:
    if isinstance(value, type) and issubclass(value, Connector):
        return value
    if value is None or isinstance(value, str):
        return checks.text(none="no connector")(name, value)
    raise ConfigError(f"{name} must name a registered connector or be a Connector "
                      f"subclass, got {checks.describe(value)}")


def _json_mapping(text: str) -> Any:
    """A CLI mapping: JSON text, or ``@path`` of a file holding it."""
    source = Path(text[1:]).read_text(encoding="utf-8") if text.startswith("@") else text
    try:
        return json.loads(source)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not valid JSON ({exc}): {text[:60]!r}") from None


def _speculative(name: str, value: Any) -> Any:
    """None, or a ``speculative_config`` mapping its proposer accepts (a dict copy)."""
    if value is None:
        return None
    from hwplug.model_zoo.speculative.config import SpeculativeConfig

    SpeculativeConfig.create(name, value)
    return dict(value)


def _int_or_fraction(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        return float(text)


_POLICIES = tuple(p.value for p in KVLoadFailurePolicy)


@dataclass(frozen=True)
class LLMConfig:
    """What a user decides about one ``LLM``: checked, frozen (see each option's help)."""

    model: str | None = option(
        None, "an alias of a packaged model (smollm2, the default; all-minilm-l6-v2), a .gguf "
        "file, or a Hugging Face style directory; nothing is downloaded", _model, metavar="M")
    dtype: str = option(
        AUTO, "compute dtype; auto: the platform's best dtype that the checkpoint allows",
        checks.choice((AUTO, *FLOAT_DTYPES)), choices=(AUTO, *FLOAT_DTYPES))
    dequantize: bool = option(
        False, "load a quantized checkpoint (a GGUF's blocks) as float weights in dtype",
        checks.boolean)
    max_num_seqs: int = option(64, "sequences run at once at most", checks.integer(1),
                               parse=int, metavar="N")
    max_num_batched_tokens: int = option(
        2048, "tokens one step computes at most (longer prompts prefill in chunks)",
        checks.integer(1), parse=int, metavar="N")
    max_model_len: int | None = option(
        None, f"tokens one sequence holds at most (prompt and output); default: the model's "
        f"context length, at most {DEFAULT_MAX_MODEL_LEN}",
        checks.integer(1, none="the model's context length, capped"), parse=int, metavar="N")
    block_size: int | None = option(
        None, "tokens per KV block; default: the attention backend's choice",
        checks.integer(1, none="the platform's choice"), parse=int, metavar="N")
    num_kv_blocks: int | float | None = option(
        None, f"KV blocks per layer: a count, or a fraction in (0, 1) of free memory "
        f"(default: what max_num_seqs sequences of max_model_len tokens use, within "
        f"{DEFAULT_KV_CACHE_FRACTION})", checks.fraction_or_count,
        parse=_int_or_fraction, metavar="N|F")
    attention_backend: str | None = option(
        None, "the attention backend to use; default: the platform's first that can serve "
        "the model", checks.text(none="the platform's choice"), metavar="NAME",
        env="HWPLUG_ATTENTION_BACKEND")
    kv_cache_dtype: str | None = option(
        None, "the KV cache's dtype (default: dtype)",
        checks.choice((*FLOAT_DTYPES, *FP8_KV_DTYPES, *FNUZ_DTYPES), none="the compute dtype"),
        choices=(*FLOAT_DTYPES, *FP8_KV_DTYPES, *FNUZ_DTYPES))
    calculate_kv_scales: bool = option(
        False, "fp8 KV cache: compute the k/v scales from the first batch (default: the "
        "checkpoint's, else 1)", checks.boolean)
    kv_scale_granularity: str = option(
        "tensor", "calculated k/v scales per tensor or per KV head",
        checks.choice(KV_SCALE_GRANULARITIES), choices=KV_SCALE_GRANULARITIES)
    seed: int | None = option(
        None, "seed of sampled requests that carry none", checks.integer(0, checks.MAX_SEED,
                                                                          none="random"),
        parse=int, metavar="S")
    enable_prefix_caching: bool = option(
        True, "reuse the KV blocks of prompt prefixes computed before", checks.boolean)
    kv_connector: str | type[Connector] | None = option(
        None, "a KV connector (a registered name, or a Connector subclass in Python)",
        _connector, metavar="NAME", env="HWPLUG_KV_CONNECTOR")
    kv_connector_config: Mapping[str, Any] | None = option(
        None, "the connector's options (CLI: JSON, or @file holding it)",
        checks.mapping(none="no options"), parse=_json_mapping, metavar="JSON",
        env="HWPLUG_KV_CONNECTOR_CONFIG")
    kv_load_failure_policy: str | None = option(
        None, "what a failed KV load does: fail the request, or recompute the blocks",
        checks.choice(_POLICIES, none="the connector's"), choices=_POLICIES,
        env="HWPLUG_KV_LOAD_FAILURE_POLICY")
    kv_events_endpoint: str | None = option(
        None, "publish KV events over ZeroMQ here (e.g. tcp://*:5557)",
        checks.zmq_endpoint(none="not published"), metavar="URL")
    tensor_parallel_size: int = option(1, "split the model over N processes",
                                       checks.integer(1), parse=int, metavar="N")
    enable_expert_parallel: bool = option(
        False, "under tensor parallelism, place whole experts of mixture-of-experts layers on "
        "the ranks and send each token to its experts' ranks (all-to-all)", checks.boolean)
    rendezvous_timeout_s: float = option(
        DEFAULT_RENDEZVOUS_TIMEOUT_S, "seconds the ranks of a tensor-parallel run wait for "
        "each other to join; a rank that dies or never joins is a WorkerError after this",
        checks.real(0, threading.TIMEOUT_MAX, low_open=True), parse=float, metavar="S",
        env="HWPLUG_RENDEZVOUS_TIMEOUT_S")
    data_parallel_size: int = option(1, "run N engine replicas sharing the prompts",
                                     checks.integer(1), parse=int, metavar="N")
    step_graphs: bool = option(
        True, "replay recorded decode steps where the platform can (docs/generation.md)",
        checks.boolean)
    speculative_config: Mapping[str, Any] | None = option(
        None, 'speculative decoding: {"method": "ngram" or "draft_model", '
        '"num_speculative_tokens": k, and the method\'s options} (CLI: JSON, or @file holding '
        'it; docs/generation.md)', _speculative, parse=_json_mapping, metavar="JSON")

    @classmethod
    def create(cls, **values: Any) -> LLMConfig:
        """Check ``values`` (option name -> value); an option not given takes its
        ``HWPLUG_*`` variable where it has one and that is set, else its default. Raises
        :class:`ConfigError` naming an unknown option or the first wrong value."""
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ConfigError(f"unknown LLM option {', '.join(unknown)}; options: "
                              f"{', '.join(known)}")
        checked = {}
        for name, spec in known.items():
            opt: Option = spec.metadata["option"]
            if name in values:
                value = values[name]
            elif opt.env and envs.get(opt.env) is not None:
                name, value = opt.env, envs.get(opt.env)
                if opt.parse is not None and isinstance(value, str):
                    value = opt.parse(value)  # as the CLI spells it (JSON, @file, ...)
            else:
                continue
            checked[spec.name] = opt.check(name, value)
        config = cls(**checked)
        if config.kv_connector is None and (config.kv_connector_config
                                            or config.kv_load_failure_policy):
            raise ConfigError("kv_connector_config and kv_load_failure_policy need a "
                              "kv_connector")
        return config

    def given(self) -> dict[str, Any]:
        """The options that differ from their defaults."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) != f.default}

    def replace(self, **changes: Any) -> LLMConfig:
        """A copy with ``changes`` applied and checked."""
        return self.create(**{**self.given(), **changes})


def options() -> dict[str, tuple[Any, Option]]:
    """Every option: name -> (default, :class:`Option`), in declaration order."""
    return {f.name: (f.default, f.metadata["option"]) for f in fields(LLMConfig)}


def signature(first: str = "model") -> inspect.Signature:
    """``(self, model=None, *, dtype='auto', ...)``: ``LLM.__init__``'s signature, from the
    fields (for ``help()`` and editors)."""
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for f in fields(LLMConfig):
        kind = (inspect.Parameter.POSITIONAL_OR_KEYWORD if f.name == first
                else inspect.Parameter.KEYWORD_ONLY)
        params.append(inspect.Parameter(f.name, kind, default=f.default, annotation=f.type))
    return inspect.Signature(params, return_annotation=None)


@dataclass(frozen=True)
class ResolvedConfig:
    """An ``LLM``'s configuration once its model is built: the user's :class:`LLMConfig`
    and what the platform settled (dtypes, attention backend, block size, quant method,
    how the weights are held (in place or in memory; what is dequantized and why), the
    longest sequence and the KV cache with why that size, whether decode steps replay,
    and why not, and speculative decoding's proposer)."""

    options: LLMConfig
    platform: str
    dtype: str
    kv_cache_dtype: str
    attention_backend: str
    block_size: int
    quant_method: str
    weights: str
    max_model_len: int
    num_kv_blocks: int
    kv_cache: str
    step_graphs: str
    #: Speculative decoding's proposer and k, or "off".
    speculative: str = "off"

    def describe(self) -> dict[str, Any]:
        """Plain data: the settled values, then the options given."""
        settled = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "options"}
        return {**settled, "options": self.options.given()}

