"""The hwplug runner of ``benchmarks/cpu_vs_llamacpp.py`` (protocol: :mod:`runner`).

Options: ``dtype``, ``dequantize`` and ``step_graphs`` (default True), given to
``hwplug.LLM`` for ``model`` (a GGUF path; absent or None: the default model,
SmolLM2-135M-Instruct's Q4_1 GGUF): ``dequantize=False`` keeps the GGUF's blocks (quant
method ``gguf``). ``kv_tokens`` (optional) sizes the KV cache to that many tokens in
blocks of :data:`BLOCK_SIZE` (the CPU backend's own choice), instead of hwplug's default,
which holds at least one sequence of the model's whole context (131072 tokens for Llama
3: 34 GB of float32 KV for Llama-3.1-8B). The platform's process environment is applied
before torch loads, as ``hwplug generate`` does; torch gets ``threads`` threads.
"""

from __future__ import annotations

from typing import Any

from runner import serve

import hwplug

#: KV block size when ``kv_tokens`` sizes the cache.
BLOCK_SIZE = 16


class HwplugEngine:
    """``hwplug.LLM`` behind the runner protocol."""

    def __init__(self, options: dict[str, Any], threads: int, max_batch: int) -> None:
        hwplug.current_platform().apply_process_env()  # before torch loads
        import torch

        torch.set_num_threads(threads)
        kv = {}
        if options.get("kv_tokens"):
            kv = {"block_size": BLOCK_SIZE,
                  "num_kv_blocks": -(-int(options["kv_tokens"]) // BLOCK_SIZE) + max_batch}
        self.llm = hwplug.LLM(options.get("model"), dtype=options["dtype"],
                              dequantize=options["dequantize"], max_num_seqs=max_batch,
                              step_graphs=options.get("step_graphs", True), **kv)

    def generate(self, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        sampling = hwplug.SamplingParams(max_tokens=new_tokens, temperature=0,
                                         ignore_eos=True)
        return [output.outputs[0].token_ids for output in self.llm.generate(prompts, sampling)]

    def describe(self) -> dict[str, Any]:
        import torch

        return {
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "platform": self.llm.platform, "dtype": self.llm.dtype,
            "attention_backend": self.llm.attention_backend,
            "quant_method": self.llm.ctx.quant_method.get_name(),
            "block_size": self.llm.config.block_size,
            "num_kv_blocks": self.llm.config.num_kv_blocks,
            "weight_bytes": weight_bytes(self.llm.model),
            "preemptions": self.llm.engine.scheduler.num_preemptions,
            "step_graphs": graphs.describe() if (graphs := self.llm.runner.graphs) else "off",
            "kernels": {name: sorted(op.variants_used())
                        for name, op in hwplug.kernels.ops().items() if op.variants_used()},
        }


def weight_bytes(model: Any) -> int:
    """Bytes of the model's parameters and buffers, each tensor counted once by where it
    starts (tied embeddings share one): a view of a mapped file counts its own bytes, not
    the whole mapping's (whose other pages, e.g. those of GGUF runs repacked at load and
    released, are not the model's)."""
    sizes: dict[int, int] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        size = tensor.numel() * tensor.element_size()
        sizes[tensor.data_ptr()] = max(size, sizes.get(tensor.data_ptr(), 0))
    return sum(sizes.values())


if __name__ == "__main__":
    serve(HwplugEngine)
