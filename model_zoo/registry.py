"""Registering and finding model architectures by their Hugging Face architecture name."""

from __future__ import annotations

from typing import Any

from hwplug import registries
from hwplug.errors import UnknownNameError

__all__ = ["get_model_class", "register_model"]

_HOW_TO = ("Register one with hwplug.register_model('MyArchForCausalLM', 'my_pkg.model:MyArch') "
           "or an entry point in the 'hwplug.models' group")


def register_model(architecture: str, target: type | str, *, override: bool = False) -> None:
    """Register ``target`` (a class or a lazy ``"module:Class"``) for ``architecture``.

    A string target is imported only when that architecture is first requested.
    """
    registries.models.register(architecture, target, override=override)


def get_model_class(architecture: str) -> Any:
    """The class registered for ``architecture`` (registered in code, or by plugins once
    discovery ran: the entry points ``LLM`` and ``build_model`` run it first)."""
    if architecture not in registries.models:
        raise UnknownNameError("model architecture", architecture, registries.models.names(),
                               _HOW_TO)
    return registries.models.get(architecture)

