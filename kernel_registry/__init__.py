"""The kernel registry: ops with a pure-torch reference, plugin variants, cached dispatch.

``hwplug.kernel_registry.ops.<op>(...)`` (also ``hwplug.ops``) calls the best variant
for the current platform and inputs; ``kernels.explain(...)`` says why; plugins add
variants from their ``hwplug_register_kernels(registry)`` hook or with the
``@kernels.variant(op, ...)`` decorator. Importing this package does not import torch.
"""

from hwplug import registries
from hwplug.kernel_registry.registry import REFERENCE, Explanation, KernelRegistry
from hwplug.kernel_registry.variant import Variant

#: The process-wide kernel registry (passed to ``hwplug_register_kernels``).
kernels = KernelRegistry()
registries.attach("hwplug_register_kernels", kernels)

from hwplug.kernel_registry import (  # noqa: E402  (they define ops on `kernels`)
    ops,
    ops_ggml,  # noqa: F401  (GGUF-quantized linear and embedding)
    ops_int4,  # noqa: F401  (group-wise int4 linear)
)

__all__ = ["REFERENCE", "Explanation", "KernelRegistry", "Variant", "kernels", "ops"]
