"""KV connectors against faults a user's process meets, on the packaged SmolLM2.

Every output is compared with the same prompts run by a connector-less engine:

- a store slower than the model (its load still running when the first step after it
  starts), with step graphs on and off: a step that loads never replays a step graph,
  whose kernels would not wait for the layers' loads;
- a load that fails: nothing the step computed for that sequence reaches the store, and
  the bad block is rewritten by its recomputation;
- a block file that holds another block's KV (valid layout and checksum): rejected by
  its identity, a failed block under the policy, never data.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from kv_faults import truncate
from safetensors import safe_open

import hwplug
from hwplug.model_zoo.connectors.cpu_offload import CPUOffloadConnector
from hwplug.model_zoo.connectors.shared_storage import SharedStorageConnector
from hwplug.model_zoo.engine.block_hash import extend_block_hashes

pytestmark = pytest.mark.slow  # the real model

GREEDY = hwplug.SamplingParams(max_tokens=3, ignore_eos=True)
BLOCK = 16  # the CPU platform's block size for SmolLM2
#: Two blocks and one token: the step after a load computes one token, a decode-shaped step.
PROMPTS = [[1000 + 37 * i + 11 * j for j in range(2 * BLOCK + 1)] for i in range(2)]
WARM = [[2000, 2001, 2002, 2003, 2004]]  # records the one-sequence step graph first


def slow(cls: type) -> type:
    """``cls`` whose loads start late: the store is slower than the model's first layers."""

    def _start_reading(self, block_hashes):
        time.sleep(0.3)
        cls._start_reading(self, block_hashes)

    return type(f"Slow{cls.__name__}", (cls,), {"_start_reading": _start_reading})


CONNECTORS = {"shared_storage": slow(SharedStorageConnector),
              "cpu_offload": slow(CPUOffloadConnector)}


@pytest.fixture(scope="module")
def expected() -> list[list[int]]:
    plain = hwplug.LLM(enable_prefix_caching=False, step_graphs=False)
    try:
        return [o.token_ids for o in plain.generate(PROMPTS, GREEDY)]
    finally:
        plain.close()


def connected(name: str, tmp_path: Path, **options) -> hwplug.LLM:
    config = {"path": tmp_path} if name == "shared_storage" else {}
    policy = options.pop("policy", None)
    return hwplug.LLM(kv_connector=options.pop("connector", CONNECTORS[name]),
                      kv_connector_config=config, kv_load_failure_policy=policy, **options)


def one_by_one(llm: hwplug.LLM) -> list[list[int]]:
    return [llm.generate([prompt], GREEDY)[0].token_ids for prompt in PROMPTS]


@pytest.mark.parametrize("step_graphs", [True, False], ids=["graphs", "eager"])
@pytest.mark.parametrize("name", sorted(CONNECTORS))
def test_a_step_that_loads_waits_for_its_layers_with_step_graphs_on_or_off(
        expected, tmp_path, name, step_graphs):
    llm = connected(name, tmp_path, step_graphs=step_graphs)
    try:
        llm.generate(WARM, GREEDY)
        assert one_by_one(llm) == expected  # computed and saved
        assert llm.reset_prefix_cache()
        assert one_by_one(llm) == expected  # loaded, then one token computed
        transfer = llm.engine.scheduler.kv_transfer
        assert transfer.num_loaded_blocks == 2 * len(PROMPTS)
        assert transfer.num_failed_blocks == 0
        if step_graphs:  # the decode steps after the loading ones still replay
            assert llm.runner.graphs.replays > 0
    finally:
        llm.close()


# --- a failed load --------------------------------------------------------------------------

#: The first prompt's two blocks, then one more block and a token: a step that loads the
#: first two also computes (and fills) the third.
LONGER = PROMPTS[0][:2 * BLOCK] + [3000 + j for j in range(BLOCK + 1)]


def block_files(directory: Path) -> dict[str, Path]:
    return {path.stem: path for path in directory.rglob("*.safetensors")}


def stored_kv(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(path, framework="pt") as handle:
        return {name: handle.get_tensor(name) for name in handle.keys()}


def test_nothing_a_step_computed_over_a_failed_load_is_saved(tmp_path):
    store, clean = tmp_path / "store", tmp_path / "clean"
    writer = connected("shared_storage", store, connector=SharedStorageConnector)
    try:
        writer.generate(PROMPTS[:1], GREEDY)
        hashes: list[str] = []
        extend_block_hashes(hashes, writer.engine.root_hash, PROMPTS[0], BLOCK)
    finally:
        writer.close()
    assert sorted(block_files(store)) == sorted(hashes)
    recomputed = connected("shared_storage", clean, connector=SharedStorageConnector)
    try:
        want = recomputed.generate([LONGER], GREEDY)[0].token_ids
    finally:
        recomputed.close()
    truncate(block_files(store)[hashes[1]])
    reader = connected("shared_storage", store, connector=SharedStorageConnector,
                       policy="recompute")
    try:
        assert reader.generate([LONGER], GREEDY)[0].token_ids == want
        assert reader.engine.scheduler.kv_transfer.num_failed_blocks >= 1
    finally:
        reader.close()
    # every block stored (the truncated one rewritten) is what recomputation gives
    got, reference = block_files(store), block_files(clean)
    assert sorted(got) == sorted(reference) and len(got) == 3
    for block_hash, path in got.items():
        for name, tensor in stored_kv(path).items():
            assert torch.equal(tensor, stored_kv(reference[block_hash])[name]), block_hash
