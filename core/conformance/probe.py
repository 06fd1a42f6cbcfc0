"""Probe cheapness: a platform's probe imports no torch, triton or jax and answers fast.

The probe runs in a fresh interpreter (``python -m hwplug.conformance.probe NAME``) that
first imports hwplug's discovery, then times loading the entry point and calling it, and
prints what it saw as one JSON line. The child gets the parent's ``sys.path``, so
plugins installed for the parent only (e.g. a test's site directory) are found too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from hwplug.conformance.result import Status

#: How long loading and calling a probe may take.
PROBE_BUDGET_MS = 50.0
#: Time allowed for the fresh interpreter to start and import hwplug's discovery.
INTERPRETER_START_S = 60.0
#: Modules a probe must not import.
HEAVY_MODULES = ("torch", "triton", "jax")


def measure(name: str) -> dict[str, object]:
    """Load and call platform probe ``name`` in this process; what it returned, how long
    it took and which heavy modules it imported."""
    from hwplug import envs
    from hwplug.discovery import PLATFORM_GROUP, entry_points
    from hwplug.discovery.ranking import call_activate

    ep = next(ep for ep in entry_points(PLATFORM_GROUP) if ep.name == name)
    before = {m for m in HEAVY_MODULES if m in sys.modules}
    start = time.perf_counter()
    result = call_activate(ep.load(), envs.HWPLUG_PROBE_ROOT)
    elapsed_ms = (time.perf_counter() - start) * 1000
    imported = [m for m in HEAVY_MODULES if m in sys.modules and m not in before]
    return {"result": repr(result), "elapsed_ms": elapsed_ms, "imported": imported,
            "preloaded": sorted(before)}


def check_probe(name: str) -> tuple[Status, str]:
    """Run :func:`measure` in a subprocess and judge it against the budget."""
    from hwplug import envs

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    limit = envs.HWPLUG_PROBE_TIMEOUT + INTERPRETER_START_S
    try:
        proc = subprocess.run([sys.executable, "-m", __name__, name], capture_output=True,
                              text=True, env=env, timeout=limit)
    except subprocess.TimeoutExpired:
        return "failed", (f"the probe did not answer within {limit:g} s in a fresh interpreter "
                          f"(HWPLUG_PROBE_TIMEOUT plus {INTERPRETER_START_S:g} s to start it)")
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return "failed", f"the probe failed in a fresh interpreter: {last}"
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    problems = []
    if seen["imported"]:
        problems.append(f"the probe imported {', '.join(seen['imported'])}; probes must not "
                        "(defer heavy imports to the Platform class)")
    if seen["elapsed_ms"] > PROBE_BUDGET_MS:
        problems.append(f"the probe took {seen['elapsed_ms']:.1f} ms > {PROBE_BUDGET_MS:g} ms")
    if seen["preloaded"]:
        problems.append(f"{', '.join(seen['preloaded'])} already imported before the probe "
                        "ran, so its imports could not be checked")
    if problems:
        return "failed", "; ".join(problems)
    return "passed", (f"returned {seen['result']} in {seen['elapsed_ms']:.1f} ms without "
                      f"importing {', '.join(HEAVY_MODULES)}")


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1])))
