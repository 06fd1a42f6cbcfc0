"""hwplug hooks of the built-in CPU platform: the kernel variants it adds over the references.

Loaded like any plugin (entry point ``cpu`` of group ``hwplug.plugins`` in hwplug's own
distribution). Every variant is declared for the ``cpu`` platform, so it also serves
platforms of the ``cpu`` family (hwplug-cpu-arm); what needs more than "a CPU" says so as
device features (oneDNN's packed linear is validated on x86 only, its bf16 path needs
bf16 arithmetic).
"""

from __future__ import annotations

from typing import Any

from hwplug.dtypes import FLOAT_DTYPES
from hwplug.hookspecs import hookimpl
from hwplug.quantization import ScaleDescriptor

hwplug_api_version = ">=1,<2"
hwplug_order = -100  # before every third-party plugin, so they may override

_KERNELS = "hwplug.platforms.cpu.kernels:"
_LINEAR = "hwplug.platforms.cpu.onednn:linear"
_INT8 = "hwplug.platforms.cpu.int8:"
_ONEDNN = "oneDNN matmul on a weight reordered once into its blocked layout"
_GGML = "hwplug.platforms.cpu.ggml.ops:"
#: How the C ggml_linear kernels round activations: int8 per 256 values for the K-quants
#: (llama.cpp's Q8_K), int16 or int8 per 32 for the rest (Q8_0); the coarsest bounds all.
GGML_ACTIVATIONS = ScaleDescriptor("int8", "group", dynamic=True, group_shape=(1, 256))
#: The C kernel over GGUF blocks (its library, each variant's ``native``, built when first
#: bound or by ``hwplug build``): name -> (build, features, priority).
_GGML_BUILDS = {"ggml_vnni": ("VNNI", ("x86_64", "avx2", "fma", "f16c", "avx512bw",
                                       "avx512vl", "avx512_vnni"), 15),
                "ggml_avx2": ("AVX2", ("x86_64", "avx2", "fma", "f16c"), 10),
                "ggml_c": ("PORTABLE", (), 5)}
_FUSED = "hwplug.platforms.cpu.fused.ops:"
#: The fused C kernels of a decode step's small ops (built like the GGUF kernel): name ->
#: (build, features, priority), above the torch variants (priority 10) that they beat
#: (benchmarks/cpu_small_ops.py).
_FUSED_BUILDS = {"fused_avx2": ("AVX2", ("x86_64", "avx2", "fma", "f16c"), 30),
                 "fused_c": ("PORTABLE", (), 20)}
#: op -> (the FusedKernels op, its supports function, what it does).
_FUSED_OPS = {
    "rms_norm": ("rms_norm", "rms_norm_supported",
                 "one pass per row: residual add, sum of squares, scaled output"),
    "silu_and_mul": ("silu_and_mul", "silu_and_mul_supported", "one pass, vectorized exp"),
    "rotary_embedding": ("rotary_embedding", "rotary_supported",
                         "cos/sin rows read in place, query and key in one call"),
    "paged_attention": ("paged_attention", "decode_supported",
                        "causal, one decode row per query (prefill too, so a row's numbers "
                        "do not depend on its step): walks the block tables (no gather), "
                        "online softmax, a KV head's query heads together, OpenMP over "
                        "(row, KV head)"),
    "reshape_and_cache": ("reshape_and_cache", "cache_write_supported",
                          "every slot checked, then one memcpy per key and value row"),
}
_MOE = "hwplug.platforms.cpu.moe:"
_FUSED_MOE = "hwplug.platforms.cpu.fused_moe.ops:"
_GGML_MOE = "hwplug.platforms.cpu.ggml_moe:"
_COMPOSED = "hwplug.kernel_registry.moe_compose:"
_GROUPED = "tokens grouped by expert, one MLP per active expert (experts without tokens "
#: The variants hwplug adds over the references on CPUs (register_variant arguments). The
#: C ops' impls are their methods' ``unchecked`` forms: the registry asks ``supports``
#: before each call (:mod:`hwplug.platforms.cpu.checked_op`).
CPU_VARIANTS: list[dict[str, Any]] = [
    dict(op="linear", name="onednn_packed", impl=_LINEAR, dtypes=("float32",),
         features=("x86_64",), description=_ONEDNN),
    dict(op="linear", name="onednn_packed_bf16", impl=_LINEAR, dtypes=("bfloat16",),
         features=("x86_64", "bf16"), description=_ONEDNN + " (bf16 arithmetic)"),
    dict(op="linear", name="bf16_storage", impl="hwplug.platforms.cpu.bf16:linear",
         dtypes=("bfloat16",), priority=-10,
         description="bf16 weights, fp32 arithmetic: torch's GEMV below 8 rows, then fp32 "
                     "tiles of the weight through the fp32 linear op"),
    # above oneDNN (SmolLM2's GEMMs, 2-core AVX2 EPYC; benchmarks/fp32_linear.py): one row
    # streams the weight at 30-50 GB/s, 1.6-2.8x oneDNN's speed; 2-8 rows 1.0-2.2x; 32 rows
    # 1.1-1.2x and 1024 rows 1.0-1.1x with the outer-product tiles that the batch-invariant
    # dot tiles replaced (those take 1.1-1.4x their time: about oneDNN's from 9 rows, kept
    # for one summation order whatever the rows); no packed second copy of the weight; and
    # C, so a decode step can be a step graph
    *(dict(op="linear", name=name, impl=_FUSED + "AVX2.linear.unchecked", num_tokens=tokens,
           supports=_FUSED + "linear_supported", native=_FUSED + "AVX2", dtypes=("float32",),
           features=("x86_64", "avx2", "fma", "f16c"), priority=priority, description=description)
      for name, tokens, priority, description in (
          ("gemv_avx2", (1, 2), 20, "C (avx2): one activation row; each thread streams its "
                                    "contiguous weight rows"),
          ("gemm_avx2", (2, None), 19, "C (avx2): 2-8 rows in one pass over the weight, "
                                       "more in 4 x 3 dot-product tiles; every output "
                                       "summed in the one-row order (batch-invariant)"))),
    # one C call each, so a MoE decode step replays as a step graph (routing stays in C);
    # before the grouped variants: explicit fallback order C, then torch-op grouping
    *(dict(op="moe_topk", name=name, impl=f"{_FUSED_MOE}{build}.moe_topk.unchecked",
           supports=_FUSED_MOE + "topk_supported", native=_FUSED_MOE + build,
           dtypes=FLOAT_DTYPES, features=features, priority=priority,
           description=f"C ({build.lower()}): softmax, top-k and renormalisation in one call "
                       "(other scorings: the reference)")
      for name, (build, features, priority) in _FUSED_BUILDS.items()),
    *(dict(op="moe_experts", name=name, impl=f"{_FUSED_MOE}{build}.moe_experts.unchecked",
           supports=_FUSED_MOE + "experts_supported", native=_FUSED_MOE + build,
           dtypes=("float32",), features=features, priority=priority, num_tokens=(1, 17),
           description=f"C ({build.lower()}): one call; pairs grouped by expert, each active "
                       "expert's rows read once for its tokens (OpenMP over rows), slots "
                       "summed per token (batch-invariant); above 16 tokens the grouped "
                       "variant's GEMMs")
      for name, (build, features, priority) in _FUSED_BUILDS.items()),
    dict(op="moe_experts", name="grouped", impl=_MOE + "moe_experts",
         supports=_MOE + "experts_supported", dtypes=FLOAT_DTYPES,
         description=_GROUPED + "skipped) through the linear op"),
    dict(op="fused_moe", name="grouped", impl=_COMPOSED + "fused_moe",
         supports=_COMPOSED + "fused_supported", dtypes=FLOAT_DTYPES,
         description="the moe_topk and moe_experts ops, shared experts through linear"),
    *(dict(op="ggml_moe_experts", name=name.replace("ggml", "grouped"),
           impl=f"{_GGML_MOE}{build}", supports=_GGML_MOE + "experts_supported",
           features=features, native=_GGML + build, dtypes=FLOAT_DTYPES, priority=priority,
           description=_GROUPED + f"skipped) through C ({build.lower()}) ggml_linear on the "
                       "quantized rows: one call per active expert for gate and up, one for "
                       "down, one activation over all rows")
      for name, (build, features, priority) in _GGML_BUILDS.items()),
    # each just above the grouped variant over the same GGUF build
    *(dict(op="ggml_moe_experts", name=name.replace("ggml", "fused"),
           impl=f"{_FUSED_MOE}GGUF_{build}.experts.unchecked",
           supports=_FUSED_MOE + "gguf_experts_supported", native=f"{_FUSED_MOE}GGUF_{build}",
           features=features, dtypes=("float32",), priority=priority + 2,
           description=f"C ({build.lower()}): one call for up to 16 tokens; rows grouped by "
                       "expert in C, ggml_linear per active expert (gate and up, then down), "
                       "slots summed per token")
      for name, (build, features, priority) in _GGML_BUILDS.items()),
    # GGUF F32 rows (MoE routers): the fp32 C GEMV, so a GGUF MoE decode step is all C;
    # after the GGUF builds, which take every quantized call first (one supports each)
    dict(op="ggml_linear", name="f32_rows_avx2", impl=_FUSED_MOE + "f32_rows_linear",
         supports=_FUSED_MOE + "f32_rows_supported", native=_FUSED + "AVX2",
         dtypes=("float32",), features=_FUSED_BUILDS["fused_avx2"][1], priority=4,
         description="C (avx2): GGUF F32 rows (MoE routers) through the fp32 linear"),
    dict(op="fp8_moe_experts", name="grouped", impl=_MOE + "fp8_moe_experts",
         dtypes=FLOAT_DTYPES,
         description=_GROUPED + "skipped); each active expert's fp8 tiles dequantized to "
                     "fp32 (bit moves, exact) when it runs, then the fp32 linear op"),
    dict(op="int8_moe_experts", name="grouped", impl=_MOE + "int8_moe_experts",
         dtypes=FLOAT_DTYPES,
         description=_GROUPED + "skipped); rows quantized per token, the scaled_mm op on "
                     "the int8 experts"),
    dict(op="mla_attention", name="absorbed",
         impl="hwplug.kernel_registry.reference.mla:mla_absorbed", num_tokens=(1, 17),
         dtypes=FLOAT_DTYPES,
         description="the absorbed form for up to 16 tokens (decode batches, verify steps, "
                     "short chunks): W_UK folded into the query, SDPA on the latents as one "
                     "KV head, W_UV after; no context expanded per head"),
    dict(op="rms_norm", name="torch_fused", impl=_KERNELS + "rms_norm", dtypes=FLOAT_DTYPES,
         description="torch's fused F.rms_norm"),
    dict(op="rotary_embedding", name="torch_fused", impl=_KERNELS + "rotary_embedding",
         dtypes=FLOAT_DTYPES,
         description="x * cos + swap(x) * sin, cos/sin expanded once per call"),
    dict(op="reshape_and_cache", name="index_copy", impl=_KERNELS + "reshape_and_cache",
         supports=_KERNELS + "cache_supported", dtypes=FLOAT_DTYPES,
         description="one index_copy_ per half of the cache"),
    dict(op="scaled_mm", name="int_mm", impl=_INT8 + "int_mm", supports=_INT8 + "int_mm_supported",
         dtypes=("int8",), features=("avx512_vnni",),
         description="torch._int_mm: int8 x int8 -> int32, then per-token/per-channel scales"),
    dict(op="scaled_mm", name="int8_weight_only", impl=_INT8 + "weight_only",
         supports=_INT8 + "weight_only_supported", dtypes=("bfloat16",),
         description="torch._weight_int8pack_mm: bf16 activations, int8 per-channel weights"),
    # fp32 only: torch's CPU SDPA is several times slower in bf16 than the reference
    dict(op="paged_attention", name="sdpa_decode", impl=_KERNELS + "decode_attention",
         supports=_KERNELS + "decode_supported", dtypes=("float32",),
         description="decode batches up to 16 MiB of K/V: gather the blocks, one SDPA call"),
    *(dict(op="ggml_linear", name=name, impl=f"{_GGML}{build}.linear.unchecked", features=features,
           supports=_GGML + "linear_supported", native=_GGML + build, dtypes=FLOAT_DTYPES,
           priority=priority, activation_quantization=GGML_ACTIVATIONS,
           description=f"C ({build.lower()}): integer dot products on the GGUF blocks "
                       "(activations int8 per 256 for the K-quants and IQ4_XS, int16 or int8 "
                       "per 32 for the rest, as tuned); past a tuned row count, fp32 tiles of "
                       "the weight through torch's GEMM")
      for name, (build, features, priority) in _GGML_BUILDS.items()),
    # the VNNI build's 16-row groups on Q4_K / Q5_K / Q6_K / IQ4_XS weights repacked once at
    # load (fp32 only: the model's activations); the GGUF quant method repacks where these
    # are bound
    dict(op="ggml_repack", name="ggml_vnni", impl=_GGML + "VNNI.repack.unchecked",
         features=_GGML_BUILDS["ggml_vnni"][1], supports=_GGML + "repack_supported",
         native=_GGML + "VNNI", dtypes=("uint8",), priority=15,
         description="C (vnni): 16-row groups' words interleaved, OpenMP over the groups"),
    dict(op="ggml_linear_repacked", name="ggml_vnni", impl=_GGML + "VNNI.linear_repacked.unchecked",
         features=_GGML_BUILDS["ggml_vnni"][1], supports=_GGML + "repacked_supported",
         native=_GGML + "VNNI", dtypes=("float32",), priority=15,
         activation_quantization=GGML_ACTIVATIONS,
         description="C (vnni): integer dots on 16 repacked rows at a time, at every row "
                     "count (bitwise ggml_vnni's ggml_linear on the rows)"),
    # the lookup of a tied table repacked for its LM head (one copy held)
    dict(op="ggml_embedding_repacked", name="ggml_vnni",
         impl=_GGML + "VNNI.embedding_repacked.unchecked", features=_GGML_BUILDS["ggml_vnni"][1],
         supports=_GGML + "embedding_repacked_supported", native=_GGML + "VNNI", priority=15,
         description="C (vnni): each row read from its lane of its repacked group"),
    *(dict(op="ggml_embedding", name=name, impl=f"{_GGML}{build}.embedding.unchecked", features=features,
           supports=_GGML + "embedding_supported", native=_GGML + build, priority=priority,
           description=f"C ({build.lower()}): dequantizes the rows it reads")
      for name, (build, features, priority) in _GGML_BUILDS.items()),
    # torch's lookup is as fast; a C call lets a float model's decode step be a step graph
    *(dict(op="embedding", name=name, impl=f"{_GGML}{build}.lookup.unchecked", features=features,
           supports=_GGML + "lookup_supported", native=_GGML + build, priority=priority,
           description=f"C ({build.lower()}): copies the fp32 rows it reads")
      for name, (build, features, priority) in _GGML_BUILDS.items()),
    *(dict(op=op, name=name, impl=f"{_FUSED}{build}.{method}.unchecked", supports=_FUSED + supported,
           native=_FUSED + build, dtypes=("float32",), features=features, priority=priority,
           description=f"C ({build.lower()}): {what}")
      for op, (method, supported, what) in _FUSED_OPS.items()
      for name, (build, features, priority) in _FUSED_BUILDS.items()),
]


@hookimpl
def hwplug_register_kernels(registry: Any) -> None:
    for variant in CPU_VARIANTS:
        registry.register_variant(**{"platforms": ("cpu",), "priority": 10, **variant})
