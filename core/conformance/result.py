"""What the conformance kit produces: one :class:`CheckResult` per :class:`Check`, in a
:class:`Report`. Plain data, importable without torch.

A check ends ``passed`` (checked on the platform's own device), ``simulated`` (checked,
but something stood in for the device: Triton's interpreter, a CPU stand-in such as torch's
CPU ``_scaled_mm``, JAX on CPU; :attr:`CheckResult.simulation` says which, see
:mod:`hwplug.conformance.execution`), ``failed``, ``skipped`` (nothing to check: the plugin
does not claim or register it) or ``not checked`` (there is something to check, but not on
this machine: its device, a package or a device feature is absent, or the kit cannot judge
it here). A report with nothing failed is ``ok``; it is ``complete`` when every check
passed on the device (or was skipped), and :meth:`Report.exit_status` says both to a shell.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

logger = logging.getLogger(__name__)

Status = Literal["passed", "simulated", "failed", "skipped", "not checked"]
STATUSES: tuple[str, ...] = ("passed", "simulated", "failed", "skipped", "not checked")
#: What a check's ``run`` returns: ``(status, detail)``, or for a ``simulated`` status
#: ``(status, detail, simulation)``.
Outcome = tuple[Status, str] | tuple[Status, str, str]
#: Exit status of a report with nothing failed that was not all checked on the device.
INCOMPLETE_EXIT_STATUS = 3


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check: ``detail`` says what failed and why, or why it was skipped;
    ``simulation`` what stood in for the device when ``status`` is ``simulated``."""

    check: str
    status: Status
    detail: str = ""
    simulation: str = ""


@dataclass(frozen=True)
class Check:
    """A named, not yet run check. ``run_fn`` returns an :data:`Outcome`.

    An exception escaping ``run`` is a failure whose detail is the exception and the
    innermost frame, so a crashing plugin never crashes the kit.
    """

    name: str
    run_fn: Callable[[], Outcome]

    def run(self) -> CheckResult:
        logger.info("conformance check %s", self.name)
        try:
            status, detail, *simulation = self.run_fn()
        except Exception as exc:
            frames = traceback.extract_tb(exc.__traceback__)
            where = next((f for f in reversed(frames) if not f.filename.startswith("<")),
                         frames[-1])
            return CheckResult(self.name, "failed",
                               f"raised {exc!r} at {where.filename}:{where.lineno}")
        return CheckResult(self.name, status, detail, *simulation)


@dataclass
class Report:
    """Every check's result for one plugin. ``ok`` is False as soon as one check failed;
    ``complete`` as soon as one was simulated or not checked here."""

    plugin: str
    results: list[CheckResult] = field(default_factory=list)

    def having(self, status: Status) -> list[CheckResult]:
        """The results that ended in ``status``."""
        return [r for r in self.results if r.status == status]

    @property
    def failed(self) -> list[CheckResult]:
        return self.having("failed")

    @property
    def not_checked(self) -> list[CheckResult]:
        return self.having("not checked")

    @property
    def simulated(self) -> list[CheckResult]:
        return self.having("simulated")

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def complete(self) -> bool:
        """Whether every check passed on the device (or had nothing to check)."""
        return not self.not_checked and not self.simulated

    def counts(self) -> dict[str, int]:
        """How many checks ended in each status."""
        counts = dict.fromkeys(STATUSES, 0)
        for result in self.results:
            counts[result.status] += 1
        return counts

    def simulations(self) -> dict[str, int]:
        """How many checks each stand-in for the device served (``simulated`` ones)."""
        counts: dict[str, int] = {}
        for result in self.simulated:
            counts[result.simulation] = counts.get(result.simulation, 0) + 1
        return counts

    def exit_status(self, require_all: bool = False) -> int:
        """0 when every check passed on the device or was skipped; 1 when one failed (or,
        with ``require_all``, was simulated or not checked here); else
        :data:`INCOMPLETE_EXIT_STATUS`."""
        if self.failed or (require_all and not self.complete):
            return 1
        return 0 if self.complete else INCOMPLETE_EXIT_STATUS

    def word(self) -> str:
        """``FAILED``; ``PASSED`` (every check on the device); ``SIMULATED`` (some only in
        simulation); else ``NOT CHECKED``."""
        if self.failed:
            return "FAILED"
        if self.complete:
            return "PASSED"
        return "SIMULATED" if self.simulated else "NOT CHECKED"

    def verdict(self, require_all: bool = False) -> str:
        """One line: the word, the plugin, then the counts, e.g. ``SIMULATED cuda: 5 passed,
        SIMULATED 19 (Triton interpreter 9, CPU stand-in 9, ...), NOT CHECKED 2 (setup,
        simulation: bfloat16), 2 skipped``; ``passed`` counts checks run for real (on the
        device, or of the plugin's code itself: registration, probe)."""
        counts = self.counts()
        parts = [f"{counts['failed']} failed"] if self.failed else []
        parts.append(f"{counts['passed']} passed")
        if self.simulated:
            how = ", ".join(f"{name} {n}" for name, n in sorted(self.simulations().items()))
            parts.append(f"SIMULATED {counts['simulated']} ({how})")
        if self.not_checked:
            names = [r.check for r in self.not_checked]
            listed = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
            parts.append(f"NOT CHECKED {counts['not checked']} ({listed})")
        parts.append(f"{counts['skipped']} skipped")
        text = f"{self.word()} {self.plugin}: {', '.join(parts)}"
        if require_all and not self.complete and not self.failed:
            text += " (--require-all: every check must run on the device)"
        return text

    def summary(self) -> str:
        """The verdict, then one line per check that failed, was simulated or was not
        checked (for assertion messages)."""
        lines = [self.verdict()]
        lines += [f"FAILED {r.check}: {r.detail}" for r in self.failed]
        lines += [f"SIMULATED ({r.simulation}) {r.check}: {r.detail}" for r in self.simulated]
        lines += [f"NOT CHECKED {r.check}: {r.detail}" for r in self.not_checked]
        return "\n".join(lines)

    def as_json(self, require_all: bool = False) -> dict[str, Any]:
        """The report as JSON-able data: verdict, counts, stand-ins, every result."""
        return {"plugin": self.plugin, "ok": self.ok, "complete": self.complete,
                "word": self.word(),
                "verdict": self.verdict(require_all), "counts": self.counts(),
                "simulations": self.simulations(),
                "results": [asdict(r) for r in self.results]}
