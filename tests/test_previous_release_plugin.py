"""A plugin package written against release 0.1's public names still loads and passes the
conformance kit (the stability rule: a renamed or removed public name keeps a warning shim
for at least one release; see docs/api.md).

The package (tests/release_0_1_plugin/hwplug-acme-npu, the scaffold of release 0.1 plus a
``paged_attention`` variant in that release's signature) is installed as a distribution on
``PYTHONPATH`` and its own tests run in a fresh process; its device is a file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parent / "release_0_1_plugin" / "hwplug-acme-npu"

pytestmark = pytest.mark.slow  # a fresh process runs the kit over every attention scenario


def install(site: Path) -> None:
    """``PACKAGE`` as pip leaves it: the import package and a dist-info with its entry
    points."""
    shutil.copytree(PACKAGE / "hwplug_acme_npu", site / "hwplug_acme_npu")
    info = site / "hwplug_acme_npu-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hwplug-acme-npu\n"
                                   "Version: 0.1.0\n")
    (info / "entry_points.txt").write_text(
        "[hwplug.platforms]\nacme-npu = hwplug_acme_npu.probe:activate\n\n"
        "[hwplug.plugins]\nacme-npu = hwplug_acme_npu.plugin\n")


def test_release_0_1_plugin_passes_the_kit_with_deprecation_warnings(tmp_path: Path):
    site = tmp_path / "site"
    install(site)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(site), *filter(None, [os.environ.get("PYTHONPATH")])])}
    tests = tmp_path / "tests"
    shutil.copytree(PACKAGE / "tests", tests)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
         "-W", "always::DeprecationWarning", "--rootdir", str(tmp_path), str(tests)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and "failed" not in out.stdout
    for op in ("reshape_and_cache", "paged_attention"):  # the old call form, converted
        assert f"{op} called with the arguments written out" in out.stdout
    assert "a paged_attention variant with release 0.1's signature" in out.stdout


def test_release_0_1_module_hwplug_platform_warns_and_gives_todays_objects():
    import importlib

    import hwplug
    from hwplug.device import DeviceCapability
    from hwplug.dtypes import torch_dtype

    sys.modules.pop("hwplug.platform", None)
    with pytest.warns(DeprecationWarning, match="hwplug.platform is deprecated"):
        old = importlib.import_module("hwplug.platform")
    assert old.Platform is hwplug.Platform
    assert old.DeviceCapability is DeviceCapability and old.torch_dtype is torch_dtype


def test_a_connector_written_before_get_num_new_matched_tokens_loads_nothing(caplog):
    from hwplug.connector import Connector, ConnectorRequest, KVLayout

    class BeforeMatching(Connector):  # release 0.1's abstract methods only
        @classmethod
        def get_name(cls):
            return "before_matching"

        def start_load_kv(self, metadata, kv_caches):
            raise AssertionError("nothing to load")

        def wait_for_layer_load(self, layer_name):
            pass

        def save_kv_layer(self, layer_name, kv_layer, metadata):
            pass

        def wait_for_save(self):
            pass

    connector = BeforeMatching(KVLayout("TORCH_PAGED", "NHD", "float32", 16, 2, 8, 2))
    request = ConnectorRequest("r", 32, ("a", "b"))
    with caplog.at_level("WARNING", logger="hwplug.connector"):
        assert connector.get_num_new_matched_tokens(request, 0) == 0
        assert connector.get_num_new_matched_tokens(request, 16) == 0
    assert [r.getMessage() for r in caplog.records] == [
        "connector before_matching does not implement get_num_new_matched_tokens (added "
        "after release 0.1): it loads nothing"]
