"""The conformance kit: every check for one plugin, planned then run.

:func:`plan` turns a resolved :class:`~hwplug.conformance.target.Target` into named
checks (registration, probe, platform facts, step replay, one per KV-cache layout, per
kernel variant, per attention backend scenario, per quant method and per connector the
plugin registered);
:func:`run_conformance` resolves, plans and runs them into a
:class:`~hwplug.conformance.result.Report`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hwplug import kernels, registries
from hwplug.conformance.backends import backend_checks
from hwplug.conformance.connectors import connector_check
from hwplug.conformance.facts import check_facts
from hwplug.conformance.layouts import layout_check
from hwplug.conformance.probe import check_probe
from hwplug.conformance.quant_methods import quant_method_check
from hwplug.conformance.registration import check_hooks, check_loads, check_names
from hwplug.conformance.result import Check, Report, Status
from hwplug.conformance.step_replay import check_step_replay
from hwplug.conformance.target import SIMULATION_GAPS, Target, resolve_target
from hwplug.conformance.variants import variant_check
from hwplug.registry import Registry


@dataclass(frozen=True)
class Budget:
    """How many generated examples each numerical check runs."""

    kernel_examples: int = 20
    attention_examples: int = 4
    quant_examples: int = 10


def _fixed(name: str, status: Status, detail: str) -> Check:
    return Check(name, lambda: (status, detail))


def _owned_names(registry: Registry[Any], target: Target) -> list[str]:
    return [e.name for e in registry.entries()
            if e.source in target.sources and e.status != "removed"]


def _loader(registry: Registry[Any], name: str) -> Callable[[], Any]:
    return lambda: registry.get(name)


def _registration_checks(target: Target) -> list[Check]:
    if not target.plugin_eps:
        return [_fixed("registration", "skipped",
                       "no hwplug.plugins entry point: the plugin registers nothing")]
    return [Check("registration: plugin loads", lambda: check_loads(target)),
            Check("registration: hooks", lambda: check_hooks(target)),
            Check("registration: names", lambda: check_names(target))]


def _probe_check(target: Target) -> Check:
    if target.platform_ep is None:
        return _fixed("probe: cheap", "skipped", "the plugin has no hwplug.platforms entry point")
    return Check("probe: cheap", lambda: check_probe(target.platform_ep.name))


def _interface_checks(target: Target, budget: Budget) -> list[Check]:
    placement = target.placement
    checks = [layout_check(n, _loader(registries.kv_layouts, n), placement)
              for n in _owned_names(registries.kv_layouts, target)]
    variants = [kernels.get(key) for key in _owned_names(kernels, target)]
    variant_checks = [variant_check(v, placement, budget.kernel_examples)
                      for v in variants if v.name != kernels.REFERENCE]
    oracle = " besides the references (the oracle)" if target.is_hwplug else ""
    checks += variant_checks or [_fixed("kernel variants", "skipped",
                                        f"the plugin registers no kernel variants{oracle}")]
    backends = _owned_names(registries.attention_backends, target)
    for name in backends:
        checks += backend_checks(name, _loader(registries.attention_backends, name), placement,
                                 budget.attention_examples)
    quant = _owned_names(registries.quant_methods, target)
    checks += [quant_method_check(n, _loader(registries.quant_methods, n), placement,
                                  budget.quant_examples) for n in quant]
    connectors = _owned_names(registries.connectors, target)
    checks += [connector_check(n, _loader(registries.connectors, n), placement)
               for n in connectors]
    for kind, names in (("attention backends", backends), ("quant methods", quant),
                        ("connectors", connectors)):
        if not names:
            checks.append(_fixed(kind, "skipped", f"the plugin registers no {kind}"))
    return checks


def _setup_checks(target: Target) -> list[Check]:
    """Where the numerical checks run: on the device (``passed``), or in its stead, where
    the device's gates are "not checked", and so is each dtype the simulation cannot
    judge (one row each)."""
    placement = target.placement
    setup = placement.explain() + "".join(f"; note: {n}" for n in target.notes)
    if not placement.simulating:
        return [_fixed("setup", "passed", f"numerical checks run {setup}")]
    return [_fixed("setup", "not checked",
                   f"the device's own gates are not evaluated; numerical checks run {setup}"),
            *(_fixed(f"simulation: {dtype}", "not checked", f"not judged in simulation: {why}")
              for dtype, why in SIMULATION_GAPS.items())]


def plan(target: Target, budget: Budget | None = None) -> list[Check]:
    """Every check of ``target``, in report order, none run yet."""
    budget = budget or Budget()
    return [*_setup_checks(target), *_registration_checks(target), _probe_check(target),
            Check("platform facts", lambda: check_facts(target)),
            Check("step replay", lambda: check_step_replay(target)),
            *_interface_checks(target, budget)]


def run_conformance(name: str, budget: Budget | None = None,
                    progress: Callable[[str], None] | None = None) -> Report:
    """Check plugin ``name`` (an entry-point name, or ``"cpu"``/``"hwplug"`` for the
    built-ins) and return the report; ``progress`` is called with each check's name
    before it runs. Discovery is run afresh first."""
    target = resolve_target(name)
    report = Report(name)
    for check in plan(target, budget):
        if progress:
            progress(check.name)
        report.results.append(check.run())
    return report
