"""Platform facts: what a platform declares, and what its device facts say, must be coherent.

Checked on the instance discovery made with the probe's sighting (its
:attr:`~hwplug.Platform.facts` narrow the class's lists to the device, e.g. fp8 KV caches
by capability), or, when the probe saw nothing here, on an instance without a sighting,
whose facts are the class's.
"""

from __future__ import annotations

from hwplug import registries
from hwplug.communicator import TORCH_DIST_ALIASES
from hwplug.conformance.result import Outcome
from hwplug.conformance.target import Target
from hwplug.dtypes import torch_dtype
from hwplug.errors import UnsupportedError
from hwplug.platform_interface import Platform

#: What stands in for the device's facts when the probe saw no device.
NO_SIGHTING = "class facts, no sighting"
#: Distributed backends a platform may declare that ``torch.distributed`` does not know.
NON_TORCH_DIST_BACKENDS = {"xla": "JAX/TPU collectives through XLA"}


def _dtype_problems(fact: str, names: tuple[str, ...]) -> list[str]:
    if not names:
        return [f"{fact} is empty"]
    problems = []
    for name in names:
        try:
            torch_dtype(name)
        except UnsupportedError as exc:
            problems.append(f"{fact}: {exc}")
    return problems


def _backend_problems(platform: Platform, notes: list[str]) -> list[str]:
    facts = platform.facts
    priority = tuple(facts.attention_backend_priority)
    if not priority:
        notes.append("declares no attention backend, so no model can run on it yet")
        return []
    problems = []
    if len(set(priority)) != len(priority):
        problems.append(f"attention_backend_priority repeats a name: {', '.join(priority)}")
    registered = registries.attention_backends.names()
    backends = []
    for backend_name in map(registries.attention_backends.current_name, priority):
        if backend_name not in registered:
            problems.append(f"attention_backend_priority names {backend_name!r}, which is not "
                            f"registered (registered: {', '.join(registered) or 'none'})")
            continue
        backend = registries.attention_backends.get(backend_name)
        if not platform.matches(backend.platforms):
            problems.append(f"attention backend {backend_name} runs on "
                            f"{', '.join(backend.platforms)}, not {platform.name}")
        backends.append(backend)
    accepted = {d for b in backends for d in b.supported_kv_cache_dtypes}
    orphans = [d for d in facts.supported_kv_cache_dtypes if d not in accepted]
    if backends and orphans:
        problems.append(f"KV-cache dtypes {', '.join(orphans)} are accepted by none of its "
                        f"attention backends ({', '.join(b.get_name() for b in backends)})")
    return problems


def _dist_problems(name: str, notes: list[str]) -> list[str]:
    import torch.distributed

    known = [b for b in torch.distributed.Backend.backend_list if b not in ("undefined", "fake")]
    if name in known:
        return []
    torch_name, why = TORCH_DIST_ALIASES.get(name, (None, ""))
    if torch_name in known:
        notes.append(f"dist_backend {name!r} is torch.distributed's {torch_name!r} ({why})")
        return []
    if name in NON_TORCH_DIST_BACKENDS:
        notes.append(f"dist_backend {name!r} is not a torch.distributed backend: "
                     f"{NON_TORCH_DIST_BACKENDS[name]}")
        return []
    return [f"dist_backend {name!r} is unknown to torch.distributed (known: {', '.join(known)}) "
            f"and not a documented non-torch backend ({', '.join(NON_TORCH_DIST_BACKENDS)})"]


def check_facts(target: Target) -> Outcome:
    """Dtypes are real, KV-cache dtypes are served by the platform's backends, the dist
    backend is known, and the backend priority names registered backends. Facts of an
    instance without a sighting are the class's, not a device's: ``simulated``
    (:data:`NO_SIGHTING`)."""
    platform = target.platform
    if platform is None and target.platform_ep is not None:
        return "failed", (f"no Platform subclass named {target.name!r} could be loaded from "
                          f"{target.platform_ep.module.partition('.')[0]}: "
                          f"{'; '.join(target.notes) or 'none defines it'}")
    if platform is None:
        return "skipped", "the plugin declares no platform"
    cls, facts = type(platform), platform.facts
    notes: list[str] = []
    problems = []
    if cls.name != target.platform_ep.name:
        problems.append(f"platform name {cls.name!r} differs from its entry-point name "
                        f"{target.platform_ep.name!r} (HWPLUG_PLATFORM uses the entry-point "
                        "name)")
    problems += [f"{fact} is empty" for fact in ("name", "device_type", "vendor")
                 if not getattr(cls, fact)]
    problems += _dtype_problems("supported_dtypes", facts.supported_dtypes)
    problems += _dtype_problems("supported_kv_cache_dtypes", facts.supported_kv_cache_dtypes)
    problems += _dist_problems(cls.dist_backend, notes)
    problems += _backend_problems(platform, notes)
    if cls.device_communicator is not None and ":" not in cls.device_communicator:
        problems.append(f"device_communicator {cls.device_communicator!r} is not "
                        "'module:Class'")
    unregistered = [q for q in facts.supported_quant_methods or ()
                    if q not in registries.quant_methods]
    if unregistered:
        notes.append(f"quant methods not registered yet: {', '.join(unregistered)}")
    source = "with its probe's sighting" if platform.sighting is not None else (
        "without a sighting (hardware absent): the class's facts")
    summary = (f"{cls.__name__} {source}: dtypes {', '.join(facts.supported_dtypes)}; KV "
               f"{', '.join(facts.supported_kv_cache_dtypes)}; dist {cls.dist_backend}; "
               f"backends {', '.join(facts.attention_backend_priority) or 'none'}")
    detail = "; ".join(problems) if problems else summary
    notes += list(facts.notes)
    if notes:
        detail += "; note: " + "; ".join(notes)
    if problems:
        return "failed", detail
    if platform.sighting is None:  # no device described these facts
        return "simulated", detail, NO_SIGHTING
    return "passed", detail
