"""The transformers runner of ``benchmarks/cpu_vs_llamacpp.py`` (protocol: :mod:`runner`).

Options: ``model_dir``, the Hugging Face directory hwplug converts the GGUF into
(dequantised, float32), and ``dtype``. ``AutoModelForCausalLM.generate`` runs greedily;
``min_new_tokens`` equal to ``max_new_tokens`` keeps it from stopping at EOS. The prompts
have equal lengths, so no padding is needed. The process gets hwplug's CPU process
environment (same torch, same OpenMP settings as the hwplug rows) and ``threads`` torch
threads.
"""

from __future__ import annotations

from typing import Any

from runner import serve

import hwplug


class TransformersEngine:
    """transformers' causal LM behind the runner protocol."""

    def __init__(self, options: dict[str, Any], threads: int, max_batch: int) -> None:
        hwplug.current_platform().apply_process_env()  # before torch loads, as for hwplug
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.model = AutoModelForCausalLM.from_pretrained(
            options["model_dir"], dtype=getattr(torch, options["dtype"])).eval()

    def generate(self, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        import torch

        input_ids = torch.tensor(prompts)
        with torch.inference_mode():
            output = self.model.generate(
                input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                pad_token_id=0)  # never used: no sequence ends early
        return output[:, input_ids.shape[1]:].tolist()

    def describe(self) -> dict[str, Any]:
        import torch
        import transformers

        return {"transformers": transformers.__version__, "torch": torch.__version__,
                "threads": torch.get_num_threads(), "dtype": str(self.model.dtype)}


if __name__ == "__main__":
    serve(TransformersEngine)
