"""MLA attention backends (``is_mla``) against the MLA references, through their own cache.

The kit's scenarios of causal batches (prefill, chunked prefill, decode, a speculative
verify step, a mixed batch; see :mod:`hwplug.conformance.backends`) run as an engine runs
them: the cache is allocated with the backend's ``kv_cache_shape``, each step's latents
``kv_c``/``k_pe`` go in through ``forward_mla`` with the queries and the layer's
``W_UK``/``W_UV``, and the second step attends to what the first wrote. Every step's
output is compared with ``concat_and_cache_mla`` then ``mla_attention`` (the references)
within ``mla_attention``'s tolerance, and the backend's cache, read through its layout's
``to_reference``, must hold what the reference wrote. An fp8 cache gets a per-layer
``kv_scale``. Windows, soft caps and non-causal attention are not MLA's; GQA is every
MLA batch's shape (all query heads read the one latent head), so its scenario is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

import torch
from hypothesis import strategies as st

from hwplug.attention import AttentionSpec
from hwplug.attention_mla import MLAAttentionBackend
from hwplug.conformance.compare import loosest_tolerance, mismatch
from hwplug.conformance.execution import Observed
from hwplug.conformance.explore import Failure, check_claimed_spec, guarded
from hwplug.conformance.paged_batches import BlockLayout, PagedBatch, Step
from hwplug.conformance.target import Placement
from hwplug.dtypes import is_quantized_kv_cache, torch_dtype
from hwplug.kernel_registry import ops_mla
from hwplug.kv_cache_layout import MLA, registered_layout

#: The backend scenarios an MLA backend is checked in.
MLA_SCENARIOS = ("prefill", "chunked prefill", "decode", "speculative verify", "mixed batch")
#: Why the others are skipped.
NOT_MLA = ("an MLA backend: its query heads all read one latent head (every batch is "
           "GQA-shaped), causal, without window or soft cap")


def mla_spec(spec: AttentionSpec) -> AttentionSpec:
    """``spec`` as latent attention: one latent head of 32 + 8 (``is_mla``)."""
    return replace(spec, num_kv_heads=1, head_size=40, is_mla=True)


@dataclass(frozen=True)
class MLAExample:
    """One drawn run: the spec (``head_size`` = ``kv_lora_rank + rope``), each sequence's
    two steps, the seed of its tensors and the per-head sizes of the queries and values."""

    spec: AttentionSpec
    plans: tuple[tuple[Step, Step], ...]
    seed: int
    rope: int
    nope: int
    v_dim: int

    def label(self) -> str:
        s = self.spec
        return (f"{s.dtype} (KV {s.kv_cache_dtype}), {s.num_heads} heads, latent "
                f"{s.head_size - self.rope} + rope {self.rope}, nope {self.nope}, value "
                f"{self.v_dim}, block size {s.block_size}")


@st.composite
def mla_examples(draw: st.DrawFn, scenario_plans: st.SearchStrategy[tuple[Step, Step]],
                 pairs: list[tuple[str, str]], block_sizes: tuple[int, ...]) -> MLAExample:
    dtype, kv_dtype = draw(st.sampled_from(pairs))
    kv_lora, rope = draw(st.sampled_from((16, 32))), draw(st.sampled_from((8, 16)))
    spec = AttentionSpec(num_heads=draw(st.sampled_from((1, 2, 4))), num_kv_heads=1,
                         head_size=kv_lora + rope, dtype=dtype, kv_cache_dtype=kv_dtype,
                         block_size=draw(st.sampled_from(block_sizes)), is_mla=True)
    plans = draw(st.lists(scenario_plans, min_size=1, max_size=3))
    return MLAExample(spec, tuple(plans), draw(st.integers(0, 2**31 - 1)), rope,
                      draw(st.sampled_from((8, 16))), draw(st.sampled_from((8, 12))))


class _Episode:
    """One example played through an MLA backend and through the references."""

    def __init__(self, backend: type[MLAAttentionBackend], example: MLAExample,
                 device: str) -> None:
        spec = self.spec = example.spec
        self.backend, self.example, self.device = backend, example, device
        self.instance = backend(spec)
        rng = self.rng = torch.Generator().manual_seed(example.seed)
        totals = [second.context + second.new for _, second in example.plans]
        self.blocks = BlockLayout.shuffled(rng, totals, spec.block_size)
        self.latents = [torch.randn(n, spec.head_size, generator=rng) for n in totals]
        self.kv_lora = spec.head_size - example.rope
        dtype, kv_dtype = torch_dtype(spec.dtype), torch_dtype(spec.kv_cache_dtype)
        heads, scale = spec.num_heads, self.kv_lora ** -0.5
        self.w_uk, self.w_uv = ((torch.randn(heads, size, self.kv_lora, generator=rng) * scale
                                 ).to(dtype).to(device) for size in (example.nope, example.v_dim))
        self.layout = registered_layout(backend.kv_cache_layout)
        shape = backend.kv_cache_shape(self.blocks.num_blocks, spec.block_size, 1,
                                       spec.head_size)
        self.cache = torch.zeros(shape, dtype=kv_dtype, device=device)
        self.ref_cache = torch.zeros(MLA.shape(self.blocks.num_blocks, spec.block_size, 1,
                                               spec.head_size), dtype=kv_dtype, device=device)
        self.kv_scale = (torch.tensor(0.05, device=device)
                         if is_quantized_kv_cache(spec.kv_cache_dtype) else None)
        self.instance.kv_scale = self.kv_scale
        self.scale = (example.nope + example.rope) ** -0.5

    def step(self, index: int, steps: list[Step], simulating: bool, observed: Observed
             ) -> str | None:
        """Run step ``index`` both ways; what differs, or None."""
        batch = PagedBatch.build(self.blocks, steps)
        active = [(i, s) for i, s in enumerate(steps) if s.new]
        dtype, heads = torch_dtype(self.spec.dtype), self.spec.num_heads
        queries = [torch.randn(s.new, heads, self.example.nope + self.example.rope,
                               generator=self.rng) for _, s in active]
        q_nope, q_pe = torch.cat(queries).to(dtype).to(self.device).split(
            [self.example.nope, self.example.rope], -1)
        latents = torch.cat([self.latents[i][s.context:s.context + s.new] for i, s in active])
        kv_c, k_pe = latents.to(dtype).to(self.device).split([self.kv_lora, self.example.rope],
                                                             -1)
        metadata = batch.metadata(self.device)
        where = f"step {index + 1} of 2, batch {batch.label}, {self.example.label()}"
        out = guarded(partial(self.instance.forward_mla, q_nope, q_pe, kv_c, k_pe, self.cache,
                              metadata, self.w_uk, self.w_uv, self.scale), where,
                      simulating=simulating, what="forward_mla")
        observed.tensors(out, self.cache)
        ops_mla.concat_and_cache_mla.reference(kv_c, k_pe, self.ref_cache,
                                               metadata.slot_mapping, self.kv_scale)
        want = ops_mla.mla_attention.reference(q_nope, q_pe, self.ref_cache, metadata,
                                               self.w_uk, self.w_uv, self.scale, self.kv_scale)
        dtypes = (self.spec.dtype, self.spec.kv_cache_dtype)
        problem = mismatch(out, want, *loosest_tolerance(ops_mla.mla_attention.tolerances,
                                                         dtypes))
        if not problem:
            cache = mismatch(self.layout.to_reference(self.cache), MLA.to_reference(
                self.ref_cache), *loosest_tolerance(ops_mla.concat_and_cache_mla.tolerances,
                                                    dtypes))
            problem = cache and (f"its cache, read as layout {self.layout.name} says, is not "
                                 f"what was written: {cache}")
        return problem and f"{problem} at {where}"


class MLARun:
    """Plays examples through one MLA backend on one device, counting matched steps."""

    def __init__(self, backend: type[MLAAttentionBackend], placement: Placement,
                 observed: Observed) -> None:
        self.backend, self.placement, self.steps = backend, placement, 0
        self.observed = observed

    def __call__(self, example: MLAExample) -> None:
        check_claimed_spec(self.backend, example.spec, example.label(),
                           self.placement.platform)
        episode = _Episode(self.backend, example, self.placement.device)
        for index in (0, 1):
            steps = [plan[index] for plan in example.plans]
            if not any(step.new for step in steps):
                continue
            problem = episode.step(index, steps, bool(self.placement.simulating),
                                   self.observed)
            if problem:
                raise Failure(problem)
            self.steps += 1
