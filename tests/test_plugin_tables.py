"""Each plugin README's "what runs where" table is the conformance kit's report (issue 28).

docs/make_plugin_tables.py writes the tables from ``hwplug conformance --json`` and keeps
what the kits reported in docs/conformance_snapshot.json. Running every kit at its
default budget takes minutes, so CI holds the chain link by link: every README table is
the snapshot's; the snapshot's checks are the ones each kit plans today; and one kit
(cuda, small budget) still reports each check as the snapshot says.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hwplug.conformance import plan, resolve_target

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs"))
import make_plugin_tables as tables  # noqa: E402

SNAPSHOT = json.loads(tables.SNAPSHOT.read_text())


def test_every_readme_table_is_the_snapshots():
    assert tables.problems(SNAPSHOT) == []
    marked = [folder for folder in tables.PLUGINS
              if tables.BEGIN in tables.readme(folder).read_text()]
    assert {"cuda", "rocm-aiter", "xpu", "cpu-arm"} <= set(marked)


def test_a_readme_that_disagrees_with_the_kit_is_named():
    drifted = copy.deepcopy(SNAPSHOT)
    row = next(r for r in drifted["cuda"]["results"] if r["status"] == "simulated")
    row["status"], row["simulation"] = "passed", ""
    assert tables.problems(drifted) == [
        "plugins/cuda/README.md: its table differs from the kit's report "
        "(python docs/make_plugin_tables.py)"]


@pytest.mark.parametrize("name", sorted(tables.PLUGINS.values()))
def test_the_snapshot_has_the_checks_the_kit_plans_today(name, fresh_discovery, monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    planned = [check.name for check in plan(resolve_target(name))]
    assert [r["check"] for r in SNAPSHOT[name]["results"]] == planned


def test_the_cuda_kit_still_reports_what_the_snapshot_says():
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWPLUG_")}
    env.update(JAX_PLATFORMS="cpu", COLUMNS="200")
    proc = subprocess.run([sys.executable, "-m", "hwplug.cli.main", "conformance", "cuda",
                           "--kernel-examples", "2", "--attention-examples", "1", "--json"],
                          capture_output=True, text=True, env=env, timeout=300)
    report = json.loads(proc.stdout)
    now = [(r["check"], r["status"], r["simulation"]) for r in report["results"]]
    stored = [(r["check"], r["status"], r["simulation"]) for r in SNAPSHOT["cuda"]["results"]]
    assert now == stored
