"""Checks every hardware plugin's own tests share (importable as ``plugin_checks``).

Hardware is simulated at the probe boundary only: a plugin's ``activate`` entry point is
called with the root of a fake ``/proc`` + ``/sys`` tree (``fake_hw``) and the vendor
probe's options, and platforms are made by discovery itself, pointed at that tree.
"""

from __future__ import annotations

from dataclasses import fields
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
import torch

from hwplug import discovery
from hwplug.attention import AttentionMetadata, AttentionSpec, PagedAttentionParams
from hwplug.attention_selection import select_backend
from hwplug.platform_interface import Platform
from hwplug.registry import import_object


def check_activate(name: str, root: Path, expected: str | None, platform_cls: type[Platform],
                   **probe_options: Any) -> None:
    """The ``hwplug.platforms`` entry point ``name``, asked about the tree at ``root``,
    answers ``expected`` (the ``"module:Class"`` of ``platform_cls`` with the probe's
    sighting of that tree, or None)."""
    (ep,) = [ep for ep in entry_points(group="hwplug.platforms") if ep.name == name]
    answer = ep.load()(root, **probe_options)
    assert (answer.platform if answer is not None else None) == expected
    if answer is not None:
        assert import_object(answer.platform) is platform_cls and platform_cls.name == ep.name
        assert answer.sighting.device_kind == name
        assert answer.sighting.evidence.startswith(str(root)), answer.sighting.evidence


def discovered(monkeypatch: pytest.MonkeyPatch, root: Path, name: str) -> Platform:
    """The platform discovery makes when ``HWPLUG_PLATFORM=name`` and the probes read the
    fake tree at ``root``, as production makes it: with its probe's sighting. Use it with
    the ``fresh_discovery`` fixture, which resets discovery after the test."""
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(root))
    monkeypatch.setenv("HWPLUG_PLATFORM", name)
    discovery.reset()
    platform = discovery.current_platform()
    assert platform.name == name and platform.sighting is not None
    assert platform.sighting.evidence.startswith(str(root)), platform.sighting.evidence
    return platform



def attention_call(**flat: Any) -> dict[str, Any]:
    """A ``paged_attention`` call as keyword arguments (``query``, ``kv_cache``,
    ``metadata``, ``params``), from ``flat``: ``query``, ``kv_cache`` and the fields of
    :class:`AttentionMetadata` and :class:`PagedAttentionParams` by name (no
    ``slot_mapping`` needed). Tensors go to the meta device: a ``supports`` check reads
    shapes, never values."""
    moved = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in flat.items()}
    moved.setdefault("slot_mapping", torch.zeros(0, dtype=torch.int64, device="meta"))
    return {"query": moved.pop("query"), "kv_cache": moved.pop("kv_cache"),
            **{name: cls(**{f.name: moved[f.name] for f in fields(cls) if f.name in moved})
               for name, cls in (("metadata", AttentionMetadata),
                                 ("params", PagedAttentionParams))}}


def check_triton_mla_backend(platform: Platform, backend: str, variant: str,
                             monkeypatch: pytest.MonkeyPatch, dtype: str = "bfloat16",
                             kv_cache_dtype: str | None = None) -> None:
    """``backend`` (a :class:`~hwplug_triton.backend.VariantBackedMLA`) comes before
    ``TORCH_MLA`` in ``platform``'s list and serves a DeepSeek-shaped MLA spec (16 heads, one
    latent head of 512 + 64); with ``mla_attention/<variant>`` disabled ``TORCH_MLA`` serves
    and the rejection names the kernel; a dense spec never reaches it."""
    order = platform.attention_backends()
    assert order.index(backend) < order.index("TORCH_MLA"), order
    spec = AttentionSpec(16, 1, 576, dtype, kv_cache_dtype=kv_cache_dtype, is_mla=True)
    assert select_backend(platform, spec).backend.get_name() == backend
    dense = select_backend(platform, AttentionSpec(16, 4, 128, dtype))
    assert dense.rejected[backend] == ["an MLA backend serves only latent (MLA) attention"]
    monkeypatch.setenv("HWPLUG_DISABLED_KERNELS", f"mla_attention/{variant}")
    selection = select_backend(platform, spec)
    assert selection.backend.get_name() == "TORCH_MLA"
    assert selection.rejected[backend] == [
        f"mla_attention would not use its {variant} variant: disabled by "
        "HWPLUG_DISABLED_KERNELS"]
