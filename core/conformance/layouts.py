"""KV-cache layouts against their contract: exact conversions and block access.

For each float and fp8 (OCP and fnuz) cache dtype, a random ``NHD`` cache is written into a cache of the
layout's own ``shape`` with ``from_reference`` (the cache must pass the layout's
``check``) and must come back bit for bit through ``to_reference``. Blocks taken with
``select_blocks`` must read, through ``to_reference``, as those blocks of the ``NHD``
cache; ``join_blocks`` of single blocks must equal their selection together; and
``write_blocks`` into a zeroed cache must place them at the ids given and touch nothing
else. A layout that holds no values (``holds_values`` False: the ``MLA`` latent cache)
gets ``NHD`` caches of one KV head and zero values. A layout that gets any of it wrong would make connectors move the wrong bytes and
the reference ops (which serve every layout through these conversions) compute on them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hwplug.conformance.execution import Observed, observing, ran_on
from hwplug.conformance.result import Check, CheckResult, Outcome
from hwplug.conformance.target import Placement
from hwplug.dtypes import FLOAT_DTYPES, FNUZ_DTYPES, FP8_KV_DTYPES, torch_dtype
from hwplug.kv_cache_layout import NHD, KVCacheLayout

__all__ = ["check_layout", "layout_check"]

#: (num_blocks, block_size, Hkv, D) of the generated caches: D whole 16-byte chunks in
#: every dtype, sizes all different so a swapped dimension shows.
GEOMETRY = (5, 4, 3, 32)
#: Block ids selected, out of order, and where they are written back.
SELECTED, TARGETS = [3, 0, 4], [1, 4, 2]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit (fp8 included): same shape and bytes."""
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                              b.contiguous().view(torch.uint8))


def _problem(layout: KVCacheLayout, dtype: torch.dtype, device: str,
             observed: Observed) -> str | None:
    """What ``layout`` gets wrong for caches of ``dtype``, or None; the caches it
    converted are recorded in ``observed``."""
    generator = torch.Generator().manual_seed(0)
    geometry = GEOMETRY if layout.holds_values else (*GEOMETRY[:2], 1, GEOMETRY[3])
    reference = torch.randn((2, *geometry), generator=generator)
    if not layout.holds_values:
        reference[1] = 0
    reference = reference.to(dtype).to(device)
    cache = reference.new_empty(layout.shape(*geometry, dtype))
    problem = layout.check(cache)
    if problem:
        return f"a cache of its own shape {tuple(cache.shape)} fails its check: {problem}"
    layout.from_reference(reference, cache)
    observed.tensors(cache, layout.to_reference(cache))
    if not _same(layout.to_reference(cache), reference):
        return "to_reference(from_reference(x)) is not x"
    selected = layout.select_blocks(cache, SELECTED)
    if not _same(layout.to_reference(selected), NHD.select_blocks(reference, SELECTED)):
        return f"select_blocks(cache, {SELECTED}) does not hold those blocks"
    joined = layout.join_blocks([layout.select_blocks(cache, [b]) for b in SELECTED])
    if not _same(joined, selected):
        return "join_blocks of single blocks differs from selecting them together"
    written = torch.zeros_like(cache)
    layout.write_blocks(written, TARGETS, selected)
    expected = torch.zeros_like(reference)
    NHD.write_blocks(expected, TARGETS, NHD.select_blocks(reference, SELECTED))
    if not _same(layout.to_reference(written), expected):
        return f"write_blocks(cache, {TARGETS}, blocks) does not put exactly those blocks there"
    return None


def _outcome(layout: KVCacheLayout, placement: Placement) -> Outcome:
    if not isinstance(layout, KVCacheLayout):
        return "failed", f"{layout!r} is not a KVCacheLayout"
    dtypes = [*FLOAT_DTYPES, *FP8_KV_DTYPES, *FNUZ_DTYPES]
    with observing() as observed:
        for name in dtypes:
            problem = _problem(layout, torch_dtype(name), placement.device, observed)
            if problem:
                return "failed", f"{name}: {problem}"
    status, simulation = ran_on(placement, observed, type(layout).__module__)
    return status, (f"round trip with NHD and block access exact in {', '.join(dtypes)} "
                    f"{placement.describe()}"), simulation


def layout_check(name: str, load: Callable[[], KVCacheLayout], placement: Placement) -> Check:
    """The contract check of KV-cache layout ``name`` (``load`` returns it when run)."""
    return Check(f"kv layout {name}", lambda: _outcome(load(), placement))


def check_layout(layout: KVCacheLayout, placement: Placement | None = None) -> CheckResult:
    """Check ``layout`` now, on CPU unless ``placement`` says otherwise."""
    return layout_check(layout.name, lambda: layout, placement or Placement()).run()
