"""Attention backends against the reference semantics, through their own KV layout.

Each scenario (prefill, chunked prefill, decode, a speculative verify step of several
queries per decoding sequence, a mixed batch, GQA, sliding window, soft cap, non-causal)
runs a sequence of engine steps through the backend exactly as an engine would: the
cache is allocated with the backend's ``kv_cache_shape``, new K/V go in through its own
path (``forward`` when ``updates_kv_cache_in_forward``, else
``write_kv_cache`` then ``forward``), and a later step attends to what earlier steps
wrote. Every step's output is compared with the pure-torch references
(``reshape_and_cache`` into an ``NHD`` cache, then ``paged_attention``) within the
``paged_attention`` tolerance, and the backend's cache, read through its declared
layout's ``to_reference``, must hold what the reference wrote (connectors move its
blocks through that layout). A cache write that raises is reported as a layout
mismatch, with the shape the backend's ``kv_cache_shape`` declared next to the tensors'.
Scenarios the backend does not claim (its class attributes) are skipped, and a separate
check makes sure ``validate`` refuses them (and a latent spec, or for an MLA backend a
standard one). An MLA backend (``is_mla``) runs the causal scenarios against the MLA
references instead (:mod:`hwplug.conformance.mla_backends`). GQA examples always have more than one KV head.

A backend for the platform present runs on its device; what the device does not meet
(``validate(spec, platform)``: capability) is "not checked here". A scenario that matched
is ``passed`` only when its outputs and cache were observed on that device, else
``simulated`` (:func:`hwplug.conformance.execution.ran_on`). A backend for a platform
that is not present runs on CPU in its stead, as a simulated platform does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import torch
from hypothesis import strategies as st

from hwplug import ops
from hwplug.attention import (
    AttentionBackend,
    AttentionMetadata,
    AttentionSpec,
    PagedAttentionParams,
)
from hwplug.conformance.compare import loosest_tolerance, mismatch
from hwplug.conformance.execution import Observed, observing, ran_on
from hwplug.conformance.explore import (
    Failure,
    check_claimed_spec,
    first_failure,
    guarded,
    judge,
)
from hwplug.conformance.mla_backends import MLA_SCENARIOS, NOT_MLA, MLARun, mla_examples, mla_spec
from hwplug.conformance.paged_batches import BlockLayout, PagedBatch, Step, mixed_step, verify_step
from hwplug.conformance.result import Check, CheckResult, Outcome, Status
from hwplug.conformance.target import Placement
from hwplug.dtypes import DTYPE_NAMES, torch_dtype
from hwplug.kv_cache_layout import registered_layout

#: Two steps per sequence: the first may be empty (the sequence starts in step two).
Plan = tuple[Step, Step]


def _two_steps(first: st.SearchStrategy[int], second: st.SearchStrategy[int]
               ) -> st.SearchStrategy[Plan]:
    return st.builds(lambda a, b: (Step(0, a), Step(a, b)), first, second)


_PREFILL = _two_steps(st.just(0), st.integers(1, 24))
_CHUNKED = _two_steps(st.integers(1, 16), st.integers(2, 12))
_DECODE = _two_steps(st.integers(1, 40), st.just(1))
_VERIFY = verify_step().map(lambda s: (Step(0, s.context), Step(s.context, s.new)))
_MIXED = st.one_of(_PREFILL, _CHUNKED, _DECODE,
                   mixed_step().map(lambda s: (Step(0, s.context), Step(s.context, s.new))))


@dataclass(frozen=True)
class Scenario:
    """A kind of batch, the class attributes that claim it, and the spec options it uses."""

    name: str
    plans: st.SearchStrategy[Plan]
    claims: tuple[str, ...] = ("supports_causal",)
    causal: bool = True
    gqa: bool = False
    sliding_window: bool = False
    soft_cap: bool = False


SCENARIOS = (
    Scenario("prefill", _PREFILL),
    Scenario("chunked prefill", _CHUNKED),
    Scenario("decode", _DECODE),
    Scenario("speculative verify", _VERIFY),
    Scenario("mixed batch", _MIXED),
    Scenario("GQA", _MIXED, ("supports_causal", "supports_gqa"), gqa=True),
    Scenario("sliding window", _MIXED, ("supports_causal", "supports_sliding_window"),
             sliding_window=True),
    Scenario("soft cap", _MIXED, ("supports_causal", "supports_soft_cap"), soft_cap=True),
    Scenario("non-causal", _PREFILL, ("supports_non_causal",), causal=False),
)


@dataclass(frozen=True)
class Example:
    """One drawn run: the spec, each sequence's two steps, and the seed of its tensors."""

    spec: AttentionSpec
    plans: tuple[Plan, ...]
    seed: int

    def label(self) -> str:
        s = self.spec
        extras = "".join(f", {name}={value}" for name, value in (
            ("sliding_window", s.sliding_window), ("soft_cap", s.soft_cap)) if value)
        return (f"{s.dtype} (KV {s.kv_cache_dtype}), heads {s.num_heads}/{s.num_kv_heads}, "
                f"head size {s.head_size}, block size {s.block_size}, "
                f"causal={s.causal}{extras}")


def _small(sizes: tuple[int, ...], limit: int, default: tuple[int, ...]) -> tuple[int, ...]:
    """The sizes up to ``limit`` (or the smallest one): keeps examples fast."""
    sizes = sizes or default
    return tuple(s for s in sizes if s <= limit) or (min(sizes),)


def dtype_pairs(backend: type[AttentionBackend], dtypes: list[str] | None = None
                ) -> list[tuple[str, str]]:
    """(compute dtype, KV-cache dtype) pairs the backend claims and the kit can judge,
    compute dtypes limited to ``dtypes`` when given."""
    tolerances = ops.paged_attention.tolerances
    return [(d, kv) for d in backend.supported_dtypes
            if d in tolerances and (dtypes is None or d in dtypes)
            for kv in backend.supported_kv_cache_dtypes if kv == d or kv.startswith("fp8")]


@st.composite
def examples(draw: st.DrawFn, backend: type[AttentionBackend], scenario: Scenario,
             pairs: list[tuple[str, str]]) -> Example:
    dtype, kv_dtype = draw(st.sampled_from(pairs))
    num_kv_heads = draw(st.sampled_from((2, 3) if scenario.gqa else (1, 2)))
    group = draw(st.sampled_from((2, 4))) if scenario.gqa else 1
    spec = AttentionSpec(
        num_heads=num_kv_heads * group, num_kv_heads=num_kv_heads,
        head_size=draw(st.sampled_from(_small(backend.supported_head_sizes, 128, (32, 64)))),
        dtype=dtype, kv_cache_dtype=kv_dtype,
        block_size=draw(st.sampled_from(_small(backend.supported_block_sizes, 32, (16,)))),
        causal=scenario.causal,
        sliding_window=draw(st.integers(1, 16)) if scenario.sliding_window else None,
        soft_cap=draw(st.sampled_from((5.0, 30.0))) if scenario.soft_cap else None)
    plans = draw(st.lists(scenario.plans, min_size=1, max_size=3))
    return Example(spec, tuple(plans), draw(st.integers(0, 2**31 - 1)))


@dataclass
class _StepInputs:
    """One engine step's tensors, on the device."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    metadata: AttentionMetadata
    where: str


class _Episode:
    """One example played through a backend: the context's K/V, the backend's own cache
    (its ``kv_cache_shape``) and an ``NHD`` reference cache, advanced step by step."""

    def __init__(self, backend: type[AttentionBackend], example: Example, device: str) -> None:
        spec = self.spec = example.spec
        self.backend, self.example, self.device = backend, example, device
        self.instance = backend(spec)
        self.rng = torch.Generator().manual_seed(example.seed)
        totals = [second.context + second.new for _, second in example.plans]
        self.blocks = BlockLayout.shuffled(self.rng, totals, spec.block_size)
        self.kv_layout = registered_layout(backend.kv_cache_layout)
        self.keys = [self._randn(n, spec.num_kv_heads) for n in totals]
        self.values = [self._randn(n, spec.num_kv_heads) for n in totals]
        kv_dtype = torch_dtype(spec.kv_cache_dtype)
        self.geometry = (self.blocks.num_blocks, spec.block_size, spec.num_kv_heads,
                         spec.head_size)
        self.declared = tuple(backend.kv_cache_shape(*self.geometry))
        self.cache = torch.zeros(self.declared, dtype=kv_dtype, device=device)
        self.ref_cache = torch.zeros((2, *self.geometry), dtype=kv_dtype, device=device)
        self.scale = spec.head_size ** -0.5
        #: The reference's parameters (the backend builds its own from the spec).
        self.params = PagedAttentionParams(self.scale, spec.causal, spec.sliding_window,
                                           spec.soft_cap)

    def _randn(self, tokens: int, heads: int) -> torch.Tensor:
        shape = (tokens, heads, self.spec.head_size)
        return torch.randn(shape, generator=self.rng).to(self.device)

    def inputs(self, index: int, steps: list[Step]) -> _StepInputs:
        """The tensors and metadata of step ``index`` (0 or 1)."""
        batch = PagedBatch.build(self.blocks, steps)
        active = [(i, s) for i, s in enumerate(steps) if s.new]
        dtype = torch_dtype(self.spec.dtype)
        query = torch.cat([self._randn(s.new, self.spec.num_heads) for _, s in active])
        key = torch.cat([self.keys[i][s.context:s.context + s.new] for i, s in active])
        value = torch.cat([self.values[i][s.context:s.context + s.new] for i, s in active])
        metadata = batch.metadata(self.device)
        where = f"step {index + 1} of 2, batch {batch.label}, {self.example.label()}"
        return _StepInputs(query.to(dtype), key.to(dtype), value.to(dtype), metadata, where)

    def through_backend(self, step: _StepInputs, simulating: bool) -> torch.Tensor:
        """The engine's path: the backend's own cache write, then its forward."""
        arguments = ", ".join(f"{name}={value}" for name, value in zip(
            ("num_blocks", "block_size", "num_kv_heads", "head_size"), self.geometry,
            strict=True))
        cache = (f"kv_cache_shape({arguments}) declares {self.declared} (layout "
                 f"{self.backend.kv_cache_layout}, {self.spec.kv_cache_dtype}); the step's "
                 f"key/value are {tuple(step.key.shape)}, the reference NHD cache "
                 f"{tuple(self.ref_cache.shape)}")
        if not self.backend.updates_kv_cache_in_forward:
            guarded(partial(self.instance.write_kv_cache, step.key, step.value, self.cache,
                            step.metadata), step.where, simulating=simulating,
                    what=f"layout mismatch: write_kv_cache failed on the cache its {cache}")
        return guarded(partial(self.instance.forward, step.query, step.key, step.value,
                               self.cache, step.metadata, self.scale), step.where,
                       simulating=simulating, what="forward")

    def cache_problem(self) -> str | None:
        """Why the backend's cache, read through its layout's ``to_reference``, does not
        hold what the reference wrote into the ``NHD`` cache (within the cache write's
        tolerance), or None: what connectors read of its blocks is what it stored."""
        spec = self.spec
        problem = mismatch(self.kv_layout.to_reference(self.cache), self.ref_cache,
                           *loosest_tolerance(ops.reshape_and_cache.tolerances,
                                              (spec.dtype, spec.kv_cache_dtype)))
        return problem and (f"its cache, read as layout {self.kv_layout.name} says, is not "
                            f"what was written: {problem}")

    def reference(self, step: _StepInputs) -> torch.Tensor:
        """The same step through the pure-torch references over the NHD cache."""
        ops.reshape_and_cache.reference(step.key, step.value, self.ref_cache,
                                        step.metadata.slot_mapping, self.params)
        return ops.paged_attention.reference(step.query, self.ref_cache, step.metadata,
                                             self.params)


class _Run:
    """Plays examples through one backend on one device, counting the steps that matched."""

    def __init__(self, backend: type[AttentionBackend], placement: Placement,
                 observed: Observed) -> None:
        self.backend, self.placement, self.steps = backend, placement, 0
        self.observed = observed

    def __call__(self, example: Example) -> None:
        check_claimed_spec(self.backend, example.spec, example.label(),
                           self.placement.platform)
        episode = _Episode(self.backend, example, self.placement.device)
        tolerance = loosest_tolerance(ops.paged_attention.tolerances,
                                      (example.spec.dtype, example.spec.kv_cache_dtype))
        for index in (0, 1):
            steps = [plan[index] for plan in example.plans]
            if not any(step.new for step in steps):
                continue
            step = episode.inputs(index, steps)
            out = episode.through_backend(step, bool(self.placement.simulating))
            self.observed.tensors(out, episode.cache)
            problem = (mismatch(out, episode.reference(step), *tolerance)
                       or episode.cache_problem())
            if problem:
                raise Failure(f"{problem} at {step.where}")
            self.steps += 1


def _scenario_outcome(backend: type[AttentionBackend], scenario: Scenario,
                      placement: Placement, count: int) -> Outcome:
    unclaimed = [attr for attr in scenario.claims if not getattr(backend, attr)]
    if unclaimed:
        return "skipped", f"not claimed: {', '.join(f'{a} is False' for a in unclaimed)}"
    if backend.is_mla and scenario.name not in MLA_SCENARIOS:
        return "skipped", NOT_MLA
    notes: list[str] = []
    placement = placement.serving(backend.platforms, notes)
    pairs = dtype_pairs(backend, placement.judgeable(list(backend.supported_dtypes), notes))
    if not pairs:
        return "not checked", "; ".join(
            ["no (dtype, KV-cache dtype) pair the kit can judge here", *notes])
    with observing() as observed:
        if backend.is_mla:
            run: _Run | MLARun = MLARun(backend, placement, observed)
            strategy = mla_examples(scenario.plans, pairs,
                                    _small(backend.supported_block_sizes, 32, (16,)))
        else:
            run, strategy = _Run(backend, placement, observed), examples(backend, scenario, pairs)
        failure = first_failure(strategy, run, count)
    where = placement.describe()
    write = ("writes K/V in forward" if backend.updates_kv_cache_in_forward
             else "write_kv_cache then forward")
    untested = f"; not checked here: {'; '.join(notes)}" if notes else ""
    judged = judge(failure, where)
    if judged:
        return judged
    status, simulation = ran_on(placement, observed, backend.__module__)
    return status, (f"{run.steps} steps matched the reference {where}; layout "
                    f"{backend.kv_cache_layout}, {write}{untested}"), simulation


def _claimed_spec(backend: type[AttentionBackend]) -> AttentionSpec | None:
    pairs = dtype_pairs(backend) or [(d, kv) for d in backend.supported_dtypes
                                     for kv in backend.supported_kv_cache_dtypes]
    if not pairs:
        return None
    spec = AttentionSpec(2, 2, (backend.supported_head_sizes or (64,))[0], pairs[0][0],
                         pairs[0][1], backend.supported_block_sizes[0],
                         causal=backend.supports_causal)
    return mla_spec(spec) if backend.is_mla else spec


def _unclaimed(backend: type[AttentionBackend], base: AttentionSpec
               ) -> list[tuple[str, AttentionSpec]]:
    """Specs that differ from ``base`` only in one feature the backend does not claim."""
    probes: list[tuple[str, AttentionSpec]] = []
    if not backend.supports_sliding_window and base.causal:
        probes.append(("a sliding window", replace(base, sliding_window=8)))
    if not backend.supports_soft_cap:
        probes.append(("a soft cap", replace(base, soft_cap=30.0)))
    if not backend.supports_non_causal:
        probes.append(("non-causal attention", replace(base, causal=False)))
    if not backend.supports_causal:
        probes.append(("causal attention", replace(base, causal=True)))
    if not backend.supports_gqa:
        probes.append(("GQA", replace(base, num_heads=2 * base.num_kv_heads)))
    dtype = next((d for d in DTYPE_NAMES if d not in backend.supported_dtypes), None)
    if dtype:
        probes.append((f"dtype {dtype}", replace(base, dtype=dtype)))
    kv_dtype = next((d for d in DTYPE_NAMES if d not in backend.supported_kv_cache_dtypes), None)
    if kv_dtype:
        probes.append((f"KV-cache dtype {kv_dtype}", replace(base, kv_cache_dtype=kv_dtype)))
    if backend.supported_head_sizes:
        size = next(h for h in range(8, 1024, 8) if h not in backend.supported_head_sizes)
        probes.append((f"head size {size}", replace(base, head_size=size)))
    block = next(b for b in range(1, 1024) if b not in backend.supported_block_sizes)
    probes.append((f"block size {block}", replace(base, block_size=block)))
    return probes


def _refusal_outcome(backend: type[AttentionBackend]) -> tuple[Status, str]:
    base = _claimed_spec(backend)
    if base is None:
        return "failed", "declares no dtype and KV-cache dtype it can serve"
    refused = backend.validate(base)
    if refused:
        return "failed", f"validate refuses its own claimed spec {base}: {'; '.join(refused)}"
    probes = [*_unclaimed(backend, base), ("non-MLA attention", replace(base, is_mla=False))
              if backend.is_mla else ("MLA attention", mla_spec(base))]
    accepted = [what for what, spec in probes if not backend.validate(spec)]
    if accepted:
        return "failed", f"validate accepts what the class does not claim: {', '.join(accepted)}"
    return "passed", f"refuses {', '.join(what for what, _ in probes)}"


def backend_checks(name: str, backend: type[AttentionBackend] | Callable[[], type],
                   placement: Placement, count: int) -> list[Check]:
    """One check per scenario plus the refusal check, for backend class ``backend`` (or a
    callable returning it, so importing waits until the check runs)."""
    def load() -> type[AttentionBackend]:
        return backend if isinstance(backend, type) else backend()

    checks = [Check(f"attention {name}: {s.name}",
                    lambda s=s: _scenario_outcome(load(), s, placement, count))
              for s in SCENARIOS]
    checks.append(Check(f"attention {name}: validate refuses unclaimed features",
                        lambda: _refusal_outcome(load())))
    return checks


def check_backend(backend: type[AttentionBackend], placement: Placement | None = None,
                  examples_per_scenario: int = 4) -> list[CheckResult]:
    """Check attention backend class ``backend`` now; one result per scenario."""
    return [check.run() for check in backend_checks(backend.get_name(), backend,
                                                    placement or Placement(),
                                                    examples_per_scenario)]
