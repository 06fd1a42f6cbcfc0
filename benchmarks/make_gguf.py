"""Random-weight GGUFs at real model shapes, and SmolLM2 re-quantised, by llama.cpp's quantizer.

A decode step's speed depends on a model's shapes and its weights' storage types, not on
their values, so random weights at a real model's shapes are a benchmark model (issue 25:
"CPU speed and memory on real-size models"). For every ``--shape`` (:data:`SHAPES`, the
real configs' numbers) this writes an F16 GGUF, one tensor in memory at a time, then
quantises it with llama.cpp's own quantizer (llama-cpp-python's ``llama_model_quantize``,
its default parameters and the ``LLAMA_FTYPE_MOSTLY_*`` type of each of ``--types``), and
deletes the F16 file unless ``--keep-f16`` (an 8B model's F16 file is 16 GB).
``--smollm2 TYPES`` does the same for the packaged SmolLM2-135M-Instruct (its Q4_1 GGUF
dequantised to F16 first, its metadata kept), for accuracy checks across types.

The files (in ``--out``, default /work/models)::

    <shape>-random-<TYPE>.gguf            e.g. qwen2.5-1.5b-random-Q4_K_M.gguf
    SmolLM2-135M-Instruct-<TYPE>.gguf

Contract of a random-shape file: ``general.architecture`` ``llama``, ``qwen2`` or ``qwen3``
with the sizes llama.cpp and hwplug read (context length, embedding length, block count,
feed-forward length, head counts, key/value length, RMS epsilon, rope base, vocabulary
size); llama.cpp's tensor names; weights ~N(0, 0.02) (seeded by ``--seed`` and the tensor's
index, so a file is the same on every run), norms 1, biases 0; no ``output.weight`` when the
real model ties its embeddings. Left out, as they change no speed: Llama 3's rope scaling
(``rope_freqs``) and Qwen's sliding-window settings (off in their configs anyway).
The tokenizer is SmolLM2's (``tokenizer.ggml.*`` copied: a GPT-2 style BPE of 49152 tokens
with its merges, BOS/EOS and chat template), padded to the shape's vocabulary with
``[PAD<i>]`` tokens of type UNUSED, as llama.cpp's own converter pads a vocabulary: both
llama.cpp and hwplug (through transformers' GGUF tokenizer) load it, every text encodes as
in SmolLM2, and the padding ids are never produced by the tokenizer but are real rows of
the embedding and LM head, so the matrices have the real shapes.

``--context-copy N`` also writes ``<file stem>.ctx<N>.gguf`` beside each output: a copy
whose ``<arch>.context_length`` is N, for an engine that sizes its KV cache by the
model's context (hwplug holds at least one whole-context sequence and checks it fits
before loading: 131072 tokens of Llama 3's are 28 GiB of float32 KV for the 3B).

Where a tensor's row length is not a multiple of 256 (SmolLM2's 576, Qwen2.5-0.5B's 896),
llama.cpp stores the K-quant and IQ types in its fallbacks (Q5_0, Q5_1, Q8_0, IQ4_NL):
each output file's tensor types are printed. Files that already exist are kept (``--force``
rewrites them). Nothing else is downloaded or needed beyond llama-cpp-python and gguf.

    python benchmarks/make_gguf.py --shape qwen2.5-1.5b --types Q4_K_M
    python benchmarks/make_gguf.py --all --types Q4_K_M,Q6_K --out /work/models
    python benchmarks/make_gguf.py --smollm2 Q4_K_M,Q5_K_M,Q6_K,Q3_K_M,Q2_K,IQ4_XS
    python benchmarks/make_gguf.py --shape llama-3.1-8b --context-copy 8192
    python benchmarks/make_gguf.py --shape qwen3-30b-a3b --layers 2 --types Q4_K_M

Mixture-of-experts shapes (``qwen3-30b-a3b``) are written as llama.cpp's converter writes a
``qwen3moe`` model: ``<arch>.expert_count``, ``expert_used_count`` and
``expert_feed_forward_length``, the router ``ffn_gate_inp`` (kept F32, which llama.cpp's
quantizer never quantises) and the experts stacked, ``ffn_{gate,up}_exps [E, I, H]`` and
``ffn_down_exps [E, H, I]``. ``--layers N`` keeps only the first N layers of a shape (every
other size real), named ``<shape>-<N>l-random-<TYPE>.gguf``: a 2-layer Qwen3-30B-A3B is
1.9B parameters, most of them its LM head and embedding.
"""

from __future__ import annotations

import argparse
import ctypes
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter, Keys, LlamaFileType
from gguf_tools import context_copy, quantize, type_counts, write_f16_copy, write_tensors

#: llama.cpp file types this script asks for (``F16``: the unquantised file itself).
FTYPES = {name: LlamaFileType[f"MOSTLY_{name}"] for name in (
    "F16", "Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q4_K_M", "Q4_K_S", "Q4_0", "Q4_1", "Q5_0",
    "Q3_K_M", "Q3_K_S", "Q3_K_L", "Q2_K", "IQ4_XS", "IQ4_NL")}
SMOLLM2_NAME = "SmolLM2-135M-Instruct"
#: Padding tokens' type (``gguf.TokenType.UNUSED``), as ``convert_hf_to_gguf.py`` pads.
UNUSED_TOKEN = 5
INIT_STD = 0.02
CHUNK_VALUES = 1 << 24  # random values drawn at a time (64 MiB of float32)
_QUIET_CALLBACK = None


@dataclass(frozen=True)
class Shape:
    """A real model's sizes (its Hugging Face ``config.json``)."""

    arch: str  # GGUF architecture: llama, qwen2, qwen3 or qwen3moe
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    rope_theta: float
    max_position: int
    rms_eps: float
    head_dim: int | None = None  # None: hidden // heads
    experts: int = 0  # routed experts (0: a dense model)
    experts_used: int = 0  # experts per token (top-k)
    expert_intermediate: int = 0  # each expert's intermediate size

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden // self.heads


#: name -> shape. Numbers from each model's config.json on the Hugging Face Hub:
#: (hidden, intermediate, layers, heads, kv heads, vocab, tie_word_embeddings, rope_theta,
#: max_position_embeddings, rms_norm_eps[, head_dim]).
SHAPES = {
    # meta-llama/Llama-3.2-1B(-Instruct): 2048, 8192, 16, 32, 8, 128256, true, 500000.0,
    # 131072, 1e-5, head_dim 64 (rope_scaling llama3 factor 32: left out)
    "llama-3.2-1b": Shape("llama", 2048, 8192, 16, 32, 8, 128256, True, 500000.0, 131072, 1e-5),
    # meta-llama/Llama-3.2-3B(-Instruct): 3072, 8192, 28, 24, 8, 128256, true, 500000.0,
    # 131072, 1e-5, head_dim 128 (rope_scaling llama3 factor 32: left out)
    "llama-3.2-3b": Shape("llama", 3072, 8192, 28, 24, 8, 128256, True, 500000.0, 131072, 1e-5),
    # meta-llama/Llama-3.1-8B(-Instruct): 4096, 14336, 32, 32, 8, 128256, false, 500000.0,
    # 131072, 1e-5 (rope_scaling llama3 factor 8: left out)
    "llama-3.1-8b": Shape("llama", 4096, 14336, 32, 32, 8, 128256, False, 500000.0, 131072,
                          1e-5),
    # Qwen/Qwen2.5-0.5B-Instruct: 896, 4864, 24, 14, 2, 151936, true, 1000000.0, 32768, 1e-6
    "qwen2.5-0.5b": Shape("qwen2", 896, 4864, 24, 14, 2, 151936, True, 1e6, 32768, 1e-6),
    # Qwen/Qwen2.5-1.5B-Instruct: 1536, 8960, 28, 12, 2, 151936, true, 1000000.0, 32768, 1e-6
    "qwen2.5-1.5b": Shape("qwen2", 1536, 8960, 28, 12, 2, 151936, True, 1e6, 32768, 1e-6),
    # Qwen/Qwen2.5-7B-Instruct: 3584, 18944, 28, 28, 4, 152064, false, 1000000.0, 32768, 1e-6
    "qwen2.5-7b": Shape("qwen2", 3584, 18944, 28, 28, 4, 152064, False, 1e6, 32768, 1e-6),
    # Qwen/Qwen3-4B: 2560, 9728, 36, 32, 8, 151936, true, 1000000, 40960, 1e-6, head_dim 128
    "qwen3-4b": Shape("qwen3", 2560, 9728, 36, 32, 8, 151936, True, 1e6, 40960, 1e-6, 128),
    # Qwen/Qwen3-30B-A3B: 2048, 6144, 48, 32, 4, 151936, false, 1000000.0, 40960, 1e-6,
    # head_dim 128, num_experts 128, num_experts_per_tok 8, moe_intermediate_size 768
    # (norm_topk_prob true; decoder_sparse_step 1, no mlp-only layers: every layer MoE)
    "qwen3-30b-a3b": Shape("qwen3moe", 2048, 6144, 48, 32, 4, 151936, False, 1e6, 40960, 1e-6,
                           128, experts=128, experts_used=8, expert_intermediate=768),
}


def tensor_specs(shape: Shape) -> list[tuple[str, tuple[int, ...]]]:
    """``(GGUF tensor name, numpy shape)`` of every tensor, in llama.cpp's order and naming
    (matrices ``[out, in]``)."""
    h, d, q, kv = shape.hidden, shape.head_size, shape.heads * shape.head_size, \
        shape.kv_heads * shape.head_size
    specs: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (shape.vocab, h))]
    for i in range(shape.layers):
        b = f"blk.{i}."
        specs += [(b + "attn_norm.weight", (h,)), (b + "attn_q.weight", (q, h)),
                  (b + "attn_k.weight", (kv, h)), (b + "attn_v.weight", (kv, h))]
        if shape.arch == "qwen2":
            specs += [(b + "attn_q.bias", (q,)), (b + "attn_k.bias", (kv,)),
                      (b + "attn_v.bias", (kv,))]
        if shape.arch in ("qwen3", "qwen3moe"):
            specs += [(b + "attn_q_norm.weight", (d,)), (b + "attn_k_norm.weight", (d,))]
        specs += [(b + "attn_output.weight", (h, q)), (b + "ffn_norm.weight", (h,))]
        if shape.experts:
            e, i_exp = shape.experts, shape.expert_intermediate
            specs += [(b + "ffn_gate_inp.weight", (e, h)),
                      (b + "ffn_gate_exps.weight", (e, i_exp, h)),
                      (b + "ffn_up_exps.weight", (e, i_exp, h)),
                      (b + "ffn_down_exps.weight", (e, h, i_exp))]
        else:
            specs += [(b + "ffn_gate.weight", (shape.intermediate, h)),
                      (b + "ffn_up.weight", (shape.intermediate, h)),
                      (b + "ffn_down.weight", (h, shape.intermediate))]
    specs.append(("output_norm.weight", (h,)))
    if not shape.tied:
        specs.append(("output.weight", (shape.vocab, h)))
    return specs


def stored_dtype(name: str, dims: tuple[int, ...]) -> np.dtype:
    """The F16 file's type of tensor ``name``: float32 for vectors and the MoE router
    (``ffn_gate_inp``, as llama.cpp's converter keeps it), float16 for other matrices."""
    router = name.endswith("ffn_gate_inp.weight")
    return np.dtype(np.float16 if len(dims) >= 2 and not router else np.float32)


def random_tensor(name: str, dims: tuple[int, ...], seed: int, index: int) -> np.ndarray:
    """The tensor ``name``: norms 1 and biases 0 (float32), matrices and expert stacks
    ~N(0, INIT_STD) in :func:`stored_dtype`, drawn in chunks so only the result and one
    chunk are in memory."""
    if len(dims) == 1:
        return np.zeros(dims, np.float32) if name.endswith(".bias") else np.ones(dims, np.float32)
    rng = np.random.default_rng([seed, index])
    out = np.empty(dims, stored_dtype(name, dims))
    flat = out.reshape(-1)
    for start in range(0, flat.size, CHUNK_VALUES):
        chunk = rng.standard_normal(min(CHUNK_VALUES, flat.size - start), dtype=np.float32)
        flat[start:start + chunk.size] = chunk * INIT_STD
    return out


def tokenizer_fields(reader: GGUFReader, vocab: int) -> list[tuple[str, object, GGUFValueType,
                                                                    GGUFValueType | None]]:
    """``reader``'s ``tokenizer.*`` fields, the token list (and its types) padded to
    ``vocab`` tokens with ``[PAD<i>]`` tokens of type UNUSED."""
    fields = []
    for field in reader.fields.values():
        if not field.name.startswith("tokenizer."):
            continue
        value = field.contents()
        if field.name == "tokenizer.ggml.tokens":
            if len(value) > vocab:
                raise ValueError(f"the tokenizer has {len(value)} tokens, more than the "
                                 f"shape's vocabulary of {vocab}")
            value = value + [f"[PAD{i}]" for i in range(len(value), vocab)]
        elif field.name == "tokenizer.ggml.token_type":
            value = value + [UNUSED_TOKEN] * (vocab - len(value))
        sub_type = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        fields.append((field.name, value, field.types[0], sub_type))
    return fields


def write_random_f16(name: str, shape: Shape, tokenizer: GGUFReader, out: Path,
                     seed: int) -> None:
    """Write the F16 GGUF of shape ``name`` to ``out`` (module docstring: its contract)."""
    arch = shape.arch
    writer = GGUFWriter(out, arch)
    writer.add_name(f"random {name}")
    writer.add_file_type(LlamaFileType.MOSTLY_F16)
    writer.add_quantization_version(2)
    for key, value in ((Keys.LLM.CONTEXT_LENGTH, shape.max_position),
                       (Keys.LLM.EMBEDDING_LENGTH, shape.hidden),
                       (Keys.LLM.BLOCK_COUNT, shape.layers),
                       (Keys.LLM.FEED_FORWARD_LENGTH, shape.intermediate),
                       (Keys.Attention.HEAD_COUNT, shape.heads),
                       (Keys.Attention.HEAD_COUNT_KV, shape.kv_heads),
                       (Keys.Attention.KEY_LENGTH, shape.head_size),
                       (Keys.Attention.VALUE_LENGTH, shape.head_size),
                       (Keys.Rope.DIMENSION_COUNT, shape.head_size),
                       (Keys.LLM.VOCAB_SIZE, shape.vocab)):
        writer.add_uint32(key.format(arch=arch), value)
    if shape.experts:
        for key, value in ((Keys.LLM.EXPERT_COUNT, shape.experts),
                           (Keys.LLM.EXPERT_USED_COUNT, shape.experts_used),
                           (Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, shape.expert_intermediate)):
            writer.add_uint32(key.format(arch=arch), value)
    writer.add_float32(Keys.Attention.LAYERNORM_RMS_EPS.format(arch=arch), shape.rms_eps)
    writer.add_float32(Keys.Rope.FREQ_BASE.format(arch=arch), shape.rope_theta)
    for key, value, value_type, sub_type in tokenizer_fields(tokenizer, shape.vocab):
        writer.add_key_value(key, value, value_type, sub_type=sub_type)
    specs = tensor_specs(shape)
    for tensor_name, dims in specs:
        dtype = stored_dtype(tensor_name, dims)
        writer.add_tensor_info(tensor_name, dims, dtype, int(np.prod(dims)) * dtype.itemsize)
    write_tensors(writer, (random_tensor(n, dims, seed, i) for i, (n, dims) in enumerate(specs)))


def make_model(stem: str, types: list[str], out_dir: Path, write_f16, f16_bytes: int,
               args: argparse.Namespace) -> None:
    """Write ``<stem>-F16.gguf`` with ``write_f16(path)`` (unless every requested file
    exists), quantise it into ``<stem>-<TYPE>.gguf`` for each of ``types``, and delete it
    unless ``--keep-f16`` or F16 is one of ``types``."""
    f16 = out_dir / f"{stem}-F16.gguf"
    wanted = [t for t in types if t != "F16"]
    todo = [t for t in wanted if args.force or not (out_dir / f"{stem}-{t}.gguf").exists()]
    keep = args.keep_f16 or "F16" in types
    if f16.exists() and not args.force:
        print(f"{f16.name}: exists, reused")
    elif todo or keep:
        free = shutil.disk_usage(out_dir).free
        if free < f16_bytes * 1.5:
            raise SystemExit(f"{out_dir}: {free / 2**30:.1f} GiB free, {f16.name} needs "
                             f"{f16_bytes / 2**30:.1f} GiB and its quantised copies more")
        started = time.perf_counter()
        staging = f16.with_name(f".{f16.name}.tmp")
        write_f16(staging)
        staging.replace(f16)
        print(f"{f16.name}: written, {f16.stat().st_size / 2**30:.2f} GiB "
              f"({time.perf_counter() - started:.0f} s)", flush=True)
    for type_name in wanted:
        target = out_dir / f"{stem}-{type_name}.gguf"
        if type_name in todo:
            started = time.perf_counter()
            staging = target.with_name(f".{target.name}.tmp")
            quantize(f16, staging, type_name, args.threads)
            staging.replace(target)
            print(f"{target.name}: quantised in {time.perf_counter() - started:.0f} s", end="")
        else:
            print(f"{target.name}: exists, kept", end="")
        print(f", {target.stat().st_size / 2**30:.2f} GiB; tensors: {type_counts(target)}",
              flush=True)
        if args.context_copy:
            copy = context_copy(target, args.context_copy, args.force)
            print(f"{copy.name}: the same with context length {args.context_copy}", flush=True)
    if not keep and f16.exists():
        f16.unlink()
        print(f"{f16.name}: deleted (--keep-f16 keeps it)")


def parse_types(text: str) -> list[str]:
    """``"Q4_K_M,Q6_K"`` -> ``["Q4_K_M", "Q6_K"]``, each a key of :data:`FTYPES`."""
    types = [t.strip().upper() for t in text.split(",") if t.strip()]
    unknown = [t for t in types if t not in FTYPES]
    if unknown or not types:
        raise argparse.ArgumentTypeError(f"unknown type(s) {unknown}; known: {', '.join(FTYPES)}")
    return types


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", choices=sorted(SHAPES), default=[],
                        help="a real model's shape (repeatable)")
    parser.add_argument("--all", action="store_true", help="every shape in the table")
    parser.add_argument("--types", type=parse_types, default=["Q4_K_M"],
                        help="llama.cpp types for the random shapes, comma-separated "
                             "(default Q4_K_M)")
    parser.add_argument("--smollm2", type=parse_types, metavar="TYPES",
                        help="re-quantise the packaged SmolLM2-135M-Instruct into these types")
    parser.add_argument("--out", type=Path, default=Path("/work/models"))
    parser.add_argument("--keep-f16", action="store_true", help="keep the F16 files")
    parser.add_argument("--context-copy", type=int, metavar="N",
                        help="also write a copy of each file with context length N")
    parser.add_argument("--layers", type=int, metavar="N",
                        help="keep only the first N layers of each shape (file name "
                             "<shape>-<N>l-random-<TYPE>.gguf)")
    parser.add_argument("--force", action="store_true", help="rewrite files that exist")
    parser.add_argument("--seed", type=int, default=0, help="random weights' seed")
    parser.add_argument("--threads", type=int, default=2, help="quantizer threads")
    parser.add_argument("--verbose", action="store_true", help="keep llama.cpp's log")
    args = parser.parse_args()
    if args.all:
        args.shape = list(SHAPES)
    if not args.shape and not args.smollm2:
        parser.error("nothing to do: give --shape, --all or --smollm2")
    if args.layers is not None and args.layers < 1:
        parser.error(f"--layers must be at least 1, not {args.layers}")
    return args


def _quiet(level: int, text: bytes, user_data: int) -> None:
    """Drop llama.cpp's log (the quantizer prints a line per tensor)."""


def main() -> int:
    args = parse_args()
    from hwplug.model_zoo.loaders import resolve_model  # the packaged SmolLM2 GGUF

    if not args.verbose:
        import llama_cpp

        global _QUIET_CALLBACK  # kept alive while llama.cpp may call it
        _QUIET_CALLBACK = llama_cpp.llama_log_callback(_quiet)
        llama_cpp.llama_log_set(_QUIET_CALLBACK, ctypes.c_void_p(0))
    args.out.mkdir(parents=True, exist_ok=True)
    smollm2 = resolve_model(None)
    tokenizer = GGUFReader(smollm2)
    for name in dict.fromkeys(args.shape):
        shape = SHAPES[name]
        if args.layers is not None:
            shape = replace(shape, layers=args.layers)
            name = f"{name}-{args.layers}l"
        f16_bytes = sum(int(np.prod(d)) * stored_dtype(n, d).itemsize
                        for n, d in tensor_specs(shape))
        print(f"{name}: {shape}, {f16_bytes / 2 * 1e-9:.2f}B parameters", flush=True)
        make_model(f"{name}-random", args.types, args.out,
                   lambda path, n=name, s=shape: write_random_f16(n, s, tokenizer, path,
                                                                   args.seed),
                   f16_bytes, args)
    if args.smollm2:
        elements = sum(int(t.n_elements) for t in tokenizer.tensors)
        make_model(SMOLLM2_NAME, args.smollm2, args.out,
                   lambda path: write_f16_copy(smollm2, path), 2 * elements, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
