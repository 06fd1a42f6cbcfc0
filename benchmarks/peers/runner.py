"""The protocol between ``benchmarks/cpu_vs_llamacpp.py`` and its engine runners.

Each engine (hwplug, transformers, llama.cpp, vLLM) runs in a process of its own, one at a
time, so no engine's idle OpenMP workers (which spin for a while after their last call)
share the cores with the next. This module uses the
standard library only: the vLLM runner imports it from vLLM's own virtualenv.

The main script writes one JSON request on the runner's stdin::

    {"options": {...}, "threads": 2, "new_tokens": 128,
     "calls": {"<batch>": [<call>, ...]},    # a call: <batch> prompts, each a token-id list
     "check_prompt": [token ids],            # a sentence, no longer than the prompts
     "ttft_calls": {"<length>": [<call>, ...]}}  # optional: calls of one prompt each

``options`` is the runner's own (model path, dtype, ...). The runner loads its engine
(``load_s``), then, batch size by batch size, runs the first call as a warm-up (its time
``warmup_s`` reported apart) and times each other call, one ``generate`` of the whole
batch each: greedy, end-of-sequence ignored, ``new_tokens`` new tokens per prompt, prefill
included. A completion of any other length is an error (its rate would be wrong). Last,
untimed, it completes ``check_prompt`` alone (a natural sentence: the random-word prompts
only show that engines agree, this shows the text is sane). With ``ttft_calls``, each
prompt length's calls then run one prompt to one new token (time to first token: prefill
and one sampled token), the first a warm-up. It then prints one line, :data:`MARKER` and
the JSON result, on stdout::

    {"load_s": 1.2, "engine": {...}, "batches": {"<batch>": {"warmup_s": 3.1,
     "seconds": [2.9, 3.0], "first_completion": [token ids]}},
     "check_completion": [token ids],
     "ttft": {"<length>": {"warmup_s": 0.2, "seconds": [0.1, 0.1]}},
     "rss_after_load_bytes": 123, "rss_anon_after_load_bytes": 100,
     "rss_file_after_load_bytes": 23, "peak_rss_bytes": 456}

``engine`` is what the engine says of itself (versions, settings); ``first_completion``
is the first timed call's first completion, for the output checks. The RSS figures are
this process's (``VmRSS`` after the load, split into ``RssAnon`` and ``RssFile``: memory
of its own and mapped file pages; ``VmHWM`` at the end; from /proc/self/status;
None where there is no /proc): an engine that computes in processes of its own (vLLM)
is not counted whole. An engine that fails to load prints ``{"error": "<first line>"}``
after the marker (and the traceback on stderr) and exits with status 1.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, Protocol

#: Prefix of the result line (engines may log on stdout too).
MARKER = "RUNNER-RESULT "


class Engine(Protocol):
    """A loaded model that completes batches of token-id prompts greedily."""

    def generate(self, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        """Exactly ``new_tokens`` greedy tokens for each prompt (EOS ignored), in order."""

    def describe(self) -> dict[str, Any]:
        """Versions and settings worth reporting, as JSON values."""


def serve(load: Callable[[dict[str, Any], int, int], Engine]) -> None:
    """Answer the request on stdin with the engine ``load(options, threads, max_batch)``
    returns, as the module docstring describes."""
    request = json.load(sys.stdin)
    new_tokens = int(request["new_tokens"])
    calls: dict[str, list[list[list[int]]]] = request["calls"]
    started = time.perf_counter()
    try:
        engine = load(request["options"], int(request["threads"]), max(map(int, calls)))
    except Exception as exc:
        traceback.print_exc()
        first_line = (str(exc).strip().splitlines() or [""])[0]
        print(MARKER + json.dumps({"error": f"{type(exc).__name__}: {first_line}"}),
              flush=True)
        sys.exit(1)
    result: dict[str, Any] = {"load_s": time.perf_counter() - started, "batches": {},
                              "rss_after_load_bytes": proc_status_bytes("VmRSS"),
                              "rss_anon_after_load_bytes": proc_status_bytes("RssAnon"),
                              "rss_file_after_load_bytes": proc_status_bytes("RssFile")}
    for batch, batch_calls in calls.items():
        warmup_s, _ = timed_call(engine, batch_calls[0], new_tokens)
        seconds, completions = [], []
        for prompts in batch_calls[1:]:
            elapsed, completion = timed_call(engine, prompts, new_tokens)
            seconds.append(elapsed)
            completions.append(completion)
        result["batches"][batch] = {"warmup_s": warmup_s, "seconds": seconds,
                                    "first_completion": completions[0][0]}
    result["check_completion"] = timed_call(engine, [request["check_prompt"]], new_tokens)[1][0]
    result["ttft"] = {}
    for length, ttft_calls in request.get("ttft_calls", {}).items():
        times = [timed_call(engine, prompts, 1)[0] for prompts in ttft_calls]
        result["ttft"][length] = {"warmup_s": times[0], "seconds": times[1:]}
    result["engine"] = engine.describe()
    result["peak_rss_bytes"] = proc_status_bytes("VmHWM")
    print(MARKER + json.dumps(result), flush=True)


def timed_call(engine: Engine, prompts: list[list[int]],
               new_tokens: int) -> tuple[float, list[list[int]]]:
    """Wall seconds of one ``engine.generate`` call and its completions, checked."""
    started = time.perf_counter()
    completions = engine.generate(prompts, new_tokens)
    elapsed = time.perf_counter() - started
    lengths = sorted({len(completion) for completion in completions})
    if len(completions) != len(prompts) or lengths != [new_tokens]:
        raise RuntimeError(f"{len(prompts)} prompts gave {len(completions)} completions of "
                           f"{lengths} tokens, not {new_tokens} each")
    return elapsed, completions


def proc_status_bytes(field: str, pid: int | str = "self") -> int | None:
    """``field`` of /proc/<pid>/status (``VmRSS``, ``VmHWM``: kB there) in bytes, or None
    where it cannot be read."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
