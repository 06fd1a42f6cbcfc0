"""``AcmeNpuPlatform``: what a acme-npu device is and supports, as class attributes.

hwplug reads these facts to choose attention backends, kernels, KV-cache dtypes and block
sizes, and shows them in ``hwplug info``. Override the device queries your runtime can
answer (capability, memory, toolkit version); a public method the ``Platform`` base does
not declare is an error at class creation, so helpers must start with an underscore.
"""

from __future__ import annotations

from typing import ClassVar

from hwplug import Platform


class AcmeNpuPlatform(Platform):
    """acme-npu devices. EDIT the facts marked below for your hardware."""

    name: ClassVar[str] = "acme-npu"
    #: EDIT: the torch device type your tensors live on (your PrivateUse1 backend name,
    #: e.g. "npu"). "cpu" lets the template run, and pass the kit, on any machine.
    device_type: ClassVar[str] = "cpu"
    vendor: ClassVar[str] = "acme-npu"
    is_accelerator: ClassVar[bool] = True
    #: EDIT: your collective library's torch.distributed backend name.
    dist_backend: ClassVar[str] = "gloo"
    supported_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float16", "float32")
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float16", "float32")
    attention_backend_priority: ClassVar[tuple[str, ...]] = ("ACME_NPU_ATTN", "TORCH_PAGED")
    default_block_size: ClassVar[int] = 16

    # EDIT: override the device queries your runtime answers (get_device_name,
    # get_device_capability, memory_info, ...); without them the names and count come from
    # the probe's sighting. Narrow the facts per device in derive_facts.
