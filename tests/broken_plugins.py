"""Plugins broken in realistic ways, installed as fake distributions for the kit's tests.

Named ``wonky`` so they never collide with a real plugin (the guide's example is ``acme``).
Everything in ``wonky`` is broken in one way each, except ``good_silu``,
``MemoryConnector``, the ``int8_rows`` quant method and the ``WONKY_HND`` KV layout. ``KERNELS_ONLY_PLUGIN`` and
``VENDOR_ONLY_PLUGIN`` register kernels for a platform that is not installed (one computing
on CPU and wrong, one needing its absent vendor library); ``TYPO_PLUGIN`` misspells a hook
name.
"""

from __future__ import annotations

from fake_dists import FakeSite

WONKY_PLATFORM = """
from hwplug.platform_interface import Platform

class WonkyPlatform(Platform):
    name = "wonky"
    device_type = "cpu"
    vendor = "wonky"
    is_accelerator = True
    dist_backend = "wonkylink"
    supported_dtypes = ("float32", "bfloat16")
    supported_kv_cache_dtypes = ("float32", "int8")  # no backend stores int8 K/V
    attention_backend_priority = ("WRONG_LAYOUT", "TORCH_PAGED")

def activate():
    import torch  # a probe must not import torch
    return __name__ + ":WonkyPlatform"
"""

# Each thing here is broken in one realistic way, except good_silu and MemoryConnector.
WONKY_PLUGIN = """
import torch
from dataclasses import replace

from hwplug import hookimpl
from hwplug.connector import Connector
from hwplug.kv_cache_layout import NHD, KVCacheLayout
from hwplug.quantization import QuantMethod
from hwplug.kernel_registry import ops
from hwplug.kernel_registry.reference import paged_attention
from hwplug.kernel_registry.torch_paged import TorchPagedBackend

hwplug_api_version = ">=1,<2"


class HeadsFirst(KVCacheLayout):
    '''[2, blocks, heads, block_size, head_size]: each head's tokens side by side.'''

    name = "WONKY_HND"
    reference_is_view = True

    def shape(self, num_blocks, block_size, num_kv_heads, head_size, dtype=None):
        return (2, num_blocks, num_kv_heads, block_size, head_size)

    def check(self, cache):
        return None if cache.dim() == 5 and cache.shape[0] == 2 else "not [2, n, H, bs, D]"

    def to_reference(self, cache):
        return cache.transpose(2, 3)

    def from_reference(self, reference, out):
        if reference.data_ptr() != out.data_ptr():
            out.copy_(reference.transpose(2, 3))


class BlocksFirst(HeadsFirst):
    '''[blocks, 2, block_size, heads, head_size]: blocks on dimension 0.'''

    name = "WONKY_BLOCKS_FIRST"
    block_dim = 0

    def shape(self, num_blocks, block_size, num_kv_heads, head_size, dtype=None):
        return (num_blocks, 2, block_size, num_kv_heads, head_size)

    def check(self, cache):
        return None if cache.dim() == 5 and cache.shape[1] == 2 else "not [n, 2, bs, H, D]"

    def to_reference(self, cache):
        return cache.transpose(0, 1)

    def from_reference(self, reference, out):
        if reference.data_ptr() != out.data_ptr():
            out.copy_(reference.transpose(0, 1))


class SwapsHalves(HeadsFirst):
    '''Converts from NHD with keys and values swapped: not the inverse of to_reference.'''

    name = "WONKY_SWAPPED"
    reference_is_view = False

    def to_reference(self, cache):
        return cache.transpose(2, 3).clone()

    def from_reference(self, reference, out):
        out.copy_(reference.flip(0).transpose(2, 3))


def attention_reads_nhd(query, kv_cache, metadata, params):
    '''Declares WONKY_HND, but reads the cache's bytes as NHD.'''
    two, blocks, heads, block_size, size = kv_cache.shape
    as_nhd = kv_cache.view(two, blocks, block_size, heads, size)
    return paged_attention(query, as_nhd, metadata, replace(params, layout=NHD))


def rms_norm_forgets_weight(x, weight, eps, residual=None):
    if residual is not None:
        summed = x + residual
        return rms_norm_forgets_weight(summed, weight, eps), summed
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps)).to(x.dtype)


def good_silu(x):
    gate, up = x.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(x.dtype)


class WrongLayout(TorchPagedBackend):
    '''Stores K/V as WONKY_HND, as it declares, but attends reading the bytes as NHD.'''

    kv_cache_layout = "WONKY_HND"

    @classmethod
    def get_name(cls):
        return "WRONG_LAYOUT"

    def forward(self, query, key, value, kv_cache, metadata, scale):
        self.write_kv_cache(key, value, kv_cache, metadata)
        return attention_reads_nhd(query, kv_cache, metadata, self._layer_params(scale))


class CarelessWrite(WrongLayout):
    '''Declares WONKY_HND, but its separate cache write treats the cache as NHD.'''

    updates_kv_cache_in_forward = False

    @classmethod
    def get_name(cls):
        return "CARELESS_WRITE"

    def write_kv_cache(self, key, value, kv_cache, metadata):
        ops.reshape_and_cache(key, value, kv_cache, metadata.slot_mapping,
                              replace(self._layer_params(None), layout=NHD))


class Lax(TorchPagedBackend):
    '''Claims no sliding window, but its validate accepts anything.'''

    supports_sliding_window = False

    @classmethod
    def get_name(cls):
        return "LAX"

    @classmethod
    def validate(cls, spec, platform=None):
        return []


def _scaled_rows(layer):
    return layer.weight.float() * layer.weight_scale.float()[:, None]


class Int8Rows(QuantMethod):
    '''int8 weights with one float scale per output row; dequantises before its matmul.'''

    supported_dtypes = ("float32",)

    @classmethod
    def get_name(cls):
        return "int8_rows"

    def create_weights(self, layer, input_size, output_size, params_dtype, bias):
        layer.weight = torch.nn.Parameter(torch.empty(output_size, input_size,
                                                      dtype=torch.int8), requires_grad=False)
        layer.weight_scale = torch.nn.Parameter(torch.empty(output_size), requires_grad=False)
        layer.register_parameter("bias", torch.nn.Parameter(
            torch.empty(output_size, dtype=params_dtype), requires_grad=False) if bias else None)

    def apply(self, layer, x):
        return ops.linear(x, _scaled_rows(layer).to(x.dtype), layer.bias)

    def dequantize(self, layer):
        return _scaled_rows(layer)


class ForgetsScale(Int8Rows):
    '''Multiplies by the raw int8 weight: the per-row scale is never applied.'''

    @classmethod
    def get_name(cls):
        return "forgets_scale"

    def apply(self, layer, x):
        return ops.linear(x, layer.weight.to(x.dtype), layer.bias)


class NoOracle(Int8Rows):
    '''Correct, but gives the kit no dequantised weight to check against.'''

    @classmethod
    def get_name(cls):
        return "no_oracle"

    def dequantize(self, layer):
        return super(Int8Rows, self).dequantize(layer)


class MemoryConnector(Connector):
    '''Blocks in a dict by chained hash: {hash: {layer name: block}}.'''

    def __init__(self, layout, policy=None):
        super().__init__(layout, policy)
        self._store = {}

    @classmethod
    def get_name(cls):
        return "memory"

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        first = num_computed_tokens // self.layout.block_size
        found = 0
        for block_hash in request.block_hashes[first:]:
            if block_hash not in self._store:
                break
            found += 1
        return found * self.layout.block_size

    def save_kv_layer(self, layer_name, kv_layer, metadata):
        for blocks in metadata.saves.values():
            for block in blocks:
                self._store.setdefault(block.block_hash, {})[layer_name] = (
                    self.cache_layout.select_blocks(kv_layer, [block.block_id]))

    def wait_for_save(self):
        pass

    def start_load_kv(self, metadata, kv_caches):
        for blocks in metadata.loads.values():
            for block in blocks:
                for name, cache in kv_caches.items():
                    self.cache_layout.write_blocks(cache, [self._slot(block.block_id)],
                                                   self._store[block.block_hash][name])

    def wait_for_layer_load(self, layer_name):
        pass

    def _slot(self, block_id):
        return block_id


class DimOneConnector(MemoryConnector):
    '''Takes block b of a cache as cache[:, b] instead of asking the engine's layout.'''

    @classmethod
    def get_name(cls):
        return "dim_one"

    def save_kv_layer(self, layer_name, kv_layer, metadata):
        for blocks in metadata.saves.values():
            for block in blocks:
                self._store.setdefault(block.block_hash, {})[layer_name] = (
                    kv_layer[:, block.block_id].clone())

    def start_load_kv(self, metadata, kv_caches):
        for blocks in metadata.loads.values():
            for block in blocks:
                for name, cache in kv_caches.items():
                    cache[:, block.block_id] = self._store[block.block_hash][name]


class OffByOneConnector(MemoryConnector):
    '''Loads each block one id past where the metadata puts it.'''

    @classmethod
    def get_name(cls):
        return "off_by_one"

    def _slot(self, block_id):
        return (block_id + 1) % 6


@hookimpl
def hwplug_register_kv_layouts(registry):
    registry.register("WONKY_HND", HeadsFirst())
    registry.register("WONKY_SWAPPED", SwapsHalves())
    registry.register("WONKY_BLOCKS_FIRST", BlocksFirst())


@hookimpl
def hwplug_register_kernels(registry):
    registry.register_variant("rms_norm", "forgets_weight", rms_norm_forgets_weight,
                              platforms=("wonky",))
    registry.register_variant("silu_and_mul", "good_silu", good_silu, platforms=("wonky",))
    registry.register_variant("paged_attention", "reads_nhd", attention_reads_nhd,
                              platforms=("wonky",), layouts=("WONKY_HND",))


@hookimpl
def hwplug_register_attention_backends(registry):
    registry.register("WRONG_LAYOUT", WrongLayout)
    registry.register("CARELESS_WRITE", CarelessWrite)
    registry.register("LAX", Lax)


@hookimpl
def hwplug_register_quant_methods(registry):
    registry.register("int8_rows", Int8Rows)
    registry.register("forgets_scale", ForgetsScale)
    registry.register("no_oracle", NoOracle)


@hookimpl
def hwplug_register_connectors(registry):
    registry.register("memory", MemoryConnector)
    registry.register("off_by_one", OffByOneConnector)
    registry.register("dim_one", DimOneConnector)


def hwplug_platform_resolved(platform):  # the @hookimpl is missing
    pass
"""

TYPO_PLUGIN = """
from hwplug import hookimpl

hwplug_api_version = ">=1,<2"

@hookimpl
def hwplug_register_kernal(registry):
    pass
"""


#: A kernels-only plugin for the platform wonky-npu, which is not installed: its kernel
#: computes with torch on CPU tensors (and is wrong: twice the reference).
KERNELS_ONLY_PLUGIN = """
from hwplug import hookimpl
from hwplug.kernel_registry.reference import rms_norm

hwplug_api_version = ">=1,<2"


def rms_norm_doubled(x, weight, eps, residual=None):
    out = rms_norm(x, weight, eps, residual)
    return (out[0] * 2, out[1]) if residual is not None else out * 2


@hookimpl
def hwplug_register_kernels(registry):
    registry.register_variant("rms_norm", "doubled", rms_norm_doubled, platforms=("wonky-npu",))
"""

#: A kernels-only plugin whose kernel calls its vendor library, absent on this machine.
VENDOR_ONLY_PLUGIN = """
from hwplug import hookimpl

hwplug_api_version = ">=1,<2"


def needs_the_vendor_library(x):
    import wonky_vendor_kernels  # not installed here
    return wonky_vendor_kernels.silu_and_mul(x)


@hookimpl
def hwplug_register_kernels(registry):
    registry.register_variant("silu_and_mul", "vendor", needs_the_vendor_library,
                              platforms=("wonky-npu",))
"""


def install_wonky(site: FakeSite) -> None:
    platform, plugin = site.module("wonky_platform"), site.module("wonky_plugin")
    site.add("wonky-hw", {"hwplug.platforms": {"wonky": f"{platform}:activate"},
                          "hwplug.plugins": {"wonky": plugin}},
             {platform: WONKY_PLATFORM, plugin: WONKY_PLUGIN})


def install_wonky_kernels(site: FakeSite) -> None:
    """Kernels-only distributions for the absent platform wonky-npu: ``wonky-kernels``
    (:data:`KERNELS_ONLY_PLUGIN`) and ``wonky-vendor`` (:data:`VENDOR_ONLY_PLUGIN`)."""
    for name, source in (("wonky-kernels", KERNELS_ONLY_PLUGIN),
                         ("wonky-vendor", VENDOR_ONLY_PLUGIN)):
        module = site.module(name.replace("-", "_"))
        site.add(name, {"hwplug.plugins": {name: module}}, {module: source})
