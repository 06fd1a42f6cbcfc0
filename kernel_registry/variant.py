"""``Variant``: one implementation of an op, with its eligibility stated as data."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from hwplug.platform_interface import DeviceCapability

if TYPE_CHECKING:
    from hwplug.kernel_registry.native import NativeLibrary
    from hwplug.platform_interface import Platform

#: ``supports(*args, **kwargs)`` of a variant: None if it can serve this call, else why not.
SupportsFn = Callable[..., "str | None"]


@dataclass
class Variant:
    """An implementation of ``op`` and the facts that decide where it may run.

    ``impl`` is the callable or a lazy ``"module:function"`` (imported when first chosen).
    Facts checked once per dispatch key: ``platforms`` (platform or family names, see
    :meth:`~hwplug.Platform.matches`; empty = any platform, on any device), ``dtypes`` (of
    the op's dispatch tensor; empty = any), ``features`` the device must have (its
    :attr:`~hwplug.Platform.facts`), capability range, ``min_toolkit`` and ``packages``
    version gates, and the ``num_tokens`` range ``[low, high)`` of the dispatch tensor's
    leading dimension. ``supports`` (a callable or a
    lazy ``"module:function"``, imported with ``impl``) is checked on every call for what
    only the call's shapes can tell; leave it None where possible. ``native`` is the
    compiled library ``impl`` calls, if any (a :class:`~hwplug.kernel_registry.native.
    NativeLibrary` or a lazy ``"module:attribute"`` naming one): importing it builds
    nothing; the registry explains from its build status and builds it when it binds the
    variant for calls.
    """

    op: str
    name: str
    impl: Callable[..., Any] | str
    priority: int = 0
    platforms: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    min_capability: str | None = None
    max_capability: str | None = None
    min_toolkit: str | None = None
    packages: dict[str, str] = field(default_factory=dict)
    num_tokens: tuple[int, int | None] | None = None
    supports: SupportsFn | str | None = None
    native: NativeLibrary | str | None = None
    description: str = ""

    @property
    def key(self) -> str:
        return f"{self.op}/{self.name}"

    def load(self) -> None:
        """Import a lazy ``impl``, ``supports`` and ``native`` in place (import errors
        propagate). Nothing is built: see :attr:`native`."""
        from hwplug.registry import import_object

        if isinstance(self.impl, str):
            self.impl = import_object(self.impl)
        if isinstance(self.supports, str):
            self.supports = import_object(self.supports)
        if isinstance(self.native, str):
            self.native = import_object(self.native)

    def static_rejection(self, platform: Platform, device_type: str, dtype: str,
                         num_tokens: int | None) -> str | None:
        """Why this variant cannot serve the dispatch key, or None if it can."""
        if self.platforms:
            if not platform.matches(self.platforms):
                return self._platform_rejection(platform)
            if device_type != platform.device_type:
                return f"needs tensors on {platform.device_type}, got {device_type}"
        if self.dtypes and dtype not in self.dtypes:
            return f"dtype {dtype} not in {', '.join(self.dtypes)}"
        return self._gate_rejection(platform) or self._tokens_rejection(num_tokens)

    def device_rejection(self, platform: Platform) -> str | None:
        """Why this variant can serve no call at all on ``platform``'s device (its platform,
        device features, capability or version gates), or None."""
        if self.platforms and not platform.matches(self.platforms):
            return self._platform_rejection(platform)
        return self._gate_rejection(platform)

    def _platform_rejection(self, platform: Platform) -> str:
        return f"serves platform {', '.join(self.platforms)}, not {platform.name}"

    def _gate_rejection(self, platform: Platform) -> str | None:
        return (self._feature_rejection(platform) or self._capability_rejection(platform)
                or self._version_rejection(platform))

    def _feature_rejection(self, platform: Platform) -> str | None:
        missing = [f for f in self.features if f not in platform.facts.features]
        if not missing:
            return None
        present = ", ".join(sorted(platform.facts.features)) or "none"
        return f"needs device feature {', '.join(missing)} ({platform.name} has: {present})"

    def _capability_rejection(self, platform: Platform) -> str | None:
        if self.min_capability is None and self.max_capability is None:
            return None
        current = platform.facts.capability
        if current is None:
            return "needs a device capability; the platform reports none"
        if self.min_capability and current < DeviceCapability.parse(self.min_capability):
            return f"capability {current} below {self.min_capability}"
        if self.max_capability and current > DeviceCapability.parse(self.max_capability):
            return f"capability {current} above {self.max_capability}"
        return None

    def _version_rejection(self, platform: Platform) -> str | None:
        if self.min_toolkit:
            toolkit = platform.toolkit_version()
            if toolkit is None or _version(toolkit) < _version(self.min_toolkit):
                return f"toolkit {toolkit or 'absent'} below {self.min_toolkit}"
        for package, spec in self.packages.items():
            try:
                installed = importlib.metadata.version(package)
            except importlib.metadata.PackageNotFoundError:
                return f"package {package} not installed (needs {spec})"
            if _version(installed) not in SpecifierSet(spec):
                return f"{package} {installed} does not satisfy {spec}"
        return None

    def _tokens_rejection(self, num_tokens: int | None) -> str | None:
        if self.num_tokens is None or num_tokens is None:
            return None
        low, high = self.num_tokens
        if num_tokens < low or (high is not None and num_tokens >= high):
            return f"num_tokens {num_tokens} outside [{low}, {high if high else 'inf'})"
        return None


def _version(text: str) -> Version:
    try:
        return Version(text.split("+")[0])
    except InvalidVersion:
        return Version("0")
