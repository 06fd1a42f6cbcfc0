"""``SpeculativeConfig``: ``LLM(speculative_config={...})`` checked against its proposer.

The mapping names a registered proposer (``method``, see
:data:`hwplug.registries.proposers`), how many tokens it proposes per step
(``num_speculative_tokens``: the most; ``adaptive_length``, default True, lets each
sequence propose fewer where its recent acceptance does not pay for the verify rows, see
:mod:`hwplug.model_zoo.engine.proposal_length`), and that proposer's own options, which its
class checks (:meth:`~hwplug.model_zoo.speculative.proposer.Proposer.check_options`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hwplug import checks, registries
from hwplug.errors import ConfigError

#: Most tokens proposed per step: a verify step's k + 1 queries per sequence stay within
#: what the decode attention kernels take as decode rows (16).
MAX_SPECULATIVE_TOKENS = 15


@dataclass(frozen=True)
class SpeculativeConfig:
    """A checked ``speculative_config``: the proposer's name, ``k``, whether the length
    adapts, and the proposer's options (each given or its default)."""

    method: str
    num_speculative_tokens: int
    options: Mapping[str, Any] = field(default_factory=dict)
    adaptive_length: bool = True

    @classmethod
    def create(cls, name: str, value: Mapping[str, Any]) -> SpeculativeConfig:
        """Check option ``name``'s mapping ``value``; :class:`ConfigError` naming the
        registered methods, the valid ``k`` or the proposer's options."""
        given = dict(checks.mapping()(name, value))
        method = given.pop("method", None)
        known = sorted(registries.proposers.names())
        if method not in known:
            raise ConfigError(f"{name}['method'] must be one of {', '.join(known)}, got "
                              f"{method!r}")
        k = checks.integer(1, MAX_SPECULATIVE_TOKENS)(
            f"{name}['num_speculative_tokens']", given.pop("num_speculative_tokens", None))
        adaptive = checks.boolean(f"{name}['adaptive_length']",
                                  given.pop("adaptive_length", True))
        options = registries.proposers.get(method).check_options(name, given)
        return cls(method, k, options, adaptive)

    def describe(self) -> str:
        extra = "".join(f", {key}={value}" for key, value in self.options.items())
        fixed = "" if self.adaptive_length else ", adaptive_length=False"
        return f"{self.method}, k={self.num_speculative_tokens}{fixed}{extra}"
