"""A plugin broken in realistic ways, installed as a fake distribution for the kit's tests.

Everything in ``acme`` is broken in one way each, except ``good_silu`` and
``MemoryConnector``; ``TYPO_PLUGIN`` misspells a hook name.
"""

from __future__ import annotations

from fake_dists import FakeSite

ACME_PLATFORM = """
from hwplug.platform_interface import Platform

class AcmePlatform(Platform):
    name = "acme"
    device_type = "cpu"
    vendor = "acme"
    is_accelerator = True
    dist_backend = "acmelink"
    supported_dtypes = ("float32", "bfloat16")
    supported_kv_cache_dtypes = ("float32", "fp8_e4m3")
    attention_backend_priority = ("WRONG_LAYOUT", "TORCH_PAGED")

def activate():
    import torch  # a probe must not import torch
    return __name__ + ":AcmePlatform"
"""

# Each thing here is broken in one realistic way, except good_silu and MemoryConnector.
ACME_PLUGIN = """
import torch
from hwplug import hookimpl
from hwplug.connector import Connector
from hwplug.kernel_registry import ops
from hwplug.kernel_registry.torch_paged import TorchPagedBackend

hwplug_api_version = ">=1,<2"


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
    '''Stores K/V as HND, as kv_cache_shape says, but attends reading the bytes as NHD.'''

    kv_cache_layout = "HND"

    @classmethod
    def get_name(cls):
        return "WRONG_LAYOUT"

    @classmethod
    def kv_cache_shape(cls, num_blocks, block_size, num_kv_heads, head_size):
        return (2, num_blocks, num_kv_heads, block_size, head_size)

    def write_kv_cache(self, key, value, kv_cache, metadata):
        ops.reshape_and_cache(key, value, kv_cache.transpose(2, 3), metadata.slot_mapping)

    def forward(self, query, key, value, kv_cache, metadata, scale):
        self.write_kv_cache(key, value, kv_cache, metadata)
        two, blocks, heads, block_size, size = kv_cache.shape
        as_nhd = kv_cache.view(two, blocks, block_size, heads, size)
        spec = self.spec
        return ops.paged_attention(query, as_nhd, metadata.block_tables, metadata.seq_lens,
                                   metadata.query_start_loc, scale, spec.causal,
                                   spec.sliding_window, spec.soft_cap)


class Lax(TorchPagedBackend):
    '''Claims no sliding window, but its validate accepts anything.'''

    supports_sliding_window = False

    @classmethod
    def get_name(cls):
        return "LAX"

    @classmethod
    def validate(cls, spec, platform=None):
        return []


class MemoryConnector(Connector):
    def __init__(self, layout, policy=None):
        super().__init__(layout, policy)
        self._store = {}

    @classmethod
    def get_name(cls):
        return "memory"

    def save_kv_layer(self, layer_name, kv_layer, metadata):
        for request, blocks in metadata.saves.items():
            self._store[request, layer_name] = kv_layer[:, blocks].clone()

    def wait_for_save(self):
        pass

    def start_load_kv(self, metadata, kv_caches):
        for request, blocks in metadata.loads.items():
            for name, cache in kv_caches.items():
                cache[:, self._slots(blocks)] = self._store[request, name]

    def wait_for_layer_load(self, layer_name):
        pass

    def _slots(self, blocks):
        return blocks


class OffByOneConnector(MemoryConnector):
    @classmethod
    def get_name(cls):
        return "off_by_one"

    def _slots(self, blocks):
        return [b + 1 for b in blocks]


@hookimpl
def hwplug_register_kernels(registry):
    registry.register_variant("rms_norm", "forgets_weight", rms_norm_forgets_weight,
                              platforms=("acme",))
    registry.register_variant("silu_and_mul", "good_silu", good_silu, platforms=("acme",))


@hookimpl
def hwplug_register_attention_backends(registry):
    registry.register("WRONG_LAYOUT", WrongLayout)
    registry.register("LAX", Lax)


@hookimpl
def hwplug_register_connectors(registry):
    registry.register("memory", MemoryConnector)
    registry.register("off_by_one", OffByOneConnector)


def hwplug_register_quant_methods(registry):  # the @hookimpl is missing
    pass
"""

TYPO_PLUGIN = """
from hwplug import hookimpl

hwplug_api_version = ">=1,<2"

@hookimpl
def hwplug_register_kernal(registry):
    pass
"""


def install_acme(site: FakeSite) -> None:
    platform, plugin = site.module("acme_platform"), site.module("acme_plugin")
    site.add("acme-hw", {"hwplug.platforms": {"acme": f"{platform}:activate"},
                         "hwplug.plugins": {"acme": plugin}},
             {platform: ACME_PLATFORM, plugin: ACME_PLUGIN})
