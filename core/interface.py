"""``StrictInterface``: base of every public extension class (Platform, AttentionBackend, ...).

A subclass that defines a public method the interface does not declare, or overrides
one with an incompatible signature, fails when the class is created. A renamed or
misspelt hook therefore raises at import time instead of going silently uncalled.
Helpers a subclass needs for itself must be private (a leading underscore).
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any


def _unwrap(member: Any) -> Any:
    return member.__func__ if isinstance(member, (classmethod, staticmethod)) else member


def _incompatibility(base_fn: Any, override_fn: Any) -> str | None:
    """Why ``override_fn`` cannot stand in for ``base_fn``, or None if it can."""
    try:
        base = inspect.signature(base_fn)
        new = inspect.signature(override_fn)
    except (TypeError, ValueError):
        return None
    new_params = new.parameters
    var_kw = any(p.kind is p.VAR_KEYWORD for p in new_params.values())
    var_pos = any(p.kind is p.VAR_POSITIONAL for p in new_params.values())
    base_positional = [p for p in base.parameters.values()
                       if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    new_positional = [p for p in new_params.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for index, param in enumerate(base_positional):
        if index >= len(new_positional):
            if not var_pos:
                return f"parameter {param.name!r} is missing"
            continue
        if new_positional[index].name != param.name and param.kind is not param.POSITIONAL_ONLY:
            return f"parameter {index} is {new_positional[index].name!r}, expected {param.name!r}"
    for param in base.parameters.values():
        if param.kind is param.KEYWORD_ONLY and param.name not in new_params and not var_kw:
            return f"keyword parameter {param.name!r} is missing"
    base_names = set(base.parameters)
    for param in new_params.values():
        extra = param.name not in base_names and param.kind not in (
            param.VAR_POSITIONAL, param.VAR_KEYWORD)
        if extra and param.default is param.empty:
            return f"new parameter {param.name!r} has no default"
    return None


class StrictInterface:
    """Checks each subclass against the public surface of its interface root.

    The interface root is the class that sets ``_interface_root = True`` in its body
    (e.g. :class:`hwplug.Platform`); it may declare any public methods and attributes.
    """

    _interface_root = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("_interface_root"):
            return
        root = next(base for base in cls.__mro__[1:]
                    if base.__dict__.get("_interface_root"))
        public = {name for klass in root.__mro__ for name in vars(klass)
                  if not name.startswith("_")}
        public |= {name for klass in root.__mro__
                   for name in getattr(klass, "__annotations__", {}) if not name.startswith("_")}
        for name, member in vars(cls).items():
            if name.startswith("_"):
                continue
            if name not in public:
                close = difflib.get_close_matches(name, public, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise TypeError(
                    f"{cls.__qualname__}.{name} is not part of the {root.__name__} interface{hint} "
                    f"(helpers must be private, e.g. _{name})"
                )
            base_member = inspect.getattr_static(root, name, None)
            if callable(_unwrap(base_member)) and callable(_unwrap(member)):
                reason = _incompatibility(_unwrap(base_member), _unwrap(member))
                if reason:
                    raise TypeError(
                        f"{cls.__qualname__}.{name} overrides {root.__name__}.{name} with an "
                        f"incompatible signature: {reason}"
                    )
