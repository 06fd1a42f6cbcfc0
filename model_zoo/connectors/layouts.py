"""Converters between the KV-cache layouts hwplug knows (see
:func:`hwplug.connector.register_layout_converter`).

``NHD``: one layer's blocks ``[2, n, block_size, num_kv_heads, head_size]``; ``HND``:
``[2, n, num_kv_heads, block_size, head_size]`` (heads before tokens, as paged kernels
that read one head's tokens contiguously want). Both keep K/V first and blocks second,
so a converter only reorders the last three dimensions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from hwplug.connector import KVLayout


def swap_tokens_and_heads(blocks: torch.Tensor, source: KVLayout, target: KVLayout
                          ) -> torch.Tensor:
    """``NHD`` blocks as ``HND`` and back: the token and head dimensions swapped."""
    return blocks.transpose(-3, -2).contiguous()


#: (source layout, target layout) -> converter, registered by the model zoo's plugin.
CONVERTERS = {
    ("NHD", "HND"): "hwplug.model_zoo.connectors.layouts:swap_tokens_and_heads",
    ("HND", "NHD"): "hwplug.model_zoo.connectors.layouts:swap_tokens_and_heads",
}
