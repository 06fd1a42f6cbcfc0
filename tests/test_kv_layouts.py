"""KV-cache layouts as objects: the contract, the registry and its hook, the reference ops
serving any layout through ``NHD``, dispatch by layout, and the kit's layout check."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import kv_layouts
import pytest
import torch
from kv_layouts import BLOCKS_LAST, BlocksLast

from hwplug import registries
from hwplug.attention import AttentionMetadata, PagedAttentionParams
from hwplug.conformance.layouts import check_layout
from hwplug.discovery import current_platform
from hwplug.errors import UnsupportedError
from hwplug.kernel_registry import KernelPlan, KernelPolicy, KernelRegistry, ops
from hwplug.kernel_registry.torch_paged import TorchPagedBackend
from hwplug.kv_cache_layout import NHD, KVCacheLayout, registered_layout
from hwplug.platforms.cpu.platform import CpuPlatform


@pytest.fixture
def registered(fresh_discovery):
    """``BLOCKS_LAST`` registered as a plugin would, dropped afterwards."""
    with kv_layouts.registered(BLOCKS_LAST):
        yield BLOCKS_LAST


def test_importing_the_layout_contract_does_not_import_torch():
    code = ("import sys, hwplug.kv_cache_layout, hwplug.attention; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_core_registers_only_the_reference_layout_and_the_hook_runs_first(fresh_discovery):
    assert registries.REGISTRATION_HOOKS[0] == "hwplug_register_kv_layouts"
    assert registries.kv_layouts.entry("NHD").source == "code"
    assert registered_layout("NHD") is NHD and PagedAttentionParams(1.0).layout is NHD
    current_platform()  # plugins add theirs
    assert {"NHD", "ROCM_PA", "RPA_INTERLEAVED"} <= set(registries.kv_layouts.names())
    for name in registries.kv_layouts.names():
        assert registered_layout(name).name == name


def test_backends_take_their_cache_shape_from_their_layout(registered):
    class BlocksLastBackend(TorchPagedBackend):
        kv_cache_layout = BLOCKS_LAST.name

        @classmethod
        def get_name(cls):
            return "TEST_BLOCKS_LAST_ATTN"

    assert TorchPagedBackend.kv_cache_shape(7, 16, 2, 64) == (2, 7, 16, 2, 64)
    assert BlocksLastBackend.kv_cache_shape(7, 16, 2, 64) == (2, 16, 2, 64, 7)

    class Unregistered(BlocksLastBackend):
        kv_cache_layout = "TEST_NOWHERE"

    from hwplug.attention import AttentionSpec

    reasons = Unregistered.validate(AttentionSpec(2, 2, 64), current_platform())
    assert reasons == [f"KV-cache layout TEST_NOWHERE is not registered (registered: "
                       f"{', '.join(registries.kv_layouts.names())})"]


def _batch(layout: KVCacheLayout) -> tuple:
    """A mixed batch over a random NHD cache, and the same cache in ``layout``."""
    generator = torch.Generator().manual_seed(0)
    nhd = torch.randn(2, 6, 4, 2, 16, generator=generator)
    cache = nhd.new_empty(layout.shape(6, 4, 2, 16))
    layout.from_reference(nhd, cache)
    metadata = AttentionMetadata(torch.tensor([9, -1, 22]), torch.tensor([[2, 0, 5], [4, 1, 3]],
                                                                         dtype=torch.int32),
                                 torch.tensor([11, 7], dtype=torch.int32),
                                 torch.tensor([0, 2, 3], dtype=torch.int32), 2, 11)
    query = torch.randn(3, 4, 16, generator=generator)
    return nhd, cache, metadata, query


def test_the_references_serve_a_layout_through_its_conversions():
    nhd, cache, metadata, query = _batch(BLOCKS_LAST)
    params = PagedAttentionParams(0.25, sliding_window=6)
    key, value = torch.randn(2, 3, 2, 16).unbind()
    ops.reshape_and_cache.reference(key, value, nhd, metadata.slot_mapping, params)
    ops.reshape_and_cache.reference(key, value, cache, metadata.slot_mapping,
                                    replace(params, layout=BLOCKS_LAST))
    assert torch.equal(BLOCKS_LAST.to_reference(cache), nhd)  # written back, in its layout
    want = ops.paged_attention.reference(query, nhd, metadata, params)
    got = ops.paged_attention.reference(query, cache, metadata,
                                        replace(params, layout=BLOCKS_LAST))
    assert torch.equal(got, want)
    with pytest.raises(UnsupportedError, match="not a TEST_BLOCKS_LAST cache: not 5-D"):
        ops.paged_attention.reference(query, cache[0], metadata,
                                      replace(params, layout=BLOCKS_LAST))


def _echo(x, params):
    return x


def test_a_variant_serves_only_the_layouts_it_declares(fresh_discovery):
    registry = KernelRegistry()
    op = registry.define_op("attend", _echo, doc="attend(x, params)", layout_arg=1,
                            tolerances={"float32": (0.0, 0.0)})
    registry.register_variant("attend", "blocks_last", lambda x, params: x + 1, priority=9,
                              layouts=(BLOCKS_LAST.name,))
    registry.register_variant("attend", "nhd_only", lambda x, params: x + 2, priority=5)
    x, params = torch.zeros(2), PagedAttentionParams(1.0)
    assert op(x, params).tolist() == [2.0, 2.0]  # NHD: the NHD-only variant, never the other
    assert op(x, replace(params, layout=BLOCKS_LAST)).tolist() == [1.0, 1.0]
    assert op(x, params=params).tolist() == [2.0, 2.0]
    assert op.variants_used() == {"nhd_only", "blocks_last"}
    platform = CpuPlatform()
    why = registry.explain("attend", platform, "cpu", "float32")
    assert (why.layout, why.chosen.name) == ("NHD", "nhd_only")
    assert why.rejected["blocks_last"] == "serves layouts TEST_BLOCKS_LAST, not NHD"
    why = registry.explain("attend", platform, "cpu", "float32", layout=BLOCKS_LAST.name)
    assert [v.name for v in why.chain] == ["blocks_last", "reference"]
    assert why.rejected["nhd_only"] == "serves layouts NHD, not TEST_BLOCKS_LAST"
    strict = KernelRegistry()
    strict.define_op("attend", _echo, doc="", layout_arg=1, tolerances={})
    plan = KernelPlan(strict, platform, KernelPolicy(disabled=frozenset({"attend/reference"})))
    with pytest.raises(UnsupportedError, match="cpu float32 in layout NHD: reference: disabled"):
        plan.bind("attend", "float32", "NHD")


def test_block_access_of_the_reference_layout():
    cache = torch.arange(2 * 4 * 2 * 1 * 3, dtype=torch.float32).view(2, 4, 2, 1, 3)
    blocks = NHD.select_blocks(cache, [3, 1])
    assert torch.equal(blocks, cache[:, [3, 1]]) and blocks.data_ptr() != cache.data_ptr()
    assert torch.equal(NHD.join_blocks([cache[:, :1], cache[:, 1:]]), cache)
    target = torch.zeros_like(cache)
    NHD.write_blocks(target, torch.tensor([0, 2]), blocks)
    assert torch.equal(target[:, [0, 2]], blocks) and not target[:, [1, 3]].any()


def test_every_registered_layout_meets_its_contract(registered):
    for name in registries.kv_layouts.names():
        result = check_layout(registered_layout(name))
        assert result.status == "passed", (name, result.detail)


def test_the_layout_check_fails_a_conversion_that_is_not_exact():
    class Lossy(BlocksLast):
        name = "TEST_LOSSY"

        def from_reference(self, reference, out):  # drops the last block
            super().from_reference(reference, out)
            out[..., -1] = 0

    result = check_layout(Lossy())
    assert result.status == "failed"
    assert result.detail == "float32: to_reference(from_reference(x)) is not x"
