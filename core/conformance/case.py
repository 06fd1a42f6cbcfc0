"""What an op's input generator yields: :class:`Case`, and the helpers generators share.

Tensors are made on CPU from a drawn seed (:func:`seeded`), so every example is
reproducible; :meth:`Case.to` moves one to the device under test.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any

import torch
from hypothesis import strategies as st

from hwplug.dtypes import torch_dtype


@dataclass
class Case:
    """One call of an op: its arguments and how to judge the result.

    ``dtypes`` name the dtypes whose tolerances apply (the loosest wins), ``label`` says
    in words what was called (shapes, dtype, options) for failure messages, and
    ``mutated`` lists positional arguments the op writes in place (compared too).
    """

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    dtypes: tuple[str, ...]
    label: str
    mutated: tuple[int, ...] = ()

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Case:
        def one(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                return fn(value)
            if is_dataclass(value) and not isinstance(value, type):  # metadata, params
                return replace(value, **{f.name: one(getattr(value, f.name))
                                         for f in fields(value) if f.init})
            return value

        return replace(self, args=tuple(one(a) for a in self.args),
                       kwargs={k: one(v) for k, v in self.kwargs.items()})

    def to(self, device: str | torch.device) -> Case:
        """The same case with every tensor on ``device`` (also those inside dataclass
        arguments such as the attention metadata and params)."""
        return self._map(lambda t: t.to(device))

    def clone(self) -> Case:
        """An independent copy (for ops that write their inputs in place)."""
        return self._map(torch.clone)

    def outputs(self, returned: Any) -> list[tuple[str, Any]]:
        """What to compare after the call, named: the returned values, then the mutated args."""
        if isinstance(returned, (tuple, list)):
            named = [(f"output {i}", value) for i, value in enumerate(returned)]
        else:
            named = [("output", returned)]
        return named + [(f"argument {i} (written in place)", self.args[i]) for i in self.mutated]


#: ``generator(dtype, tokens) -> SearchStrategy[Case]`` (see :mod:`hwplug.conformance.inputs`).
Generator = Callable[[str, st.SearchStrategy[int]], st.SearchStrategy[Case]]


def seeded(draw: st.DrawFn) -> torch.Generator:
    """A CPU generator seeded from a drawn integer: every example is reproducible."""
    return torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))


def randn(rng: torch.Generator, shape: Sequence[int], dtype: str,
           scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    """Normal values times ``scale`` plus ``shift``, in hwplug dtype ``dtype``."""
    return (torch.randn(tuple(shape), generator=rng) * scale + shift).to(torch_dtype(dtype))


def leading_shape(draw: st.DrawFn, tokens: st.SearchStrategy[int]) -> tuple[int, ...]:
    """``(T,)`` or, sometimes, ``(T, extra)``: ops over ``[..., H]`` must handle both."""
    num_tokens = draw(tokens)
    return (num_tokens, draw(st.integers(2, 3))) if draw(st.booleans()) else (num_tokens,)
