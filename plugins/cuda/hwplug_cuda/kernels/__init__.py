"""Triton kernels of hwplug-cuda, one module per op, each with the op's exact signature.

Modules: ``norm`` (rms_norm), ``rotary`` (rotary_embedding), ``activation``
(silu_and_mul, gelu_and_mul), ``cache`` (reshape_and_cache), ``attention``
(paged_attention, dispatching to ``decode_attention`` and ``prefill_attention``) and
``configs`` (launch configs from ``configs.json``). Each op module has a
``supported(...)`` taking the op's arguments and returning why it cannot serve a call,
or None. Importing this package imports neither torch nor triton.
"""

#: Largest head size the attention kernels hold in registers.
MAX_HEAD_SIZE = 256
