"""Process-global torch state that plugin code must not change behind hwplug's back.

A plugin's import or hook runs inside :func:`kept`: torch's default dtype, default
device, grad mode and thread counts are read before and after; whatever the plugin
changed is put back, with a warning naming the plugin and each change. A plugin that
needs another setting for its own kernels sets it around its own calls.

torch is not imported here: when it is not imported before the plugin runs (``import
hwplug`` imports no torch), the state after is compared with torch's defaults (float32,
cpu, grad enabled); its thread counts, whose defaults depend on the machine, are then
not checked.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger(__name__)

#: torch's own values of the settings that have a machine-independent default.
TORCH_DEFAULTS = {"default dtype": "torch.float32", "default device": "cpu",
                  "grad mode": "enabled"}


def _state(torch: Any) -> dict[str, str]:
    return {"default dtype": str(torch.get_default_dtype()),
            "default device": str(torch.get_default_device()),
            "grad mode": "enabled" if torch.is_grad_enabled() else "disabled",
            "threads": str(torch.get_num_threads()),
            "interop threads": str(torch.get_num_interop_threads())}


def _restore(torch: Any, setting: str, value: str) -> None:
    if setting == "default dtype":
        torch.set_default_dtype(getattr(torch, value.removeprefix("torch.")))
    elif setting == "default device":
        torch.set_default_device(None if value == "cpu" else value)
    elif setting == "grad mode":
        torch.set_grad_enabled(value == "enabled")
    elif setting == "threads":
        torch.set_num_threads(int(value))
    # interop threads can be set once per process, before any parallel work: reported only


@contextmanager
def kept(plugin: str, what: str) -> Iterator[None]:
    """Run the block (``what`` of ``plugin``, e.g. ``"import"``), then undo its changes
    to torch's process-global state, warning once per block that changed any."""
    torch = sys.modules.get("torch")
    before = _state(torch) if torch is not None else None
    try:
        yield
    finally:
        torch = sys.modules.get("torch")
        if torch is not None:
            after = _state(torch)
            baseline = before or TORCH_DEFAULTS
            changed = {k: (v, after[k]) for k, v in baseline.items() if after[k] != v}
            for setting, (old, _) in changed.items():
                _restore(torch, setting, old)
            if changed:
                logger.warning("plugin %s changed torch's process-global state in its %s "
                               "(%s): put back", plugin, what,
                               "; ".join(f"{k} {old} -> {new}" for k, (old, new)
                                         in changed.items()))
