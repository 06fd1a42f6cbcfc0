"""The Triton kernels of hwplug-triton, one module per op, each with the op's exact signature.

Modules: ``norm`` (rms_norm), ``rotary`` (rotary_embedding), ``activation``
(silu_and_mul, gelu_and_mul), ``cache`` (reshape_and_cache, layout NHD) and
``attention`` (paged_attention, layout NHD); the attention op dispatches to
``decode_attention`` and ``prefill_attention``. The cache write and both attention
kernels read any layout through a :class:`~hwplug_triton.kernels.layouts.CacheView`
(``cache.write``, ``attention.attend``), so a plugin with a layout of its own serves it
with a view and these kernels. Quantized weights: ``ggml_linear`` and
``ggml_embedding`` (GGUF blocks dequantized in registers by ``ggml_blocks``) and
``scaled_mm`` (fp8 GEMM with per-tensor, per-token / channel or block scales). Launch
configs come from :mod:`hwplug_triton.tuning`. Each op module has a ``supported(...)`` taking the op's
arguments and returning why it cannot serve a call, or None, and its entry point is
decorated with :func:`checked`. Importing this package imports neither torch nor triton.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from hwplug.errors import UnsupportedError

#: Largest head size the attention kernels hold in registers.
MAX_HEAD_SIZE = 256


def checked(supported: Callable[..., str | None]
            ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a kernel entry point: called directly, it first raises
    :class:`~hwplug.errors.UnsupportedError` with ``supported``'s reason.
    ``entry.unchecked`` is the bare function; the registration helper registers that one,
    with ``supported`` as the variant's per-call check, so a call through the registry is
    checked once and falls back instead of raising."""
    def decorate(launch: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(launch)
        def entry(*args: Any, **kwargs: Any) -> Any:
            reason = supported(*args, **kwargs)
            if reason:
                raise UnsupportedError(f"{launch.__name__}: {reason}")
            return launch(*args, **kwargs)

        entry.unchecked = launch  # type: ignore[attr-defined]
        return entry
    return decorate
