"""pytest plugin (entry point ``pytest11``): ``pytest --hwplug-conformance=PLUGIN``.

With the option, the conformance kit's checks of PLUGIN become test items, one per
check, with node ids ``hwplug-conformance[PLUGIN]::<check>``: a failed check fails its
item with the kit's message, a skipped check is skipped with its reason, a check not
checked here is skipped as ``not checked here: ...``, a simulated check (checked, but with
something standing in for the device) passes; with ``--hwplug-require-all`` both of those
fail. ``-k`` selects checks by name. The option may be repeated.
Without it this plugin only declares the options: it imports nothing else and adds no
items.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

OPTION = "--hwplug-conformance"
REQUIRE_ALL = "--hwplug-require-all"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("hwplug").addoption(
        OPTION, metavar="PLUGIN", action="append", default=[], dest="hwplug_conformance",
        help="run hwplug's conformance kit against PLUGIN (an entry-point name, or cpu / "
             "hwplug for the built-ins); one test item per check")
    parser.getgroup("hwplug").addoption(
        REQUIRE_ALL, action="store_true", default=False, dest="hwplug_require_all",
        help="a conformance check that cannot run on the plugin's device here fails "
             "instead of being skipped (not checked) or passing (simulated)")


def pytest_configure(config: pytest.Config) -> None:
    names = config.getoption("hwplug_conformance")
    if names:
        config.pluginmanager.register(_ItemSource(names), "hwplug-conformance-items")


class ConformanceFailure(Exception):
    """A check failed; the message is the kit's detail."""


class ConformanceItem(pytest.Item):
    """One conformance check, run as a test."""

    def __init__(self, *, check: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.check = check

    def runtest(self) -> None:
        result = self.check.run()
        unchecked = result.status == "not checked"
        if result.status == "failed":
            raise ConformanceFailure(result.detail)
        if result.status in ("simulated", "not checked") and self.config.getoption(
                "hwplug_require_all"):
            raise ConformanceFailure(
                f"not checked here: {result.detail}" if unchecked else
                f"simulated ({result.simulation}), not on the device: {result.detail}")
        if result.status == "skipped" or unchecked:
            pytest.skip(f"not checked here: {result.detail}" if unchecked else result.detail)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: Any = None) -> str:
        if isinstance(excinfo.value, ConformanceFailure):
            return f"{self.check.name}: {excinfo.value}"
        return str(super().repr_failure(excinfo, style=style))

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"conformance check {self.name}"


class ConformanceCollector(pytest.Collector):
    """Resolves one plugin and plans its checks when collected."""

    def __init__(self, *, plugin: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plugin = plugin

    def collect(self) -> Iterable[pytest.Item]:
        from hwplug.conformance.kit import plan
        from hwplug.conformance.target import resolve_target
        from hwplug.errors import HwplugError

        try:
            target = resolve_target(self.plugin)
        except HwplugError as exc:
            raise pytest.UsageError(f"{OPTION}={self.plugin}: {exc}") from exc
        return [ConformanceItem.from_parent(self, name=check.name, check=check)
                for check in plan(target)]


class _ItemSource:
    """Adds the items after normal collection, before ``-k`` / ``-m`` deselect any."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, session: pytest.Session,
                                      items: list[pytest.Item]) -> None:
        for name in self.names:
            collector = ConformanceCollector.from_parent(
                session, name=f"hwplug-conformance[{name}]", plugin=name)
            items.extend(collector.collect())
