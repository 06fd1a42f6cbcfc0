"""The VNNI build's repacked Q4_K / Q5_K / Q6_K / IQ4_XS weights (kgroup.h's ``kpack_rows``): the layout
against the ``ggml_repack`` op's torch reference (and back), the outputs bitwise those of
the rows (batch invariance holds across layouts and row counts), and the calls it
declines."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType
from test_ggml_kernels import assert_within_tolerance, built, runnable, weight_for

from hwplug.conformance import check_variant
from hwplug.errors import UnsupportedError
from hwplug.kernel_registry import ops_ggml
from hwplug.kernel_registry.reference.ggml_repack import repack, unpack
from hwplug.platforms.cpu.ggml import ops as c_ops

Q = GGMLQuantizationType
REPACKED = sorted(c_ops.REPACKED_TYPES)


@pytest.mark.parametrize("kind", REPACKED, ids=lambda t: Q(t).name)
def test_the_repacked_rows_are_the_rows_words_interleaved(kind):
    build = built("ggml_vnni")
    qweight, _ = weight_for(kind, 43, seed=kind, blocks=3)  # 2 groups of 16 and 11 rows
    packed = build.repack(qweight, kind)
    assert packed.shape == qweight.shape and packed.dtype == torch.uint8
    assert torch.equal(packed, repack(qweight, kind))
    assert not torch.equal(packed[:32], qweight[:32])  # the groups did move
    assert torch.equal(unpack(packed, kind), qweight)


@pytest.mark.parametrize("kind", REPACKED, ids=lambda t: Q(t).name)
def test_repacked_weights_give_every_row_count_the_rows_bits(kind):
    """1 to 18 rows (below and past the row layout's switch to the groups, one and several
    passes of four rows and their tails), 70 (past a 64-row pass), with and without bias,
    the 11 rows after the last group from the rows' own tiles; and the reference."""
    build = built("ggml_vnni")
    qweight, cols = weight_for(kind, 43, seed=kind, blocks=3)
    packed = build.repack(qweight, kind)
    generator = torch.Generator().manual_seed(kind)
    bias = torch.randn(43, generator=generator)
    x = torch.randn(70, cols, generator=generator)
    for count in (*range(1, 19), 70):
        rows = x[-count:]
        for b in (None, bias):
            got = build.linear_repacked(rows, packed, kind, b)
            assert torch.equal(got, build.linear_blocks(rows, qweight, kind, b)), (count, b)
    assert_within_tolerance(build.linear_repacked(x[:5], packed, kind, bias),
                            ops_ggml.ggml_linear.reference(x[:5], qweight, kind, bias))


@pytest.mark.parametrize("kind", REPACKED, ids=lambda t: Q(t).name)
def test_the_repacked_result_does_not_depend_on_the_thread_count(kind):
    build = built("ggml_vnni")
    qweight, cols = weight_for(kind, 80, seed=3, blocks=4)
    x = torch.randn(9, cols, generator=torch.Generator().manual_seed(3))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        packed = build.repack(qweight, kind)
        one = build.linear_repacked(x, packed, kind)
        torch.set_num_threads(2)
        assert torch.equal(build.repack(qweight, kind), packed)
        assert torch.equal(build.linear_repacked(x, packed, kind), one)
    finally:
        torch.set_num_threads(threads)


def test_the_repacked_kernel_writes_a_column_slice_of_a_wider_output():
    build = built("ggml_vnni")
    kind = int(Q.Q4_K)
    qweight, cols = weight_for(kind, 32, seed=1)
    x = torch.randn(9, cols, generator=torch.Generator().manual_seed(1))
    wide = torch.full((9, 40), -1.0)
    build.linear_repacked(x, build.repack(qweight, kind), kind, out=wide[:, 4:36])
    assert torch.equal(wide[:, 4:36], build.linear_blocks(x, qweight, kind))
    assert (wide[:, :4] == -1).all() and (wide[:, 36:] == -1).all()


def test_types_and_builds_that_do_not_repack_are_declined_with_the_choices():
    build = built("ggml_vnni")
    qweight, cols = weight_for(int(Q.Q3_K), 16, seed=2)
    with pytest.raises(UnsupportedError, match="Q3_K is not repacked.*Q4_K, Q5_K, Q6_K, IQ4_XS"):
        build.repack(qweight, int(Q.Q3_K))
    q4k, cols = weight_for(int(Q.Q4_K), 16, seed=2)
    with pytest.raises(UnsupportedError, match="not repacked"):
        build.linear_repacked(torch.randn(2, cols), q4k, int(Q.Q3_K))
    other = built("ggml_avx2")
    with pytest.raises(UnsupportedError, match="avx2 build does not repack.*vnni"):
        other.repack(q4k, int(Q.Q4_K))


@pytest.mark.parametrize("op", ["ggml_repack", "ggml_linear_repacked", "ggml_embedding_repacked"])
def test_the_conformance_kit_checks_the_repacking_variant(fresh_discovery, op):
    """The kit's random weights of every repacked type against the torch reference."""
    runnable("ggml_vnni")
    fresh_discovery.current_platform()
    result = check_variant(f"{op}/ggml_vnni", examples=30)
    assert result.status == "passed", result.detail


@pytest.mark.parametrize("kind", REPACKED, ids=lambda t: Q(t).name)
def test_rows_read_from_the_repacked_layout_are_the_rows_values(kind):
    """Every row of 2 groups of 16 and the 11 after them (the tail), in any order and
    repeated, bitwise the dequantized original rows (C and the torch reference); and
    whatever the thread count."""
    build = built("ggml_vnni")
    qweight, _ = weight_for(kind, 43, seed=kind, blocks=3)
    packed = build.repack(qweight, kind)
    ids = torch.cat((torch.arange(43).flip(0), torch.tensor([42, 0, 17, 17, 32])))
    want = build.embedding(ids, qweight, kind)
    assert torch.equal(want, ops_ggml.ggml_embedding.reference(ids, qweight, kind))
    for index in (ids, ids.to(torch.int32), ids[:1], ids[:0]):
        got = build.embedding_repacked(index, packed, kind)
        assert torch.equal(got, want[:index.shape[0]]), index.tolist()
    assert torch.equal(ops_ggml.ggml_embedding_repacked.reference(ids, packed, kind), want)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        many = torch.arange(43).repeat(80)  # enough values for the OpenMP loop
        in_order = want[:43].flip(0)  # ids began with 42 .. 0
        assert torch.equal(build.embedding_repacked(many, packed, kind), in_order.repeat(80, 1))
    finally:
        torch.set_num_threads(threads)


def test_the_repacked_lookup_declines_bad_ids_and_types_with_the_choices():
    build = built("ggml_vnni")
    kind = int(Q.Q6_K)
    packed = build.repack(weight_for(kind, 20, seed=4)[0], kind)
    with pytest.raises(UnsupportedError, match=r"token ids must lie in \[0, 20\)"):
        build.embedding_repacked(torch.tensor([3, 20]), packed, kind)
    with pytest.raises(UnsupportedError, match="Q3_K is not repacked.*Q4_K, Q5_K, Q6_K, IQ4_XS"):
        build.embedding_repacked(torch.tensor([0]), packed, int(Q.Q3_K))
    with pytest.raises(UnsupportedError, match="1-D int64 or int32"):
        build.embedding_repacked(torch.tensor([[0]]), packed, kind)
