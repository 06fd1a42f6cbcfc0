"""The C ``ggml_linear`` / ``ggml_embedding`` variants of the cpu platform against the
pure-torch references: every type, 1 to 33 activation rows, every build this CPU runs,
which build a CPU gets, the integer dots against the activations' rounding done in torch,
outputs written into a wider tensor, and the conformance kit."""

from __future__ import annotations

import json

import pytest
import torch
from gguf import GGMLQuantizationType
from plugin_checks import discovered

from hwplug import current_platform, kernels
from hwplug.conformance import check_variant
from hwplug.errors import ConfigError, UnsupportedError
from hwplug.kernel_registry import ops, ops_ggml
from hwplug.kernel_registry.reference import ggml
from hwplug.kernel_registry.reference.ggml_weights import GGML_TYPES, ggml_block, ggml_weight
from hwplug.kernel_registry.tuning import read_layer
from hwplug.platforms.cpu.ggml import ops as c_ops

VARIANTS = ("ggml_vnni", "ggml_avx2", "ggml_c")
BUILDS = {"ggml_vnni": c_ops.VNNI, "ggml_avx2": c_ops.AVX2, "ggml_c": c_ops.PORTABLE}
#: What the builds need of the CPU they run on.
NEEDS = {"ggml_vnni": {"avx2", "fma", "f16c", "avx512bw", "avx512vl", "avx512_vnni"},
         "ggml_avx2": {"avx2", "fma", "f16c"}, "ggml_c": set()}
Q = GGMLQuantizationType
#: The types whose C kernel takes int8 activations only (per 256 values, or IQ4_NL's 32).
INT8_ONLY = tuple(kind for kind in GGML_TYPES if kind not in c_ops.WIDE_TYPES)


def runnable(name: str) -> None:
    """Skip unless this CPU runs build ``name``."""
    missing = NEEDS[name] - current_platform().facts.features
    if missing:
        pytest.skip(f"this CPU lacks {', '.join(sorted(missing))} for {name}")


def built(name: str) -> c_ops.GgmlKernels:
    """Build ``name`` of the GGUF kernels, which this CPU runs (else the test skips)."""
    runnable(name)
    BUILDS[name].ensure_built()
    return BUILDS[name]


def variant(op: str, name: str):
    """The variant ``op/name`` the cpu plugin registers, loaded and its library built (the
    test skips where this CPU does not run it)."""
    current_platform()  # discovery loads the plugins
    runnable(name)
    found = kernels.get(f"{op}/{name}")
    found.load()
    found.native.ensure_built()
    return found


def weight_for(kind: int, rows: int, seed: int, blocks: int | None = None
               ) -> tuple[torch.Tensor, int]:
    """Random GGUF rows of ``kind`` and their number of inputs (``blocks`` blocks; default
    two or three)."""
    blocks = blocks or (3 if ggml_block(kind) == 32 else 2)
    cols = blocks * ggml_block(kind)
    return ggml_weight(torch.Generator().manual_seed(seed), kind, rows, cols), cols


def assert_within_tolerance(got: torch.Tensor, want: torch.Tensor) -> None:
    atol, rtol = ops_ggml.ggml_linear.tolerances[str(want.dtype).removeprefix("torch.")]
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("kind", GGML_TYPES, ids=lambda t: Q(t).name)
def test_linear_matches_the_reference_for_every_type_and_row_count(fresh_discovery, name, kind):
    linear = variant("ggml_linear", name)
    qweight, cols = weight_for(kind, 43, seed=kind)  # 43: groups of 4 weight rows + 3
    generator = torch.Generator().manual_seed(0)
    bias = torch.randn(43, generator=generator)
    switch = c_ops.tiled_from(torch.get_num_threads())[kind]
    # the AVX2 builds' tiles of eight pairs: 1 (8 weight rows x 1), 2 (4 x 2), 3 (2 x 4, a
    # row short), 5 and 8 (1 x 8), 19 (8 + 8 + 3); past the tuned switch (where the type has
    # one): the dequantized tiles
    for rows in (1, 2, 3, 5, 8, 19, *(() if switch is None else (switch + 1,))):
        x = torch.randn(rows, cols, generator=generator)
        assert linear.supports(x, qweight, kind, bias) is None
        want = ops_ggml.ggml_linear.reference(x, qweight, kind, bias)
        assert_within_tolerance(linear.impl(x, qweight, kind, bias), want)
        assert_within_tolerance(linear.impl(x, qweight, kind), want - bias)


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("kind", GGML_TYPES, ids=lambda t: Q(t).name)
def test_a_rows_outputs_do_not_depend_on_the_rows_beside_it(fresh_discovery, name, kind):
    """Batch invariance (docs/generation.md, "Numerics"): the integer kernel gives a row
    the same bits alone, in every tile shape and its tails (1 to 18 rows, 43 weight rows:
    groups of 8 and 16 with a short one) and in a prefill of 77 rows (chunks of 8 and a
    tail), with either activation type."""
    build = built(name)
    qweight, cols = weight_for(kind, 43, seed=kind)
    x = torch.randn(77, cols, generator=torch.Generator().manual_seed(kind))
    for activations in ("int8", "int16") if kind in c_ops.WIDE_TYPES else ("int8",):
        every = build.linear_blocks(x, qweight, kind, None, activations)
        for count in (*range(1, 19), 45):
            assert torch.equal(build.linear_blocks(x[-count:], qweight, kind, None, activations),
                               every[-count:]), (activations, count)


@pytest.mark.parametrize("kind", [*sorted(c_ops.WIDE_TYPES), Q.IQ4_NL], ids=lambda t: Q(t).name)
def test_every_build_gives_the_32_value_types_the_same_bits(fresh_discovery, kind):
    """The 32-value types' per-pair arithmetic (kernels.c, legacy_values: an exact integer
    dot per block, then one fmaf per block in order) is the same in every build and tile
    shape, so the portable build's outputs equal the AVX2 builds' bit for bit."""
    builds = [built(name) for name in VARIANTS if not NEEDS[name] - current_platform().facts.features]
    generator = torch.Generator().manual_seed(kind)
    # VNNI, int16: one row of 9 blocks and 2-11 rows through lw_linear (lgroup.h), one row
    # of 25 blocks through the tiles, 13 rows through lt_group; int8: from 2 rows through
    # lt_group, two blocks per step (9: the last alone; 8: none alone)
    for blocks, rows in ((9, 1), (25, 1), (8, 3), *((9, rows) for rows in (2, 3, 5, 8, 11, 13))):
        qweight, cols = weight_for(kind, 21, seed=kind + 7, blocks=blocks)
        x = torch.randn(rows, cols, generator=generator)
        for activations in ("int8", "int16") if kind in c_ops.WIDE_TYPES else ("int8",):
            first, *others = (b.linear_blocks(x, qweight, kind, None, activations)
                              for b in builds)
            for other in others:
                assert torch.equal(other, first), (blocks, rows, activations)


@pytest.mark.parametrize("name", VARIANTS)
def test_linear_keeps_leading_dimensions_and_the_activation_dtype(fresh_discovery, name):
    linear = variant("ggml_linear", name)
    qweight, cols = weight_for(Q.Q4_1, 24, seed=3)
    x = torch.randn(2, 5, cols, generator=torch.Generator().manual_seed(1))
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        out = linear.impl(x.to(dtype), qweight, Q.Q4_1)
        assert_within_tolerance(out, ops_ggml.ggml_linear.reference(x.to(dtype), qweight, Q.Q4_1))
    assert linear.impl(x[:0], qweight, Q.Q4_1).shape == (0, 5, 24)


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("kind", [Q.Q4_K, Q.Q6_K, Q.Q8_0], ids=lambda t: Q(t).name)
def test_the_result_does_not_depend_on_the_thread_count(fresh_discovery, name, kind):
    linear, threads = variant("ggml_linear", name), torch.get_num_threads()
    qweight, cols = weight_for(kind, 256, seed=4)  # large enough to run in parallel
    x = torch.randn(5, cols, generator=torch.Generator().manual_seed(2))
    try:
        torch.set_num_threads(1)
        one = linear.impl(x, qweight, kind)
        torch.set_num_threads(max(2, threads))
        assert torch.equal(linear.impl(x, qweight, kind), one)  # each row: one thread
    finally:
        torch.set_num_threads(threads)


def rounded_like_the_kernel(x: torch.Tensor, block: int) -> torch.Tensor:
    """``x`` with each ``block`` values rounded to int8 steps of their max|x| / 127, half to
    even, as the C kernel rounds the activations before its integer dots."""
    blocks = x.reshape(x.shape[0], -1, block)
    amax = blocks.abs().amax(-1, keepdim=True)
    steps = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    return (torch.round(blocks * steps) * (amax / 127.0)).reshape(x.shape)


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("kind", INT8_ONLY, ids=lambda t: Q(t).name)
def test_int8_dots_equal_the_rounded_activations_times_the_weight(fresh_discovery, name, kind):
    """The super-block kernels (integer sub-block scales, mins and centres against the
    activations' 16-value sums, one fp32 scale per 256) and IQ4_NL's compute exactly
    ``rounded(x) @ W.T``: only fp32 rounding separates them, ~1e-6 of the outputs' rms, far
    below the int8 rounding itself (~5e-3)."""
    build = built(name)
    qweight, cols = weight_for(kind, 37, seed=kind + 5, blocks=3 if ggml_block(kind) == 256
                               else 24)
    weight = ggml.dequantize(qweight, kind).double()
    generator = torch.Generator().manual_seed(6)
    for rows in (1, 2, 5, 9):  # 9: the VNNI build's groups of 16 weight rows (kgroup.h)
        x = torch.randn(rows, cols, generator=generator)
        x[0, :ggml_block(kind)] = 0.0  # an all-zero block: scale 0
        got = build.linear_blocks(x, qweight, kind, None, "int8")
        want = (rounded_like_the_kernel(x, 256 if ggml_block(kind) == 256 else 32).double()
                @ weight.T)
        torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=1e-5)
        assert (got.double() - x.double() @ weight.T).abs().max() > 1e-3  # it did round


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("kind", GGML_TYPES, ids=lambda t: Q(t).name)
def test_embedding_dequantizes_the_rows_it_reads_exactly(fresh_discovery, name, kind):
    embedding = variant("ggml_embedding", name)
    qweight, cols = weight_for(kind, 50, seed=kind + 1)
    for ids in (torch.tensor([49, 0, 7, 7]), torch.tensor([3], dtype=torch.int32),
                torch.tensor([], dtype=torch.int64)):
        rows = embedding.impl(ids, qweight, kind)
        assert rows.shape == (len(ids), cols)
        torch.testing.assert_close(rows, ops_ggml.ggml_embedding.reference(ids, qweight, kind),
                                   atol=1e-6, rtol=1e-6)
    with pytest.raises(UnsupportedError, match=r"token ids must lie in \[0, 50\)"):
        embedding.impl(torch.tensor([50]), qweight, kind)


@pytest.mark.parametrize("name", VARIANTS)
def test_the_embedding_op_copies_fp32_rows_exactly(fresh_discovery, name):
    lookup = variant("embedding", name)
    table = torch.randn(50, 72)
    for ids in (torch.tensor([49, 0, 7, 7]), torch.tensor([3], dtype=torch.int32),
                torch.tensor([], dtype=torch.int64)):
        assert lookup.supports(ids, table) is None
        assert torch.equal(lookup.impl(ids, table), ops.embedding.reference(ids, table))
    with pytest.raises(UnsupportedError, match=r"token ids must lie in \[0, 50\), got -1 .. 3"):
        lookup.impl(torch.tensor([3, -1]), table)
    assert "contiguous float32 [V, H] table, got torch.bfloat16" in lookup.supports(
        torch.tensor([0]), table.bfloat16())
    assert "1-D int64 or int32" in lookup.supports(torch.tensor([[0]]), table)


def test_calls_the_c_kernels_do_not_serve_are_declined_with_the_reason(fresh_discovery):
    linear, embedding = variant("ggml_linear", "ggml_avx2"), variant("ggml_embedding", "ggml_c")
    qweight, cols = weight_for(Q.Q8_0, 8, seed=5)
    x = torch.randn(2, cols)
    f16 = torch.zeros(8, 2 * cols, dtype=torch.uint8)
    assert "type F16 not served (serves Q4_0" in linear.supports(x, f16, Q.F16)
    assert "type F16 not served" in embedding.supports(torch.tensor([0]), f16, Q.F16)
    assert "non-contiguous" in linear.supports(x, qweight.t().contiguous().t(), Q.Q8_0)
    assert "not 64 Q8_0 values" in linear.supports(x[:, :64], qweight, Q.Q8_0)
    assert "bias of shape [7]" in linear.supports(x, qweight, Q.Q8_0, torch.zeros(7))
    # through the op, a declined call falls back to the reference
    assert torch.equal(ops_ggml.ggml_linear(x, f16, Q.F16), torch.zeros(2, 8))


@pytest.mark.parametrize("flags, chain", [
    ("avx2 fma f16c", ["ggml_avx2", "ggml_c", "reference"]),
    ("avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni",
     ["ggml_vnni", "ggml_avx2", "ggml_c", "reference"]),
], ids=["avx2", "avx512-vnni"])
def test_an_x86_cpu_gets_the_best_build_it_runs(tmp_path, monkeypatch, fresh_discovery, flags,
                                                chain):
    from fake_hw import x86_cpuinfo

    x86_cpuinfo(tmp_path, f"fpu sse sse2 avx {flags}")
    platform = discovered(monkeypatch, tmp_path, "cpu")
    for op in ("ggml_linear", "ggml_embedding"):
        why = kernels.explain(op, platform, "cpu", "float32" if op == "ggml_linear" else "int64")
        names = [v.name for v in why.chain]
        # ggml_linear's F32 rows (a router) go to the fp32 C linear after the GGUF builds
        assert [n for n in names if not n.startswith("f32_rows")] == chain, names


@pytest.mark.parametrize("cpu", ["x86 without avx2", "arm"])
def test_other_cpus_get_the_portable_build(tmp_path, monkeypatch, fresh_discovery, cpu):
    from fake_hw import arm_cpuinfo, x86_cpuinfo

    if cpu == "arm":
        arm_cpuinfo(tmp_path)
    else:
        x86_cpuinfo(tmp_path, "fpu sse sse2 avx")
    platform = discovered(monkeypatch, tmp_path, "cpu")
    why = kernels.explain("ggml_linear", platform, "cpu", "float32")
    assert why.chosen.name == "ggml_c"
    assert why.rejected["ggml_avx2"].startswith("needs device feature ")
    qweight, cols = weight_for(Q.Q4_0, 16, seed=6)
    x = torch.randn(3, cols)
    assert_within_tolerance(ops_ggml.ggml_linear(x, qweight, Q.Q4_0),
                            ops_ggml.ggml_linear.reference(x, qweight, Q.Q4_0))
    assert ops_ggml.ggml_linear.variants_used() == {"ggml_c"}


@pytest.mark.parametrize("key", [f"{op}/{name}" for op in ("ggml_linear", "ggml_embedding")
                                 for name in VARIANTS])
def test_the_conformance_kit_checks_the_variants(fresh_discovery, key):
    fresh_discovery.current_platform()
    result = check_variant(key, examples=30)
    assert result.status == "passed", result.detail


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("kind", sorted(c_ops.WIDE_TYPES), ids=lambda t: Q(t).name)
def test_int16_activations_keep_the_outputs_far_closer_than_int8(fresh_discovery, name, kind):
    """int16 steps are 258 times finer than int8's: measured worst errors over these calls
    (every type, both builds) 9.7e-5 for int16, 6e-3 to 2.8e-2 per type for int8."""
    build = built(name)
    qweight, cols = weight_for(kind, 40, seed=kind + 2)
    generator = torch.Generator().manual_seed(4)
    bias = torch.randn(40, generator=generator)
    for rows in (1, 3, 8, 33):
        x = torch.randn(rows, cols, generator=generator)
        want = ops_ggml.ggml_linear.reference(x, qweight, kind, bias)
        wide = build.linear_blocks(x, qweight, kind, bias, "int16")
        torch.testing.assert_close(wide, want, atol=2e-4, rtol=1e-5)
        narrow = build.linear_blocks(x, qweight, kind, bias, "int8")
        assert_within_tolerance(narrow, want)
        assert (narrow - want).abs().max() > 10 * (wide - want).abs().max()


@pytest.mark.parametrize("name", VARIANTS)
def test_integer_dots_hold_the_largest_weights_and_activations_exactly(fresh_discovery, name):
    """The int32 lanes' worst cases: Q8_0 quants of -128 (against int16 and int8
    activations) and Q6_K's (0 - 32) * -128 = 4096 (int8 per 256) against activations that
    all round to the largest step; every output is exact in fp32."""
    build = built(name)
    one = torch.tensor([1.0], dtype=torch.float16).view(torch.uint8)
    q8 = torch.cat([one, torch.full((32,), 0x80, dtype=torch.uint8)]).repeat(2, 16)
    q6 = torch.cat([torch.zeros(192, dtype=torch.uint8), torch.full((16,), 0x80, dtype=torch.uint8),
                    one]).repeat(2, 2)
    for qweight, kind, value in ((q8, Q.Q8_0, -128.0), (q6, Q.Q6_K, 4096.0),
                                 (q6.repeat(8, 1), Q.Q6_K, 4096.0),  # 16 rows x 8: kgroup
                                 (q8.repeat(8, 1), Q.Q8_0, -128.0)):  # lgroup's lw_linear
        x = torch.ones(8 if qweight.shape[0] == 16 else 1, 512)
        want = ops_ggml.ggml_linear.reference(x, qweight, kind)
        assert torch.equal(want, torch.full((x.shape[0], qweight.shape[0]), 512 * value))
        for activations in c_ops.ACTIVATIONS if kind in c_ops.WIDE_TYPES else ("int8",):
            assert torch.equal(build.linear_blocks(x, qweight, kind, None, activations), want)
            assert torch.equal(build.linear_blocks(-x, qweight, kind, None, activations), -want)


def user_table(tmp_path, monkeypatch, entry: dict) -> None:
    """``entry`` as the user's ``ggml_linear`` table at every thread bucket hwplug's has."""
    buckets = read_layer(c_ops.TUNING)["default"]
    (tmp_path / "ggml_linear.json").write_text(
        json.dumps({"default": dict.fromkeys(buckets, entry)}))
    monkeypatch.setenv("HWPLUG_TUNING_DIR", str(tmp_path))
    c_ops.tiled_from.cache_clear()
    c_ops.activations_of.cache_clear()


@pytest.fixture
def shipped_tables():
    """hwplug's own tuning, cached afresh before and after the test."""
    c_ops.tiled_from.cache_clear()
    c_ops.activations_of.cache_clear()
    yield torch.get_num_threads()
    c_ops.tiled_from.cache_clear()
    c_ops.activations_of.cache_clear()


def test_a_user_tuning_table_moves_the_switch_to_the_tiles(fresh_discovery, tmp_path,
                                                           monkeypatch, shipped_tables):
    linear, build = variant("ggml_linear", "ggml_avx2"), c_ops.AVX2
    qweight, cols = weight_for(Q.Q4_1, 64, seed=7)
    x = torch.randn(1, cols, generator=torch.Generator().manual_seed(3))
    shipped = c_ops.tiled_from(shipped_tables)
    assert torch.equal(linear.impl(x, qweight, Q.Q4_1),
                       build.linear_blocks(x, qweight, Q.Q4_1, None, "int16"))
    user_table(tmp_path, monkeypatch, {"Q4_1": 1})
    assert c_ops.tiled_from(shipped_tables) == {**shipped, int(Q.Q4_1): 1}  # the rest: shipped
    assert torch.equal(linear.impl(x, qweight, Q.Q4_1), build.linear_tiled(x, qweight, Q.Q4_1))


def test_a_user_tuning_table_chooses_int8_activations(fresh_discovery, tmp_path, monkeypatch,
                                                      shipped_tables):
    linear, build = variant("ggml_linear", "ggml_avx2"), c_ops.AVX2
    qweight, cols = weight_for(Q.Q4_1, 64, seed=8)
    x = torch.randn(2, cols, generator=torch.Generator().manual_seed(5))
    shipped, rows = c_ops.activations_of(shipped_tables), c_ops.tiled_from(shipped_tables)
    assert set(shipped) == set(GGML_TYPES) and shipped[int(Q.Q4_1)] == "int16"
    assert {shipped[kind] for kind in INT8_ONLY} == {"int8"}
    user_table(tmp_path, monkeypatch, {"activations": {"Q4_1": "int8"}})
    assert c_ops.activations_of(shipped_tables) == {**shipped, int(Q.Q4_1): "int8"}
    assert c_ops.tiled_from(shipped_tables) == rows
    assert torch.equal(linear.impl(x, qweight, Q.Q4_1),
                       build.linear_blocks(x, qweight, Q.Q4_1, None, "int8"))
    user_table(tmp_path, monkeypatch, {"activations": {"Q4_1": "int4"}})
    with pytest.raises(ConfigError, match="activations 'int4' for Q4_1 is not one of int8, int16"):
        linear.impl(x, qweight, Q.Q4_1)
    user_table(tmp_path, monkeypatch, {"activations": {"Q6_K": "int16"}})
    with pytest.raises(ConfigError, match="Q6_K takes int8 activations only"):
        linear.impl(x, qweight, Q.Q4_1)


@pytest.mark.parametrize("name", VARIANTS)
def test_runs_of_several_types_write_their_columns_of_one_output(fresh_discovery, name):
    """A fused layer's runs (Q5_0 then Q8_0 rows, as SmolLM2 Q4_K_M's q/k/v; Q4_K then Q6_K)
    each write their columns of one wider output through ``out``: in place (the same
    tensor, the other columns untouched), equal to the call without it, bias included."""
    linear = variant("ggml_linear", name)
    generator = torch.Generator().manual_seed(9)
    for first, second, cols in ((Q.Q5_0, Q.Q8_0, 96), (Q.Q4_K, Q.Q6_K, 512)):
        w1 = ggml_weight(generator, first, 12, cols)
        w2 = ggml_weight(generator, second, 7, cols)
        bias = torch.randn(19, generator=generator)
        for rows in (1, 3):
            x = torch.randn(rows, cols, generator=generator)
            out = torch.full((rows, 21), 7.0)  # two spare columns after the runs
            for kind, weight, (start, stop) in ((first, w1, (0, 12)), (second, w2, (12, 19))):
                part = out[:, start:stop]
                assert linear.supports(x, weight, kind, bias[start:stop], out=part) is None
                got = linear.impl(x, weight, kind, bias[start:stop], out=part)
                assert got.data_ptr() == part.data_ptr()
                assert torch.equal(got, linear.impl(x, weight, kind, bias[start:stop]))
            assert torch.equal(out[:, 19:], torch.full((rows, 2), 7.0))
            want = torch.cat([ops_ggml.ggml_linear.reference(x, w1, first, bias[:12]),
                              ops_ggml.ggml_linear.reference(x, w2, second, bias[12:])], -1)
            assert_within_tolerance(out[:, :19], want)
    assert "out torch.float32 [1, 5] is not torch.float32 [1, 7]" in linear.supports(
        x[:1], w2, second, out=out[:1, :5])
