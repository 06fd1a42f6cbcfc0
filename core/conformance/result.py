"""What the conformance kit produces: one :class:`CheckResult` per :class:`Check`, in a
:class:`Report`. Plain data, importable without torch."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

logger = logging.getLogger(__name__)

Status = Literal["passed", "failed", "skipped"]


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check: ``detail`` says what failed and why, or why it was skipped."""

    check: str
    status: Status
    detail: str = ""


@dataclass(frozen=True)
class Check:
    """A named, not yet run check. ``run`` returns ``(status, detail)``.

    An exception escaping ``run`` is a failure whose detail is the exception and the
    innermost frame, so a crashing plugin never crashes the kit.
    """

    name: str
    run_fn: Callable[[], tuple[Status, str]]

    def run(self) -> CheckResult:
        logger.info("conformance check %s", self.name)
        try:
            status, detail = self.run_fn()
        except Exception as exc:
            frames = traceback.extract_tb(exc.__traceback__)
            where = next((f for f in reversed(frames) if not f.filename.startswith("<")),
                         frames[-1])
            return CheckResult(self.name, "failed",
                               f"raised {exc!r} at {where.filename}:{where.lineno}")
        return CheckResult(self.name, status, detail)


@dataclass
class Report:
    """Every check's result for one plugin. ``ok`` is False as soon as one check failed."""

    plugin: str
    results: list[CheckResult] = field(default_factory=list)

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == "failed"]

    @property
    def ok(self) -> bool:
        return not self.failed

    def counts(self) -> dict[str, int]:
        """How many checks passed, failed and were skipped."""
        counts = {"passed": 0, "failed": 0, "skipped": 0}
        for result in self.results:
            counts[result.status] += 1
        return counts

    def summary(self) -> str:
        """One line of counts, then one line per failed check (for assertion messages)."""
        counts = ", ".join(f"{n} {status}" for status, n in self.counts().items())
        lines = [f"conformance of {self.plugin}: {counts}"]
        lines += [f"FAILED {r.check}: {r.detail}" for r in self.failed]
        return "\n".join(lines)
