"""The C ``ggml_linear`` kernels' split of a call's weight rows over the threads: a thread
that finds its own share done runs the others' (balanced_for in kernels.c), so every output
is written, with the bits one thread gives it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from gguf import GGMLQuantizationType
from test_ggml_kernels import BUILDS, VARIANTS, runnable, weight_for

Q = GGMLQuantizationType


#: Run in a process whose OpenMP runtime gives every parallel region one thread
#: (``OMP_THREAD_LIMIT=1``) while torch asks for four: that thread runs its own quarter of
#: each call's weight rows, then takes the other three quarters' items from their backs.
ONE_THREAD_FOR_FOUR = """
import sys, torch
from hwplug.platforms.cpu.ggml import ops
build = getattr(ops, sys.argv[1])
build.ensure_built()
torch.set_num_threads(4)
cases = torch.load(sys.argv[2])
outs = []
for kind, qweight, x, activations in cases:
    out = torch.full((x.shape[0], qweight.shape[0]), float("nan"))
    if activations == "repacked":
        build.linear_repacked(x, build.repack(qweight, kind), kind, out=out)
    else:
        build.linear_blocks(x, qweight, kind, activations=activations, out=out)
    outs.append(out)
torch.save(outs, sys.argv[2])
"""


@pytest.mark.parametrize("name", VARIANTS)
def test_a_thread_runs_the_shares_of_threads_that_never_came(name, tmp_path):
    """Each path that splits weight rows over threads (repacked 16-row groups, the
    super-block tiles, the 16-row int16 groups, the 32-value tiles), 149 rows (9 groups
    and 5 rows): every output written, the same bits as one thread computes them."""
    runnable(name)
    build = BUILDS[name]
    cases = [(Q.Q3_K, 2, 1, "int8"), (Q.Q8_0, 3, 5, "int16"), (Q.Q4_1, 32, 1, "int16")]
    if name == "ggml_vnni":
        cases.append((Q.Q4_K, 2, 1, "repacked"))
    inputs = []
    for kind, blocks, rows, activations in cases:
        qweight, cols = weight_for(kind, 149, seed=kind, blocks=blocks)
        x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(kind))
        inputs.append((int(kind), qweight, x, activations))
    torch.save(inputs, tmp_path / "cases.pt")
    env = {**os.environ, "OMP_THREAD_LIMIT": "1"}
    subprocess.run([sys.executable, "-c", ONE_THREAD_FOR_FOUR, build.name.upper(),
                    str(tmp_path / "cases.pt")], env=env, check=True, timeout=300)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        outputs = torch.load(tmp_path / "cases.pt")
        for (kind, qweight, x, activations), got in zip(inputs, outputs, strict=True):
            if activations == "repacked":
                want = build.linear_repacked(x, build.repack(qweight, kind), kind)
            else:
                want = build.linear_blocks(x, qweight, kind, activations=activations)
            assert torch.equal(got, want), Q(kind).name
    finally:
        torch.set_num_threads(threads)
