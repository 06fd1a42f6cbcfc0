"""Fake /proc, /sys and /dev trees that simulate hardware for hwplug's probes.

Every builder writes under ``root`` (a test's ``tmp_path``) what a Linux kernel shows for
that hardware, including sysfs's relative symlinks (``/sys/bus/pci/devices/<address>``,
``/sys/class/drm/card<N>``, ``<device>/driver``), so the probes read a fake tree exactly
as they read ``/``. Builders compose: PCI bus numbers and DRM card numbers are taken from
the first free ones, so one tree can hold several vendors' hardware. Device nodes under
``/dev`` are empty regular files (the probes only check that they exist).

The accelerator builders return the PCI bus addresses they created (``"0000:01:00.0"``),
in the order the probes list the devices.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PCI_ROOT = "sys/devices/pci0000:00"
RENDER_MINOR_BASE = 128
NEOVERSE_V2_FEATURES = (
    "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt "
    "fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs "
    "sb paca pacg dcpodp sve2 sveaes svepmull svebitperm svesha3 svesm4 flagm2 frint "
    "svei8mm svebf16 i8mm bf16 dgh rng bti")


def write(root: Path, relpath: str, text: str | bytes = "") -> Path:
    """Create ``root/relpath`` (and its parents) holding ``text``; return its path."""
    path = root / relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def link(path: Path, target: Path) -> None:
    """Make ``path`` a relative symlink to ``target`` (both inside the fake tree)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(os.path.relpath(target, path.parent))


@dataclass(frozen=True)
class FakePci:
    """A PCI function written by :func:`add_pci_function`."""

    address: str
    sysfs: Path
    card: int | None


def add_pci_function(root: Path, vendor: int, device: int, class_code: int, *,
                     driver: str | None = None, drm: bool = False) -> FakePci:
    """Add a PCI function at the next free bus; bind it to ``driver`` if given.

    ``drm=True`` also creates ``/sys/class/drm/card<N>`` and ``renderD<128+N>`` for it.
    """
    bus = 1 + len(list((root / PCI_ROOT).glob("0000:*")))
    address = f"0000:{bus:02x}:00.0"
    sysfs = root / PCI_ROOT / address
    for name, value in (("vendor", vendor), ("device", device), ("class", class_code)):
        write(sysfs, name, f"0x{value:0{6 if name == 'class' else 4}x}\n")
    link(root / "sys/bus/pci/devices" / address, sysfs)
    if driver:
        drivers = root / "sys/bus/pci/drivers" / driver
        drivers.mkdir(parents=True, exist_ok=True)
        link(sysfs / "driver", drivers)
        link(drivers / address, sysfs)
    card = len(list((root / "sys/class/drm").glob("card*"))) if drm else None
    if card is not None:
        for name in (f"card{card}", f"renderD{RENDER_MINOR_BASE + card}"):
            link(sysfs / "drm" / name / "device", sysfs)
            link(root / "sys/class/drm" / name, sysfs / "drm" / name)
    return FakePci(address, sysfs, card)


def make_nvidia_tree(root: Path, models: Sequence[str] = ("NVIDIA H100 80GB HBM3",), *,
                     device_id: int = 0x2330, driver_version: str | None = "550.54.15",
                     ) -> list[str]:
    """NVIDIA GPUs named ``models``; ``driver_version=None`` leaves the driver unloaded
    (PCI functions only: no /proc/driver/nvidia, no /dev/nvidia<N>)."""
    addresses = []
    for minor, model in enumerate(models):
        pci = add_pci_function(root, 0x10DE, device_id, 0x030200,
                               driver="nvidia" if driver_version else None)
        addresses.append(pci.address)
        if driver_version:
            write(root, f"proc/driver/nvidia/gpus/{pci.address}/information",
                  f"Model: \t\t {model}\nIRQ:   \t\t 150\nGPU UUID: \t GPU-{minor:08x}\n"
                  f"Bus Type: \t PCIe\nBus Location: \t {pci.address}\n"
                  f"Device Minor: \t {minor}\nGPU Excluded:\t No\n")
            write(root, f"dev/nvidia{minor}")
    if driver_version:
        write(root, "proc/driver/nvidia/version",
              f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver_version}  "
              "Tue Mar  5 22:23:56 UTC 2024\nGCC version:  gcc version 12.3.0\n")
        write(root, "dev/nvidiactl")
    return addresses


def make_amd_tree(root: Path, products: Sequence[str | None] = ("AMD Instinct MI300X",), *,
                  device_id: int = 0x74A1, gfx_target_version: int = 90402,
                  kfd: bool = True) -> list[str]:
    """AMD GPUs on the amdgpu driver; a None product has no ``product_name`` file.

    ``kfd=True`` adds ``/dev/kfd`` and a KFD topology: node 0 a CPU (no SIMDs), then one
    node per GPU pointing at its render node.
    """
    addresses = []
    nodes = root / "sys/class/kfd/kfd/topology/nodes"
    if kfd:
        write(root, "dev/kfd")
        write(nodes, "0/properties", "cpu_cores_count 96\nsimd_count 0\ngfx_target_version 0\n")
    for product in products:
        pci = add_pci_function(root, 0x1002, device_id, 0x038000, driver="amdgpu", drm=True)
        addresses.append(pci.address)
        if product is not None:
            write(pci.sysfs, "product_name", f"{product}\n")
        if kfd:
            write(nodes, f"{len(addresses)}/properties",
                  f"cpu_cores_count 0\nsimd_count 304\ngfx_target_version {gfx_target_version}\n"
                  f"vendor_id 4098\ndevice_id {device_id}\n"
                  f"drm_render_minor {RENDER_MINOR_BASE + pci.card}\n")
    return addresses


def make_intel_tree(root: Path, device_ids: Sequence[int] = (0x0BD5,), *,
                    driver: str | None = "i915") -> list[str]:
    """Intel GPUs (default: one Data Center GPU Max 1550) bound to ``driver``."""
    return [add_pci_function(root, 0x8086, device_id, 0x038000, driver=driver, drm=True).address
            for device_id in device_ids]


def make_tpu_tree(root: Path, chips: int = 4, *, device_id: int = 0x0063,
                  nodes: str = "vfio") -> list[str]:
    """A TPU VM: ``chips`` Google TPU functions, their device nodes (``"vfio"``:
    /dev/vfio/<N>, ``"accel"``: /dev/accel<N>, ``""``: none), and, like every Cloud VM,
    a Google gVNIC network function that is not a TPU."""
    add_pci_function(root, 0x1AE0, 0x0042, 0x020000, driver="gve")
    addresses = []
    for index in range(chips):
        addresses.append(add_pci_function(root, 0x1AE0, device_id, 0x120000,
                                          driver="vfio-pci" if nodes == "vfio" else None).address)
        if nodes:
            write(root, f"dev/vfio/{index}" if nodes == "vfio" else f"dev/accel{index}")
    return addresses


@dataclass(frozen=True)
class ArmCore:
    """One logical CPU of /proc/cpuinfo (default: an Arm Neoverse V2, as in NVIDIA Grace)."""

    part: int = 0xD4F
    implementer: int = 0x41
    features: str = NEOVERSE_V2_FEATURES


def arm_cpuinfo(root: Path, cores: Sequence[ArmCore] = (ArmCore(),) * 4) -> Path:
    """Write an aarch64 host: /proc/cpuinfo with one block per core (its path is returned)
    and /proc/sys/kernel/arch."""
    write(root, "proc/sys/kernel/arch", "aarch64\n")
    blocks = [f"processor\t: {index}\nBogoMIPS\t: 2000.00\nFeatures\t: {core.features}\n"
              f"CPU implementer\t: {core.implementer:#04x}\nCPU architecture: 8\n"
              f"CPU variant\t: 0x0\nCPU part\t: {core.part:#05x}\nCPU revision\t: 0\n"
              for index, core in enumerate(cores)]
    return write(root, "proc/cpuinfo", "\n".join(blocks))


def x86_cpuinfo(root: Path, flags: str, cpus: int = 2, model: str = "AMD EPYC 9654") -> Path:
    """Write an x86_64 host: /proc/cpuinfo with ``cpus`` blocks of ``flags`` (its path is
    returned) and /proc/sys/kernel/arch."""
    write(root, "proc/sys/kernel/arch", "x86_64\n")
    blocks = [f"processor\t: {index}\nvendor_id\t: AuthenticAMD\nmodel name\t: {model}\n"
              f"flags\t\t: {flags}\n" for index in range(cpus)]
    return write(root, "proc/cpuinfo", "\n".join(blocks))


def make_tpu_nodes(root: Path, chips: int = 4, nodes: str = "vfio") -> list[Path]:
    """TPU device nodes without their PCI functions (as a container sees a TPU VM):
    /dev/vfio/<N> (v5e and later) or /dev/accel<N> (v2-v4), one per chip."""
    return [write(root, f"dev/vfio/{index}" if nodes == "vfio" else f"dev/accel{index}")
            for index in range(chips)]


def add_amd_vram(root: Path, addresses: Sequence[str], total: int, used: int = 0) -> None:
    """Give the AMD GPUs at ``addresses`` (from :func:`make_amd_tree`) amdgpu's VRAM files,
    ``mem_info_vram_total`` and ``mem_info_vram_used``, in bytes."""
    for address in addresses:
        write(root / PCI_ROOT / address, "mem_info_vram_total", f"{total}\n")
        write(root / PCI_ROOT / address, "mem_info_vram_used", f"{used}\n")


def make_numa_tree(root: Path, cpulists: Sequence[str], memory_kb: int = 64 << 20) -> None:
    """``/sys/devices/system/node/node<N>`` with each node's ``cpulist`` and ``meminfo``."""
    for index, cpulist in enumerate(cpulists):
        node = f"sys/devices/system/node/node{index}"
        write(root, f"{node}/cpulist", f"{cpulist}\n")
        write(root, f"{node}/meminfo", f"Node {index} MemTotal:       {memory_kb} kB\n"
                                       f"Node {index} MemFree:        {memory_kb // 2} kB\n")
