"""Structured output: masking the tokens that would take a completion out of its language.

A request's :class:`~hwplug.model_zoo.sampling.StructuredOutput` (a JSON schema, any JSON
object, a regex or a Lark grammar) is compiled by llguidance into a grammar, checked
against the model's tokenizer when the request is made (:meth:`Grammars.check`: an
invalid one is a :class:`~hwplug.errors.ConfigError`), and each of the request's
sequences gets its own :class:`Guide`, a matcher following the tokens sampled so far.
Before each sampling the runner sets the logits of every token the guide does not allow
to ``-inf`` (:meth:`Guide.mask`); after it the engine feeds the sampled token to the
guide (:meth:`Guide.accept`) and finishes the sequence once the grammar is complete.
Log-probabilities stay those of the model's raw distribution. llguidance is imported on
first use: it is needed only by requests that ask for structured output.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import torch

from hwplug.errors import ConfigError
from hwplug.model_zoo.loaders.plain_tokenizer import PlainTokenizer
from hwplug.model_zoo.sampling import StructuredOutput

logger = logging.getLogger(__name__)

#: How JSON is laid out (a schema's ``x-guidance`` may say otherwise): one space after
#: ``,`` and ``:``, no other whitespace, so a model cannot pad the text forever.
JSON_LAYOUT = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}


class Guide:
    """One sequence's position in its grammar (an llguidance ``LLMatcher``)."""

    def __init__(self, matcher: Any) -> None:
        self._matcher = matcher

    @property
    def done(self) -> bool:
        """The text is complete (nothing more may follow) or the matcher failed."""
        return self._matcher.is_stopped() or self._matcher.is_error()

    def mask(self, logits: torch.Tensor) -> None:
        """Set the logits ``[vocab]`` of the tokens not allowed next to ``-inf`` (in place);
        a failed matcher masks nothing (the engine finishes its sequence)."""
        if self._matcher.is_error():
            return
        bias = self._matcher.compute_logit_bias()
        allowed = torch.frombuffer(bytearray(bias), dtype=torch.uint8).to(logits.device) > 0
        width = min(allowed.numel(), logits.numel())
        logits[:width].masked_fill_(~allowed[:width], float("-inf"))
        logits[width:] = float("-inf")

    def accept(self, token: int) -> bool:
        """Advance past ``token``; False when the grammar does not allow it."""
        if self._matcher.consume_token(token):
            return True
        logger.warning("structured output: token %d rejected: %s", token,
                       self._matcher.get_error())
        return False


class Grammars:
    """Compiles :class:`StructuredOutput` constraints for one tokenizer (thread-safe; the
    llguidance tokenizer is built, about a second, on first use)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        self._hf_tokenizer, self._vocab_size = tokenizer, vocab_size
        self._eos = sorted(eos_token_ids)
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    def _llguidance(self) -> tuple[Any, Any]:
        try:
            import llguidance
            import llguidance.hf
        except ImportError:
            raise ConfigError("structured output needs llguidance: pip install "
                              '"hwplug[serve]" (or llguidance)') from None
        with self._lock:
            if self._tokenizer is None:
                hf_tokenizer = self._hf_tokenizer
                if isinstance(hf_tokenizer, PlainTokenizer):  # llguidance takes transformers'
                    hf_tokenizer = hf_tokenizer.transformers()
                self._tokenizer = llguidance.hf.from_tokenizer(
                    hf_tokenizer, n_vocab=self._vocab_size,
                    eos_token=self._eos[0] if len(self._eos) == 1 else self._eos or None)
        return llguidance, self._tokenizer

    def check(self, spec: StructuredOutput) -> str:
        """The llguidance grammar of ``spec``; :class:`ConfigError` naming the problem
        when it is invalid."""
        llguidance, tokenizer = self._llguidance()
        matcher = llguidance.LLMatcher
        try:
            if spec.json_schema is not None or spec.json_object:
                grammar = matcher.grammar_from_json_schema(
                    spec.json_schema or '{"type": "object"}', defaults=JSON_LAYOUT)
            elif spec.regex is not None:
                grammar = matcher.grammar_from_regex(spec.regex)
            else:
                grammar = matcher.grammar_from_lark(spec.grammar)
        except ValueError as exc:
            raise ConfigError(f"invalid structured output: {exc}") from None
        is_error, messages = matcher.validate_grammar_with_warnings(grammar, tokenizer)
        if is_error:
            raise ConfigError(f"invalid structured output: {'; '.join(messages)}")
        return grammar

    def guide(self, spec: StructuredOutput) -> Guide:
        """A new :class:`Guide` at the start of ``spec``'s language."""
        llguidance, tokenizer = self._llguidance()
        return Guide(llguidance.LLMatcher(tokenizer, self.check(spec), log_level=0))
