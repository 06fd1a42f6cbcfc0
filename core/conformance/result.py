"""What the conformance kit produces: one :class:`CheckResult` per :class:`Check`, in a
:class:`Report`. Plain data, importable without torch.

A check ends ``passed``, ``failed``, ``skipped`` (nothing to check: the plugin does not
claim or register it) or ``not checked`` (there is something to check, but not on this
machine: its device, a package or a device feature is absent, or the kit cannot judge it
here). A report with nothing failed is ``ok``; it is ``complete`` when nothing was left
unchecked, and :meth:`Report.exit_status` says both to a shell.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

logger = logging.getLogger(__name__)

Status = Literal["passed", "failed", "skipped", "not checked"]
STATUSES: tuple[str, ...] = ("passed", "failed", "skipped", "not checked")
#: Exit status of a report that passed what it checked but left checks unchecked.
INCOMPLETE_EXIT_STATUS = 3


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
    """Every check's result for one plugin. ``ok`` is False as soon as one check failed;
    ``complete`` as soon as one was not checked here."""

    plugin: str
    results: list[CheckResult] = field(default_factory=list)

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == "failed"]

    @property
    def not_checked(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == "not checked"]

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def complete(self) -> bool:
        return not self.not_checked

    def counts(self) -> dict[str, int]:
        """How many checks ended in each status."""
        counts = dict.fromkeys(STATUSES, 0)
        for result in self.results:
            counts[result.status] += 1
        return counts

    def exit_status(self, require_all: bool = False) -> int:
        """0 when every check passed or was skipped; 1 when one failed (or, with
        ``require_all``, was not checked here); else :data:`INCOMPLETE_EXIT_STATUS`."""
        if self.failed or (require_all and not self.complete):
            return 1
        return 0 if self.complete else INCOMPLETE_EXIT_STATUS

    def verdict(self, require_all: bool = False) -> str:
        """``PASSED``, ``FAILED`` or ``INCOMPLETE``, the plugin and the counts, in one line."""
        word = {0: "PASSED", 1: "FAILED", INCOMPLETE_EXIT_STATUS: "INCOMPLETE"}[
            self.exit_status(require_all)]
        counts = self.counts()
        text = (f"{word} {self.plugin}: {counts['passed']} passed, {counts['failed']} failed, "
                f"{counts['skipped']} skipped, {counts['not checked']} not checked here")
        if word == "INCOMPLETE":
            text += " (nothing failed, but not everything could be checked on this machine)"
        elif require_all and not self.complete:
            text += " (--require-all: every check must run here)"
        return text

    def summary(self) -> str:
        """The verdict, then one line per check that failed or was not checked (for
        assertion messages)."""
        lines = [self.verdict()]
        lines += [f"FAILED {r.check}: {r.detail}" for r in self.failed]
        lines += [f"NOT CHECKED {r.check}: {r.detail}" for r in self.not_checked]
        return "\n".join(lines)
