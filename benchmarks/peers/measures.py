"""What ``benchmarks/cpu_vs_llamacpp.py`` measures besides tokens/s: the machine's memory
bandwidth, the weight bytes a decode step reads, each engine's cold start, and how busy
other processes kept the CPUs meanwhile (these VMs are shared: an engine whose threads
meet at barriers slows down many times over when another process takes one of its cores).

Every measurement runs in a process of its own (torch's and llama.cpp's worker threads
never outlive it), one after the other; nothing here prints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gguf import GGUFReader

PEERS = Path(__file__).resolve().parent

#: The bandwidth probe, run as ``python -c`` with ``(gib, threads, repeats)`` substituted:
#: torch (2 threads) reads a float32 array with ``sum`` and copies it into another
#: (STREAM's "copy": its bytes count twice, read and written); best of ``repeats``.
BANDWIDTH_PROBE = """
import json, time, torch
gib, threads, repeats = {gib!r}, {threads!r}, {repeats!r}
torch.set_num_threads(threads)
n = int(gib * 2**30) // 4
src, dst = torch.ones(n), torch.zeros(n)
def best(fn):
    times = []
    for _ in range(repeats):
        start = time.perf_counter(); fn(); times.append(time.perf_counter() - start)
    return min(times)
read = best(lambda: float(src.sum()))
copy = best(lambda: dst.copy_(src))
print(json.dumps({{"bytes": 4 * n, "threads": threads, "repeats": repeats,
                  "read_gb_s": 4 * n / read / 1e9, "copy_gb_s": 2 * 4 * n / copy / 1e9}}))
"""


def memory_bandwidth(gib: float, threads: int, repeats: int = 5) -> dict[str, Any] | str:
    """The machine's read and copy bandwidth in GB/s (10**9 bytes) over a ``gib`` GiB
    float32 array on ``threads`` torch threads (:data:`BANDWIDTH_PROBE`), or why the
    probe failed."""
    code = BANDWIDTH_PROBE.format(gib=gib, threads=threads, repeats=repeats)
    process = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": str(threads)}, check=False)
    if process.returncode:
        return f"bandwidth probe failed: {process.stderr.strip()[-300:]}"
    return json.loads(process.stdout.strip().splitlines()[-1])


def weight_bytes(gguf: Path) -> dict[str, int]:
    """Bytes of ``gguf``'s tensors (``file``), and of those a one-sequence decode step
    reads (``per_token``): every tensor but the token embedding, of which a step reads one
    row, unless the model has no ``output.weight`` (tied embeddings: the embedding is the
    LM head, read whole)."""
    tensors = {t.name: int(t.n_bytes) for t in GGUFReader(gguf).tensors}
    total = sum(tensors.values())
    embedding = tensors.get("token_embd.weight", 0)
    per_token = total if "output.weight" not in tensors else total - embedding
    return {"file": total, "per_token": per_token, "tied": int("output.weight" not in tensors)}


def _timed(command: list[str], env: dict[str, str]) -> float | str:
    """Wall seconds of ``command`` from launch to exit, or its failure's last lines."""
    started = time.perf_counter()
    process = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if process.returncode:
        lines = [line for line in process.stderr.strip().splitlines() if line.strip()]
        return f"exit status {process.returncode}: {' | '.join(lines[-2:])[-400:]}"
    return time.perf_counter() - started


def hwplug_cold_start(gguf: Path | None, threads: int, runs: int = 2,
                      fresh: bool = True) -> list[float | str]:
    """Seconds from launch to exit of ``python -m hwplug generate --max-tokens 1 Hello``
    (a fresh process each run; ``gguf`` None: the default model and settings). With
    ``fresh``, ``gguf``'s conversion and its repacked weights in the cache are discarded
    first, so run 1 is a first start ever (it converts the file and writes the repacked
    runs into the cache) and run 2 a later one. A named model gets a 64-block KV cache of
    16 tokens (hwplug's default holds the model's whole context). Each run is a number, or
    why it failed (the runs after it do not run)."""
    from hwplug.model_zoo.loaders import cache, repacked_cache
    from hwplug.model_zoo.loaders.gguf_file import BLOCKS_CACHE_KIND, REPACKED_NAME

    command = [sys.executable, "-m", "hwplug", "generate", "--max-tokens", "1"]
    if gguf is not None:
        command += ["--model", str(gguf), "--block-size", "16", "--num-kv-blocks", "64"]
        entry = cache.entry_dir(gguf, BLOCKS_CACHE_KIND)
        if fresh:  # the runs repacked from the file, or from the conversion's reordered rows
            for source in (gguf, entry / REPACKED_NAME):
                repacked_cache.discard_for(source)
        if fresh and entry.is_dir():
            cache.discard(entry)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    return _runs(command + ["Hello"], env, runs)


def llamacpp_cold_start(gguf: Path, threads: int, runs: int = 2) -> list[float | str]:
    """Seconds from launch to exit of a fresh process that loads ``gguf`` with llama.cpp and
    computes the first greedy token after "Hello" (``llamacpp_runner.py --first-token``),
    ``runs`` times (the file is in the page cache after run 1 whatever it was before)."""
    command = [sys.executable, str(PEERS / "llamacpp_runner.py"), "--first-token", str(gguf),
               str(threads)]
    return _runs(command, dict(os.environ), runs)


def _runs(command: list[str], env: dict[str, str], runs: int) -> list[float | str]:
    results: list[float | str] = []
    for _ in range(runs):
        results.append(_timed(command, env))
        if isinstance(results[-1], str):
            break
    return results


def busy_cpu_seconds() -> float:
    """CPU seconds every process on this machine has used since boot (``/proc/stat``'s
    first line, all but idle and iowait); 0.0 where there is no /proc."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(n) for n in stat.readline().split()[1:]]
    except OSError:
        return 0.0
    busy = sum(fields[:8]) - fields[3] - fields[4]  # user nice system idle iowait irq ...
    return busy / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    """User and system CPU seconds of this process's finished children."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class OtherLoad:
    """How many cores other processes used (on average) while a child of this process ran:
    the machine's busy CPU time minus this process's and its children's, over wall time.
    Start it before the child, call :meth:`cores` after the child has been waited for."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.busy, self.own = busy_cpu_seconds(), self._own()

    @staticmethod
    def _own() -> float:
        times = os.times()
        return times.user + times.system + children_cpu_seconds()

    def cores(self) -> float:
        wall = time.perf_counter() - self.started
        other = (busy_cpu_seconds() - self.busy) - (self._own() - self.own)
        return max(0.0, other / wall) if wall > 0 else 0.0


def wait_until_quiet(max_wait_s: float, window_s: float = 5.0, limit: float = 0.25) -> float:
    """Wait (at most ``max_wait_s``) until the machine's busy CPU time over ``window_s``
    is under ``limit`` cores, this process included (it sleeps); return the seconds
    waited."""
    started = time.perf_counter()
    while time.perf_counter() - started < max_wait_s:
        before = busy_cpu_seconds()
        time.sleep(window_s)
        if (busy_cpu_seconds() - before) / window_s < limit:
            break
    return time.perf_counter() - started
