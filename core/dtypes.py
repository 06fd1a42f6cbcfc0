"""dtype names hwplug speaks, their torch dtypes, and the ``auto`` model dtype.

dtypes are named as strings (``"bfloat16"``) so platform and backend classes can state
them without importing torch; :func:`torch_dtype` converts when torch is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hwplug.errors import UnsupportedError

if TYPE_CHECKING:
    import torch

__all__ = ["AUTO", "DTYPE_NAMES", "FLOAT_DTYPES", "FNUZ_DTYPES", "FNUZ_FEATURE", "FP8_KV_DTYPES", "INT_DTYPES",
           "auto_dtype", "dtype_name", "is_quantized_kv_cache", "named_torch_dtype",
           "torch_dtype"]

#: Floating dtypes a model can compute in.
FLOAT_DTYPES = ("float32", "bfloat16", "float16")
#: One-byte float dtypes a KV cache can store (with k/v scales): the quantized KV caches,
#: in the OCP formats (torch ``float8_e4m3fn`` / ``float8_e5m2``).
FP8_KV_DTYPES = ("fp8_e4m3", "fp8_e5m2")
#: The fnuz fp8 format (torch ``float8_e4m3fnuz``: no infinities, no negative zero, one
#: NaN, exponent bias 8, largest 240), which AMD's gfx942 (MI300) computes in: its fp8
#: weights (OCP e4m3 checkpoints converted, scales doubled) and fp8 KV caches.
FNUZ_DTYPES = ("fp8_e4m3fnuz",)
#: The device feature (``DeviceFacts.features``) of a platform whose fp8 is fnuz: fp8
#: weights and KV caches there are :data:`FNUZ_DTYPES`.
FNUZ_FEATURE = "fp8-fnuz"
#: Integer dtypes quantized weights and activations are stored in (uint8: GGUF blocks, the
#: ``ggml_repack`` op's input and output).
INT_DTYPES = ("int8", "uint8")
#: dtype names hwplug understands: compute, KV caches, quantized tensors.
DTYPE_NAMES = (*FLOAT_DTYPES, *FP8_KV_DTYPES, *INT_DTYPES, *FNUZ_DTYPES)
#: The model dtype that lets the platform choose (see :func:`auto_dtype`).
AUTO = "auto"
_TORCH_NAMES = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2",
                "fp8_e4m3fnuz": "float8_e4m3fnuz"}
_ALIASES = {"float": "float32", "half": "float16", "bf16": "bfloat16", "fp32": "float32",
            "fp16": "float16"}
#: Compute dtypes a checkpoint stored in a dtype may run in without losing what it stores:
#: float32 weights run in anything; bfloat16 and float16 in themselves or float32
#: (bfloat16 <-> float16 casts lose range or precision).
_RUNS_IN = {"float32": FLOAT_DTYPES, "bfloat16": ("bfloat16", "float32"),
            "float16": ("float16", "float32")}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a hwplug dtype name (``"fp8_e4m3"`` -> ``torch.float8_e4m3fn``)."""
    import torch

    if name not in DTYPE_NAMES:
        raise UnsupportedError(f"unknown dtype {name!r}; known: {', '.join(DTYPE_NAMES)}")
    return getattr(torch, _TORCH_NAMES.get(name, name))


def named_torch_dtype(name: str) -> torch.dtype | None:
    """The torch dtype a dispatch key names: hwplug's names (:func:`torch_dtype`) and torch's
    own for the rest (``"int64"``); None for a name torch does not have."""
    import torch

    found = getattr(torch, _TORCH_NAMES.get(name, name), None)
    return found if isinstance(found, torch.dtype) else None


def dtype_name(dtype: Any) -> str:
    """The hwplug name of a torch dtype or a dtype name string."""
    text = str(dtype).removeprefix("torch.")
    reverse = {v: k for k, v in _TORCH_NAMES.items()}
    text = reverse.get(text, _ALIASES.get(text, text))
    if text not in DTYPE_NAMES:
        raise UnsupportedError(f"unsupported dtype {dtype!r}; known: {', '.join(DTYPE_NAMES)}")
    return text


def is_quantized_kv_cache(kv_cache_dtype: str | None) -> bool:
    """Whether a KV cache of this dtype is quantized (stored with k/v scales): fp8 only
    (OCP or fnuz); bfloat16, float16 and float32 caches are not."""
    return kv_cache_dtype in FP8_KV_DTYPES or kv_cache_dtype in FNUZ_DTYPES


def auto_dtype(platform_dtypes: Sequence[str], checkpoint_dtype: str | None) -> str:
    """The model dtype ``auto`` stands for: the first of ``platform_dtypes`` (best first)
    that a checkpoint stored in ``checkpoint_dtype`` may run in (None: no constraint).

    Raises :class:`UnsupportedError` naming both lists when none qualifies.
    """
    allowed = _RUNS_IN.get(checkpoint_dtype or "float32", FLOAT_DTYPES)
    for name in platform_dtypes:
        if name in allowed:
            return name
    raise UnsupportedError(f"no dtype the platform supports ({', '.join(platform_dtypes)}) can "
                           f"hold a {checkpoint_dtype} checkpoint ({', '.join(allowed)})")
