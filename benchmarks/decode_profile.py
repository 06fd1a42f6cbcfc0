"""Where a decode step's time goes: registry ops vs everything else, per configuration.

Each configuration runs in a fresh process (settings are read when torch and the kernel
registry load): it builds ``hwplug.LLM()``, decodes ``--batch`` sequences greedily for
``--tokens`` steps once to warm up, times the same again, then profiles it with
``torch.profiler``, every call of an op the model's layers bound wrapped in a
``record_function`` named after the op. Printed per configuration: ms per step, tokens/s, the ms per step inside each op
(its kernels and the torch calls it makes) and what is left outside the ops (Python
engine, scheduler, sampling, tensor creation, dispatch), plus the torch calls with the
most self time. The configurations:

- ``dequantized``: float32 weights (``gemv_avx2`` at one row, oneDNN from two), fused C
  variants and ``gemm_avx2`` disabled (``HWPLUG_DISABLED_KERNELS``): the path before the
  GGUF kernels and the fused C ops;
- ``dequantized+fused``: float32 weights and every C variant hwplug registers;
- ``gguf``: the GGUF's blocks kept, fused C variants disabled;
- ``gguf+fused``: GGUF blocks and every C variant hwplug registers;

each of them with every step eager (``step_graphs=False``), and

- ``dequantized+fused+graphs``, ``gguf+fused+graphs``: the default for each kind of
  weight: the decode steps replay step graphs (docs/generation.md), so no registry op runs
  in the profiled steps: what is left is the replay's C calls and the engine around them.

    python benchmarks/decode_profile.py [--batch 1] [--tokens 40]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

#: Variants the "before" configurations turn off (those that exist on this machine's build).
FUSED_VARIANTS = "rms_norm/fused_avx2,rms_norm/fused_c,rotary_embedding/fused_avx2," \
                 "rotary_embedding/fused_c,silu_and_mul/fused_avx2,silu_and_mul/fused_c," \
                 "paged_attention/fused_avx2,paged_attention/fused_c"
#: name -> (dequantize, disabled variants, step graphs)
CONFIGS = {
    "dequantized": (True, FUSED_VARIANTS + ",linear/gemm_avx2", False),
    "dequantized+fused": (True, "", False),
    "dequantized+fused+graphs": (True, "", True),
    "gguf": (False, FUSED_VARIANTS, False),
    "gguf+fused": (False, "", False),
    "gguf+fused+graphs": (False, "", True),
}

#: The profiled process: prints its measurements as JSON.
CHILD = """
import json, time
import hwplug
hwplug.current_platform().apply_process_env()
from torch.profiler import ProfilerActivity, profile, record_function
from hwplug.kernel_registry import BoundOp

def recording(call):
    def recorded(self, *args, **kwargs):
        with record_function("op:" + self.op):
            return call(self, *args, **kwargs)
    return recorded
BoundOp.__call__ = recording(BoundOp.__call__)  # what a model's layers call

llm = hwplug.LLM(dequantize={dequantize}, step_graphs={step_graphs})
engine = llm.engine
params = hwplug.SamplingParams(max_tokens={tokens}, ignore_eos=True)
prompt = list(range(100, 116))

def decode(tag, profiler=None):
    for b in range({batch}):
        engine.add_request(f"{{tag}}{{b}}", prompt, params)
    engine.step()  # the prefill, not measured
    if profiler is not None:
        profiler.start()
    steps, start = 0, time.perf_counter()
    while engine.has_unfinished():
        engine.step()
        steps += 1
    seconds = time.perf_counter() - start
    if profiler is not None:
        profiler.stop()
    return steps, seconds

def main():
    decode("warm")
    steps, seconds = decode("timed")
    prof = profile(activities=[ProfilerActivity.CPU])
    profiled_steps, profiled = decode("profiled", prof)
    events = prof.key_averages()
    ops = {{e.key[3:]: e.cpu_time_total / profiled_steps / 1e3 for e in events
           if e.key.startswith("op:")}}
    top = sorted((e for e in events if not e.key.startswith("op:")),
                 key=lambda e: -e.self_cpu_time_total)[:8]
    print(json.dumps({{
        "ms_per_step": seconds / steps * 1e3, "tokens_per_s": {batch} * steps / seconds,
        "profiled_ms_per_step": profiled / profiled_steps * 1e3, "ops": ops,
        "top": [(e.key, e.self_cpu_time_total / profiled_steps / 1e3,
                 e.count / profiled_steps) for e in top],
        "variants": {{name: sorted(op.variants_used()) for name, op in
                     hwplug.kernels.ops().items() if op.variants_used()}}}}))

llm._loop.call(main)
"""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=40, help="decode steps per run")
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    return parser.parse_args()


def run(dequantize: bool, disabled: str, step_graphs: bool, args: argparse.Namespace) -> dict:
    env = {**os.environ, "HWPLUG_DISABLED_KERNELS": disabled}
    code = CHILD.format(dequantize=dequantize, step_graphs=step_graphs, tokens=args.tokens + 1,
                        batch=args.batch)
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, check=False)
    if result.returncode:
        sys.exit(f"the child process failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    import hwplug

    args = parse_args()
    facts = hwplug.current_platform().facts
    print(f"CPU: {facts.device_name}, {os.cpu_count()} cores; batch {args.batch}, "
          f"{args.tokens} decode steps")
    for name in args.configs:
        data = run(*CONFIGS[name], args)
        inside = sum(data["ops"].values())
        print(f"\n== {name}: {data['ms_per_step']:.2f} ms/step, {data['tokens_per_s']:.1f} "
              f"tok/s (profiled: {data['profiled_ms_per_step']:.2f} ms/step)")
        print(f"   registry ops {inside:.2f} ms/step, outside them "
              f"{data['profiled_ms_per_step'] - inside:.2f} ms/step")
        for op, ms in sorted(data["ops"].items(), key=lambda kv: -kv[1]):
            print(f"   {op:28s} {ms:7.2f} ms/step  {'+'.join(data['variants'].get(op, []))}")
        print("   top torch calls by self time:")
        for key, ms, calls in data["top"]:
            print(f"   {key[:44]:44s} {ms:7.2f} ms/step, {calls:.0f} calls/step")


if __name__ == "__main__":
    main()
