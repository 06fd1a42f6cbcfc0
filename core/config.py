"""``EngineConfig``: the settings a platform settles before a model is built."""

from __future__ import annotations

from dataclasses import dataclass

from hwplug.dtypes import AUTO


@dataclass
class EngineConfig:
    """What the runner asks of a platform; ``check_and_update_config`` fills the rest.

    Attention geometry comes from the model. ``dtype`` ``"auto"`` becomes the platform's
    best dtype that a checkpoint stored in ``checkpoint_dtype`` allows; ``block_size``,
    ``kv_cache_dtype`` and ``attention_backend`` may be left None. All are settled once,
    at configuration time.
    """

    num_heads: int
    num_kv_heads: int
    head_size: int
    dtype: str = AUTO
    checkpoint_dtype: str | None = None
    kv_cache_dtype: str | None = None
    block_size: int | None = None
    attention_backend: str | None = None
    causal: bool = True
    sliding_window: int | None = None
    soft_cap: float | None = None
    #: fp8 KV caches: compute the k/v scales from the first batch instead of taking the
    #: checkpoint's (or 1.0), per KV head (``"head"``) or per layer (``"tensor"``).
    calculate_kv_scales: bool = False
    kv_scale_granularity: str = "tensor"
    #: Multi-head latent attention (DeepSeek-V2/V3): the cache holds one latent "head" per
    #: token (``num_kv_heads`` 1, ``head_size`` = ``kv_lora_rank + qk_rope_head_dim``),
    #: served by a backend whose ``is_mla`` is True.
    is_mla: bool = False
