"""Intel GPU models hwplug-xpu knows by PCI device id (the probe names GPUs by PCI id).

Every model listed has XMX matrix engines (Data Center GPU Max and Flex, Arc A- and
B-series): the ``xmx`` device feature, which IPEX's attention kernels need. Integrated
and unlisted GPUs get no such feature.
"""

from __future__ import annotations

from collections.abc import Mapping

#: PCI device id -> the model name torch.xpu reports for it.
MODELS: Mapping[int, str] = {
    0x0BD5: "Intel(R) Data Center GPU Max 1550", 0x0BD6: "Intel(R) Data Center GPU Max 1550",
    0x0BDA: "Intel(R) Data Center GPU Max 1100", 0x56C0: "Intel(R) Data Center GPU Flex 170",
    0x56C1: "Intel(R) Data Center GPU Flex 140", 0x56A0: "Intel(R) Arc(TM) A770 Graphics",
    0x56A1: "Intel(R) Arc(TM) A750 Graphics", 0x56A5: "Intel(R) Arc(TM) A380 Graphics",
    0xE20B: "Intel(R) Arc(TM) B580 Graphics", 0xE20C: "Intel(R) Arc(TM) B570 Graphics",
}


def model_name(device: str) -> str:
    """The model name of a device the probe named ``"8086:0bd5"``; other names unchanged."""
    vendor, _, device_id = device.partition(":")
    if vendor != "8086":
        return device
    try:
        return MODELS.get(int(device_id, 16), device)
    except ValueError:
        return device


def has_xmx(name: str) -> bool:
    """Whether the model ``name`` (torch's or :func:`model_name`'s) has XMX engines."""
    return name in MODELS.values()
