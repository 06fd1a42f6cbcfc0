"""hwplug-triton: one Triton kernel library for every GPU plugin (cuda, rocm, xpu).

Kernels for the registry's ops (:mod:`hwplug_triton.kernels`), their launch-config tables
per device (:mod:`hwplug_triton.tuning`), the :func:`register` helper each GPU plugin
calls from its ``hwplug_register_kernels`` hook with its own gates, and
:class:`~hwplug_triton.backend.VariantBackedAttention`, the base of attention backends
that serve only where the registry chooses their kernels. Importing this package imports
neither torch nor triton.
"""

from hwplug_triton.registration import FP8_OPS, MLA_OPS, NHD_OPS, register

__all__ = ["FP8_OPS", "MLA_OPS", "NHD_OPS", "register"]
