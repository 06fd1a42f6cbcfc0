"""``checked``: the argument check in front of a method that hands tensors to C.

A C kernel trusts the pointers, sizes and strides it gets: a float16 tensor where it writes
float32, or a tensor shorter than the shape it is told, overruns the heap instead of
raising. Each op method of the CPU platform's native libraries is therefore declared with
the ``*_supported`` function that says why a call cannot be served (the registry's
``supports`` of its variants), and :func:`checked` makes calling the method run it first:
a reason is an :class:`~hwplug.errors.UnsupportedError`, raised before anything is written.

The registry asks ``supports`` itself before every call of such a variant, so its variants
name the method's ``unchecked`` form (``"module:AVX2.rms_norm.unchecked"``): every call
reaching C is checked once, not twice.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from hwplug.errors import UnsupportedError

__all__ = ["checked"]

#: ``supported(*args, **kwargs)``: None when a call can be served, else why not.
Supported = Callable[..., "str | None"]


class _BoundCheck:
    """A :func:`checked` method bound to its library: calling it checks, then calls."""

    __slots__ = ("unchecked", "_supported", "_name")

    def __init__(self, unchecked: Callable[..., Any], supported: Supported, name: str) -> None:
        #: The method without the check (for callers that checked already).
        self.unchecked = unchecked
        self._supported, self._name = supported, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        reason = self._supported(*args, **kwargs)
        if reason is not None:
            raise UnsupportedError(f"{self._name}: {reason}")
        return self.unchecked(*args, **kwargs)


class _Checked:
    """The descriptor :func:`checked` makes of a method."""

    def __init__(self, method: Callable[..., Any], supported: str) -> None:
        self.method, self.supported = method, supported
        functools.update_wrapper(self, method)

    def __get__(self, library: Any, owner: type | None = None) -> Any:
        if library is None:
            return self
        supported = getattr(sys.modules[self.method.__module__], self.supported)
        name = f"{getattr(library, 'name', type(library).__name__)} {self.method.__name__}"
        return _BoundCheck(self.method.__get__(library, owner), supported, name)


def checked(supported: str) -> Callable[[Callable[..., Any]], Any]:
    """Decorate a native op method: a call first runs ``supported`` (the name of a
    function of the method's module, defined there before or after the class) on its
    arguments and raises :class:`UnsupportedError` with the reason it gives;
    ``.unchecked`` on the bound method skips that (the caller checked)."""
    return functools.partial(_Checked, supported=supported)
