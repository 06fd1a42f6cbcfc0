"""The kernel registry: ops with a pure-torch reference, plugin variants, cached dispatch.

A model's layers call the ops their :class:`KernelPlan` bound when it was built;
``hwplug.kernel_registry.ops.<op>(...)`` (also ``hwplug.ops``) calls the best variant
for the current platform and inputs outside a model; ``kernels.explain(...)`` says why;
plugins add
variants from their ``hwplug_register_kernels(registry)`` hook or with the
``@kernels.variant(op, ...)`` decorator. Importing this package does not import torch.
"""

from hwplug.kernel_registry import (  # they define ops on `kernels`
    ops,
    ops_ggml,  # noqa: F401  (GGUF-quantized linear and embedding)
    ops_int4,  # noqa: F401  (group-wise int4 linear)
    ops_mla,  # noqa: F401  (multi-head latent attention)
    ops_moe,  # noqa: F401  (mixture of experts)
    ops_sampling,  # noqa: F401  (speculative decoding's rejection sampler)
)
from hwplug.kernel_registry.plan import BoundOp, KernelPlan, KernelPolicy
from hwplug.kernel_registry.registry import REFERENCE, Explanation, KernelRegistry, kernels
from hwplug.kernel_registry.variant import Variant

__all__ = ["REFERENCE", "BoundOp", "Explanation", "KernelPlan", "KernelPolicy",
           "KernelRegistry", "Variant", "kernels", "ops"]
