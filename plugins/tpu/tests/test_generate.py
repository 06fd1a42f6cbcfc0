"""``hwplug generate`` with SmolLM2 on the tpu platform, as a user runs it without a TPU:
``JAX_PLATFORMS=cpu HWPLUG_PLATFORM=tpu hwplug generate ... --chat``.

Greedy completions of five chat prompts, batched, must be the cpu platform's, token for
token (both in float32 on the dequantized weights: the platforms' default dtypes may
differ, and the tpu platform, which has no GGUF kernels, dequantizes the GGUF by itself);
the decode steps replay one compiled step per batch bucket, the prefill steps one per
(tokens, sequences) bucket, and every token is sampled on the device; a streamed prompt reports the
XLA compilations the run made next to its speed. The tests' conftest gives JAX two CPU
devices (``XLA_FLAGS``, inherited by the ``hwplug generate`` processes): the tpu platform
computes on the second.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # generates with JAX-compiled models

HWPLUG = [sys.executable, "-m", "hwplug"]
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three primary colors.",
    "How many legs does a spider have?",
    "Say hello in Spanish.",
]
MAX_TOKENS = "12"


def generate(platform: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HWPLUG_PLATFORM", "JAX_PLATFORMS", "OMP_WAIT_POLICY",
                                  "GOMP_SPINCOUNT"))}
    env["HWPLUG_PLATFORM"] = platform
    if platform == "tpu":
        env["JAX_PLATFORMS"] = "cpu"
    out = subprocess.run([*HWPLUG, "generate", *args, "--chat", "--max-tokens", MAX_TOKENS,
                          "--dtype", "float32"], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return out


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    path.write_text("\n".join(PROMPTS) + "\n")
    return str(path)


def test_five_prompts_give_the_cpu_platforms_greedy_tokens(prompts_file):
    tpu = generate("tpu", "--prompts-file", prompts_file)
    cpu = generate("cpu", "--prompts-file", prompts_file, "--dequantize")
    assert "platform tpu, attention backend PALLAS_RPA, dtype float32" in tpu.stderr
    assert "weights unquantized" in tpu.stderr
    assert "paged_attention=jax" in tpu.stderr and "linear=jax" in tpu.stderr
    assert all(f"[{i}] {prompt}" in tpu.stdout for i, prompt in enumerate(PROMPTS))
    assert tpu.stdout == cpu.stdout
    assert re.search(r"^(\d+) tokens in", tpu.stderr, re.M).group(1) == re.search(
        r"^(\d+) tokens in", cpu.stderr, re.M).group(1)
    buckets = re.search(r"^step graphs: decode batches of up to ([\d, ]+) sequences replayed "
                        r"\((\d+) steps\)$", tpu.stderr, re.M)
    assert buckets and int(buckets.group(2)) > 0, tpu.stderr
    prefill = re.search(r"^prefill steps of up to \(tokens, sequences\) (.+) replayed "
                        r"\((\d+) steps\)$", tpu.stderr, re.M)
    assert prefill and int(prefill.group(2)) > 0, tpu.stderr
    compiled = re.search(r"; steps compiled whole: (\d+)$", tpu.stderr, re.M)
    # one per decode bucket and one per prefill bucket
    assert int(compiled.group(1)) == (len(buckets.group(1).split(","))
                                      + prefill.group(1).count("("))


def test_a_streamed_prompt_reports_its_compilations():
    out = generate("tpu", PROMPTS[0])
    lines = out.stderr.splitlines()
    speed = next(i for i, line in enumerate(lines) if "tokens/s" in line)
    # a decode step and a prefill step compiled whole
    match = re.fullmatch(r"jax: (\d+) XLA compilations \(\d+\.\d s\); steps compiled whole: 2",
                         lines[speed + 1])
    assert match, lines
    assert 0 < int(match.group(1)) < 60  # per bucket, not per step
    assert re.fullmatch(r"step graphs: decode batches of up to 1 sequences replayed \(\d+ "
                        r"steps\)", lines[speed + 2]), lines
    assert re.fullmatch(r"prefill steps of up to \(tokens, sequences\) \(\d+, 1\) replayed "
                        r"\(1 steps\)", lines[speed + 3]), lines
    assert re.fullmatch(r"sampled on the device: \d+ steps; on the host: 0", lines[speed + 4]), lines
    assert "Paris" in out.stdout
