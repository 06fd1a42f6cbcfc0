"""GGUF weights kept in their blocks under tensor parallelism, in real gloo process groups.

Column-parallel layers and the vocabulary tables hold their share of the output rows; a
row-parallel layer holds its share of the input columns where the blocks fall on the
share's boundaries, else gathers its input and computes its share of the output rows (see
:mod:`hwplug.model_zoo.quant_methods.gguf`). The ranks' logits equal one process's within
:data:`ATOL` of the logits' range (the kernels round each rank's activations to int8 per
block, and the all-reduce adds partial sums in another order), so their greedy tokens are
one process's wherever the top two logits lie further apart than that, and a near-tie
may go either way: the random tiny model's argmax is not compared. The CLI prints the
same text with three ranks as with one, on the real model.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from dist_workers import gguf_prefill_logits, gguf_row_parallel_layers, run
from gguf import GGMLQuantizationType as Q
from tiny_checkpoints import shrink_gguf

from hwplug.model_zoo.loaders import resolve_model

pytestmark = pytest.mark.slow  # each test starts worker processes

#: Max |tensor-parallel - one process| logit over the one-process logits' range (measured:
#: 0.0017 on an Intel Xeon, family 6 model 207).
ATOL = 0.02
#: The shrunk SmolLM2's layer types: o_proj F16 (blocks of 1), gate/up Q4_1 and Q8_0 (32),
#: down Q6_K (256: the 512-column shares of 1536 over 3 ranks fall on its blocks).
RETYPE = {"attn_q": Q.Q5_0, "attn_k": Q.Q8_0, "attn_v": Q.Q4_0, "ffn_gate": Q.Q8_0,
          "ffn_up": Q.Q4_1, "ffn_down": Q.Q6_K, "attn_output": Q.F16}


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shrink_gguf(resolve_model(None), tmp_path_factory.mktemp("gguf") / "mixed.gguf",
                       layers=2, vocab=1536, retype={k: int(v) for k, v in RETYPE.items()})


def test_three_ranks_give_one_process_logits(mixed_gguf: Path):
    ids = list(range(5, 45))
    (want,) = run(gguf_prefill_logits, 1, str(mixed_gguf), ids)
    ranks = run(gguf_prefill_logits, 3, str(mixed_gguf), ids)
    scale = float(want.max() - want.min())
    for rank, got in enumerate(ranks):
        error = float((got - want).abs().max()) / scale
        assert error < ATOL, f"rank {rank}: {error}"


def test_row_parallel_layers_split_at_blocks_or_gather(mixed_gguf: Path):
    # 768 columns over 2 ranks: 384 each, Q4_K's 256-value blocks do not divide them
    # (gathered); Q8_0's 32 do, as do Q4_K's for 512 columns (256 each)
    cases = [(int(Q.Q4_K), 768, 24), (int(Q.Q8_0), 768, 24), (int(Q.Q4_K), 512, 24)]
    ranks = run(gguf_row_parallel_layers, 2, str(mixed_gguf), cases)
    assert [r["split_by"] for r in ranks[0]] == ["gathered", "columns", "columns"]
    for rank, results in enumerate(ranks):
        for (kind, inputs, _), result in zip(cases, results, strict=True):
            want, got = result["want"], result["got"]
            error = float((got - want).abs().max() / want.abs().max())
            assert error < 0.02, (rank, Q(kind).name, inputs, error)
    for one, other in zip(ranks[0], ranks[1], strict=True):  # half the bytes each
        assert one["bytes"] == other["bytes"]
    full = {768: 3 * 144 * 24, 512: 2 * 144 * 24}
    assert ranks[0][0]["bytes"] * 2 == full[768]  # gathered: half the rows, every column
    assert ranks[0][2]["bytes"] * 2 == full[512]


def test_cli_chat_with_three_ranks_prints_what_one_process_does():
    command = [sys.executable, "-m", "hwplug", "generate", "What is the capital of France?",
               "--chat", "--max-tokens", "12"]
    alone = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert alone.returncode == 0, alone.stderr
    ranks = subprocess.run([*command, "--tensor-parallel-size", "3"], capture_output=True,
                           text=True, timeout=600)
    assert ranks.returncode == 0, ranks.stderr
    assert ranks.stdout == alone.stdout
    assert ", tensor-parallel 3; kernels:" in ranks.stderr
    assert "weights gguf" in ranks.stderr
