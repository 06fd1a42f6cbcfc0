"""Platform facts: the class attributes a platform declares must be coherent.

Checked on the platform instance when its hardware is present (instances may refine
facts, e.g. fp8 KV caches by capability), else on the class: the facts are plain data,
so no device query runs.
"""

from __future__ import annotations

from typing import Any

from hwplug import registries
from hwplug.conformance.result import Status
from hwplug.conformance.target import Target
from hwplug.errors import UnsupportedError
from hwplug.platform import torch_dtype

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


def _backend_problems(facts: Any, notes: list[str]) -> list[str]:
    priority = tuple(facts.attention_backend_priority)
    if not priority:
        notes.append("declares no attention backend, so no model can run on it yet")
        return []
    problems = []
    if len(set(priority)) != len(priority):
        problems.append(f"attention_backend_priority repeats a name: {', '.join(priority)}")
    registered = registries.attention_backends.names()
    backends = []
    for name in priority:
        if name not in registered:
            problems.append(f"attention_backend_priority names {name!r}, which is not "
                            f"registered (registered: {', '.join(registered) or 'none'})")
            continue
        backend = registries.attention_backends.get(name)
        if backend.platforms and facts.name not in backend.platforms:
            problems.append(f"attention backend {name} runs on {', '.join(backend.platforms)}, "
                            f"not {facts.name}")
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
    if name in NON_TORCH_DIST_BACKENDS:
        notes.append(f"dist_backend {name!r} is not a torch.distributed backend: "
                     f"{NON_TORCH_DIST_BACKENDS[name]}")
        return []
    return [f"dist_backend {name!r} is unknown to torch.distributed (known: {', '.join(known)}) "
            f"and not a documented non-torch backend ({', '.join(NON_TORCH_DIST_BACKENDS)})"]


def check_facts(target: Target) -> tuple[Status, str]:
    """Dtypes are real, KV-cache dtypes are served by the platform's backends, the dist
    backend is known, and the backend priority names registered backends."""
    cls = target.platform_cls
    if cls is None and target.platform_ep is not None:
        return "failed", (f"no Platform subclass named {target.name!r} could be loaded from "
                          f"{target.platform_ep.module.partition('.')[0]}: "
                          f"{'; '.join(target.notes) or 'none defines it'}")
    if cls is None:
        return "skipped", "the plugin declares no platform"
    facts: Any = target.placement.platform if target.placement.platform is not None and (
        target.placement.platform.name == cls.name) else cls
    notes: list[str] = []
    problems = []
    if not target.builtin and cls.name != target.name:
        problems.append(f"platform name {cls.name!r} differs from its entry-point name "
                        f"{target.name!r} (HWPLUG_PLATFORM uses the entry-point name)")
    problems += [f"{fact} is empty" for fact in ("name", "device_type", "vendor")
                 if not getattr(cls, fact)]
    problems += _dtype_problems("supported_dtypes", tuple(facts.supported_dtypes))
    problems += _dtype_problems("supported_kv_cache_dtypes",
                                tuple(facts.supported_kv_cache_dtypes))
    problems += _dist_problems(cls.dist_backend, notes)
    problems += _backend_problems(facts, notes)
    if cls.device_communicator is not None and ":" not in cls.device_communicator:
        problems.append(f"device_communicator {cls.device_communicator!r} is not "
                        "'module:Class'")
    unregistered = [q for q in facts.supported_quant_methods if q not in registries.quant_methods]
    if unregistered:
        notes.append(f"quant methods not registered yet: {', '.join(unregistered)}")
    source = "instance" if facts is not cls else "class (hardware absent)"
    summary = (f"{cls.__name__} {source}: dtypes {', '.join(facts.supported_dtypes)}; KV "
               f"{', '.join(facts.supported_kv_cache_dtypes)}; dist {cls.dist_backend}; "
               f"backends {', '.join(facts.attention_backend_priority) or 'none'}")
    detail = "; ".join(problems) if problems else summary
    if notes:
        detail += "; note: " + "; ".join(notes)
    return ("failed" if problems else "passed"), detail
