"""Time to first token of a long prompt: cold, prefix-cache hit, connector hits.

One run, one model (SmolLM2 by default), one prompt of ``--prompt-tokens`` tokens; every
time is the fastest of ``--repeats`` calls (the least disturbed by other processes) of ``generate(prompt, max_tokens=1)``, each
engine warmed up first on an unrelated prompt of the same length (the first few long
prefills of a process run about 2x slower, while the allocator's pages and the kernels'
state warm up):

- cold: a plain engine, prefix cache emptied before each call (the whole prompt prefilled);
- cold + shared_storage save: the same, its connector saving every block to a directory;
- prefix-cache hit: the same prompt again on the plain engine;
- cpu_offload hit: the device cache emptied, the blocks loaded back from host memory;
- shared_storage hit, second process: a fresh ``python`` process builds its own engine on
  the same directory and loads the first one's blocks (prefix cache emptied before each
  call, so each call loads them again).

Ratios are cold / hit. The CPU (or device) is named in the first line.

    python benchmarks/prefix_and_connectors.py
    python benchmarks/prefix_and_connectors.py --prompt-tokens 2048 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import hwplug

hwplug.current_platform().apply_process_env()  # before torch loads

#: Long prefills run before any measurement, in each process.
WARM_UPS = 4
#: The second process: its own engine on the same directory; prints its times as JSON.
CHILD = """
import json, sys, time
import hwplug
hwplug.current_platform().apply_process_env()
model, path, prompt, repeats = sys.argv[1] or None, sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
llm = hwplug.LLM(model, kv_connector="shared_storage", kv_connector_config={"path": path})
one = hwplug.SamplingParams(max_tokens=1)
for _ in range(4):  # an unrelated prompt of the same length, as in the first process
    llm.generate([[token + 1 for token in prompt]], one)
times = []
for _ in range(repeats):
    llm.reset_prefix_cache()
    start = time.perf_counter()
    llm.generate([prompt], one)
    times.append(time.perf_counter() - start)
print(json.dumps({"times": times,
                  "loaded": llm.engine.scheduler.kv_transfer.num_loaded_blocks}))
"""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="path or alias (default: the default model)")
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=2)
    return parser.parse_args()


def long_prompt(llm: hwplug.LLM, num_tokens: int) -> list[int]:
    """``num_tokens`` token ids of English text (a paragraph repeated with counters)."""
    text = " ".join(f"Paragraph {i}: the river flows past the old mill, where the miller "
                    f"counts sacks of grain and tells stories of the valley." for i in
                    range(num_tokens // 10))
    ids = llm.tokenize(text)
    if len(ids) < num_tokens:
        sys.exit(f"the text has only {len(ids)} tokens")
    return ids[:num_tokens]


def ttft(llm: hwplug.LLM, prompt: list[int], repeats: int, before=None) -> float:
    """Fewest seconds of ``generate(prompt, max_tokens=1)``; ``before()`` runs before each."""
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        start = time.perf_counter()
        llm.generate([prompt], hwplug.SamplingParams(max_tokens=1))
        times.append(time.perf_counter() - start)
    return min(times)


def warmed(model: str | None, prompt: list[int], **options) -> hwplug.LLM:
    """An engine that has prefilled an unrelated prompt as long as ``prompt`` a few times."""
    llm = hwplug.LLM(model, **options)
    warm_up = [token + 1 for token in prompt]
    for _ in range(WARM_UPS):
        llm.generate([warm_up], hwplug.SamplingParams(max_tokens=1))
    return llm


def main() -> None:
    args = parse_args()
    prompt = long_prompt(hwplug.LLM(args.model), args.prompt_tokens)
    plain = warmed(args.model, prompt)
    platform = hwplug.current_platform()
    print(f"{platform.facts.device_name} ({os.cpu_count()} logical CPUs), platform "
          f"{plain.platform}, {plain.architecture} {plain.dtype}, prompt {len(prompt)} tokens, "
          f"block {plain.ctx.engine_config.block_size}, fastest of {args.repeats}")
    rows = {"cold": ttft(plain, prompt, args.repeats, plain.reset_prefix_cache)}
    rows["prefix-cache hit"] = ttft(plain, prompt, args.repeats)
    with tempfile.TemporaryDirectory(prefix="hwplug-kv-bench-") as store:
        saving = warmed(args.model, prompt, kv_connector="shared_storage",
                        kv_connector_config={"path": store})
        rows["cold + shared_storage save"] = ttft(saving, prompt, 1)  # once: then it's stored
        saving.close()
        offload = warmed(args.model, prompt, kv_connector="cpu_offload")
        offload.generate([prompt], hwplug.SamplingParams(max_tokens=1))
        rows["cpu_offload hit"] = ttft(offload, prompt, args.repeats, offload.reset_prefix_cache)
        offload.close()
        child = subprocess.run([sys.executable, "-c", CHILD, args.model or "", store,
                                json.dumps(prompt), str(args.repeats)],
                               capture_output=True, text=True, check=False)
        if child.returncode:
            sys.exit(f"the second process failed:\n{child.stderr}")
        result = json.loads(child.stdout.strip().splitlines()[-1])
        rows["shared_storage hit, 2nd process"] = min(result["times"])
    cold = rows["cold"]
    width = max(map(len, rows))
    for name, seconds in rows.items():
        print(f"{name:<{width}}  TTFT {seconds * 1000:9.1f} ms   cold / this {cold / seconds:6.1f}x")
    print(f"(the second process loaded {result['loaded']} blocks over {args.repeats} calls)")


if __name__ == "__main__":
    main()
