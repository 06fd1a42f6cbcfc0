"""hwplug hooks of hwplug-cpu-arm: the kernel variants it adds for Arm cores.

Entry point ``cpu-arm`` of group ``hwplug.plugins``. Every variant is declared for the
``cpu-arm`` platform and gated on the cores' features as the probe names them
(``dotprod``, ``bf16``; see :mod:`hwplug.platforms.arm`), so ``hwplug kernels`` says why
one is not chosen elsewhere. The KleidiAI int4 GEMMs need dotprod: every core with i8mm
has it too (dotprod is mandatory from Armv8.4, i8mm arrives in Armv8.6), and torch picks
KleidiAI's i8mm kernels itself where the cores have them.
"""

from __future__ import annotations

from typing import Any

from hwplug.hookspecs import hookimpl
from hwplug.quantization import ScaleDescriptor

hwplug_api_version = ">=1,<2"

_KLEIDIAI = "hwplug_cpu_arm.kleidiai:"
_INT4 = "KleidiAI int4 GEMM (torch._dyn_quant_matmul_4bit), activations int8 per row"
#: KleidiAI rounds each activation row to int8 (asymmetric over the row's range; a
#: symmetric per-token step bounds it) before its integer dot products.
_ROW_INT8 = ScaleDescriptor("int8", "token", dynamic=True)
#: The variants hwplug-cpu-arm registers (register_variant arguments).
ARM_VARIANTS: list[dict[str, Any]] = [
    dict(op="int4_linear", name="kleidiai", impl=_KLEIDIAI + "int4_linear",
         supports=_KLEIDIAI + "int4_linear_supported", dtypes=("float32",),
         features=("dotprod",), packages={"torch": ">=2.6"}, description=_INT4,
         activation_quantization=_ROW_INT8),
    # torch's bf16-activation KleidiAI kernels (per-row scales) arrived in 2.10
    dict(op="int4_linear", name="kleidiai_bf16", impl=_KLEIDIAI + "int4_linear",
         supports=_KLEIDIAI + "int4_linear_supported", dtypes=("bfloat16",),
         features=("dotprod", "bf16"), packages={"torch": ">=2.10"},
         description=_INT4 + ", bf16 in and out", activation_quantization=_ROW_INT8),
]


@hookimpl
def hwplug_register_kernels(registry: Any) -> None:
    for variant in ARM_VARIANTS:
        registry.register_variant(platforms=("cpu-arm",), priority=10, **variant)
