"""Pure-torch reference kernels: the numerical oracle every variant is checked against.

One function per op of :mod:`hwplug.kernel_registry.ops`, with exactly that op's
signature and contract. They run on any device torch supports, compute in fp32 inside
and return the input dtype; :func:`build_cos_sin_cache` builds the rotary cache the
``rotary_embedding`` op reads.
"""

from hwplug.kernel_registry.reference.activation import gelu_and_mul, silu_and_mul
from hwplug.kernel_registry.reference.attention import paged_attention
from hwplug.kernel_registry.reference.cache import reshape_and_cache
from hwplug.kernel_registry.reference.matmul import embedding, linear, scaled_mm
from hwplug.kernel_registry.reference.mla import concat_and_cache_mla, mla_attention
from hwplug.kernel_registry.reference.moe import fused_moe, moe_experts, moe_topk
from hwplug.kernel_registry.reference.norm import rms_norm
from hwplug.kernel_registry.reference.rotary import build_cos_sin_cache, rotary_embedding

__all__ = [
    "build_cos_sin_cache",
    "concat_and_cache_mla",
    "embedding",
    "fused_moe",
    "gelu_and_mul",
    "linear",
    "mla_attention",
    "moe_experts",
    "moe_topk",
    "paged_attention",
    "reshape_and_cache",
    "rms_norm",
    "rotary_embedding",
    "scaled_mm",
    "silu_and_mul",
]
