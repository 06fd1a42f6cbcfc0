"""The conformance kit: checks that a plugin keeps hwplug's contracts.

Run it as ``hwplug conformance <plugin>``, as ``pytest --hwplug-conformance=<plugin>``
(one test item per check), or from code::

    from hwplug.conformance import run_conformance
    report = run_conformance("acme")
    assert report.ok, report.summary()  # nothing failed
    report.complete  # and every check ran on the device, none simulated or "not checked"

Single pieces can be checked directly while writing them: :func:`check_variant` for a
kernel variant, :func:`check_backend` for an attention backend class,
:func:`check_quant_method` and :func:`check_connector` for those classes. Importing this
package is cheap (no torch, no hypothesis); the checks load them when they run.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "run_conformance": "hwplug.conformance.kit",
    "plan": "hwplug.conformance.kit",
    "Budget": "hwplug.conformance.kit",
    "check_variant": "hwplug.conformance.variants",
    "check_backend": "hwplug.conformance.backends",
    "check_quant_method": "hwplug.conformance.quant_methods",
    "check_connector": "hwplug.conformance.connectors",
    "Placement": "hwplug.conformance.target",
    "resolve_target": "hwplug.conformance.target",
    "Report": "hwplug.conformance.result",
    "CheckResult": "hwplug.conformance.result",
    "Check": "hwplug.conformance.result",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'hwplug.conformance' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
