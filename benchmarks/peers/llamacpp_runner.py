"""The llama.cpp runner of ``benchmarks/cpu_vs_llamacpp.py`` (protocol: :mod:`runner`).

Option ``path``: the GGUF file to run. It goes through llama-cpp-python's low-level API
(the C API one to one), as llama.cpp's own ``batched`` example does: a batch of ``B``
prompts is ``B`` parallel sequences of one context (``n_seq_max = B``, one sequence id per
prompt), prefilled in one ``llama_decode`` call (logits of each prompt's last token only),
then decoded one token per sequence per ``llama_decode`` call; each step's next token is
the argmax of ``llama_get_logits_ith`` for each sequence. ``n_threads`` and
``n_threads_batch`` are ``threads``; everything else is llama.cpp's default (an F16 KV
cache, flash attention where llama.cpp picks it). One context per batch size and prompt
length, made on its first (warm-up) call (the previous one is freed then, so the peak
RSS holds one context at a time); the KV cache is cleared before every call.

``python llamacpp_runner.py --first-token PATH THREADS``: the cold-start probe. A fresh
process loads ``PATH`` (llama.cpp's defaults: the file memory-mapped), prefills the
tokens of "Hello" in a one-sequence context and prints the first greedy token's id:
``cpu_vs_llamacpp.py`` times it from launch to exit.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

import llama_cpp
import numpy as np
from runner import serve

#: llama.cpp sizes each sequence's share of the context in steps of this many tokens.
CONTEXT_STEP = 256


@llama_cpp.llama_log_callback
def _quiet(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    """Drop llama.cpp's log (it prints every tensor at load)."""


class LlamaCppEngine:
    """A llama.cpp model behind the runner protocol."""

    def __init__(self, options: dict[str, Any], threads: int, max_batch: int) -> None:
        llama_cpp.llama_log_set(_quiet, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        self.threads = threads
        self.model = llama_cpp.llama_model_load_from_file(
            options["path"].encode(), llama_cpp.llama_model_default_params())
        if not self.model:
            raise RuntimeError(f"llama.cpp cannot load {options['path']}")
        vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        self.contexts: dict[tuple[int, int, int], tuple[Any, Any]] = {}

    def _context(self, batch: int, prompt_len: int, total_len: int) -> tuple[Any, Any]:
        """A context of ``batch`` sequences of ``total_len`` tokens, and a llama_batch
        holding the prefill of ``batch`` prompts of ``prompt_len`` tokens."""
        key = (batch, prompt_len, total_len)
        if key not in self.contexts:
            for context, tokens in self.contexts.values():
                llama_cpp.llama_batch_free(tokens)
                llama_cpp.llama_free(context)
            self.contexts.clear()
            params = llama_cpp.llama_context_default_params()
            params.n_seq_max = batch
            params.n_ctx = batch * -(-total_len // CONTEXT_STEP) * CONTEXT_STEP
            params.n_batch = max(params.n_batch, batch * prompt_len)
            params.n_threads = params.n_threads_batch = self.threads
            context = llama_cpp.llama_init_from_model(self.model, params)
            if not context:
                raise RuntimeError(f"llama.cpp cannot make a context for {batch} sequences")
            self.contexts[key] = (context, llama_cpp.llama_batch_init(batch * prompt_len, 0, 1))
        return self.contexts[key]

    def generate(self, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        prompt_len = len(prompts[0])
        context, tokens = self._context(len(prompts), prompt_len, prompt_len + new_tokens)
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(context), True)
        # prefill: every prompt, logits for its last token only
        _fill(tokens, [(ids[pos], pos, seq, pos == prompt_len - 1)
                       for seq, ids in enumerate(prompts) for pos in range(prompt_len)])
        rows = [seq * prompt_len + prompt_len - 1 for seq in range(len(prompts))]
        completions: list[list[int]] = [[] for _ in prompts]
        for step in range(new_tokens):
            if step:
                _fill(tokens, [(completion[-1], prompt_len + step - 1, seq, True)
                               for seq, completion in enumerate(completions)])
                rows = list(range(len(prompts)))
            if llama_cpp.llama_decode(context, tokens):
                raise RuntimeError(f"llama_decode failed at step {step}")
            for completion, row in zip(completions, rows, strict=True):
                logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(context, row),
                                               shape=(self.n_vocab,))
                completion.append(int(logits.argmax()))
        return completions

    def describe(self) -> dict[str, Any]:
        return {"llama_cpp_python": llama_cpp.__version__, "n_threads": self.threads,
                "system_info": llama_cpp.llama_print_system_info().decode().strip()}


def _fill(batch: Any, entries: list[tuple[int, int, int, bool]]) -> None:
    """Set ``batch`` to ``(token, position, sequence id, wants logits)`` entries."""
    batch.n_tokens = len(entries)
    for i, (token, pos, seq, logits) in enumerate(entries):
        batch.token[i], batch.pos[i], batch.logits[i] = token, pos, logits
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq


def first_token(path: str, threads: int) -> int:
    """The first greedy token after "Hello" with the model at ``path`` (cold-start probe)."""
    engine = LlamaCppEngine({"path": path}, threads, 1)
    vocab = llama_cpp.llama_model_get_vocab(engine.model)
    ids = (llama_cpp.llama_token * 16)()
    count = llama_cpp.llama_tokenize(vocab, b"Hello", 5, ids, 16, True, False)
    if count <= 0:
        raise RuntimeError(f"llama.cpp cannot tokenize 'Hello' ({count})")
    return engine.generate([list(ids[:count])], 1)[0][0]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--first-token"]:
        print(first_token(sys.argv[2], int(sys.argv[3])))
    else:
        serve(LlamaCppEngine)
