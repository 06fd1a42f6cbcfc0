"""KV connectors: layouts and fingerprints, ``cpu_offload``, ``shared_storage``, faults.

Every output is compared with the same prompts run by a plain engine (no connector, no
prefix cache). Faults are made where a real one would happen, in the store: block files
are corrupted, truncated, replaced by another block's file (valid layout and checksums),
deleted between lookup and load, or rewritten by an engine of another layout; each under the ``fail`` and the ``recompute`` policy.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import kv_layouts
import pytest
import torch
from kv_faults import Forgetful, another_blocks_kv, corrupt, truncate
from kv_layouts import BLOCKS_LAST, HEADS_FIRST
from safetensors import safe_open
from safetensors.torch import save_file
from tiny_llama import plain_tokens, random_prompts, tiny_model_dir  # noqa: F401 (fixture)

import hwplug
from hwplug.connector import (
    KVLayout,
    KVLayoutMismatchError,
    KVTransferError,
    ThroughReference,
    kv_layout_fingerprint,
    layout_converter,
    layout_converters,
    register_layout_converter,
)
from hwplug.model_zoo.connectors.shared_storage import (
    CHECKSUMS_KEY,
    LAYOUT_KEY,
    checksum,
)
from hwplug.registry import current_source

GREEDY = hwplug.SamplingParams(max_tokens=6, ignore_eos=True)
LAYOUT = KVLayout(backend="TORCH_PAGED", layout="NHD", kv_cache_dtype="float32", block_size=16,
                  num_kv_heads=2, head_size=16, num_layers=2)
PROMPTS = random_prompts(0, 3, length=70)  # 4 full blocks of 16 each


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return PROMPTS


@pytest.fixture(scope="module")
def expected(model_dir) -> list[list[int]]:
    return plain_tokens(model_dir, PROMPTS, GREEDY)


def llm_with(model_dir: Path, connector, **config) -> hwplug.LLM:
    policy = config.pop("policy", None)
    return hwplug.LLM(model_dir, num_kv_blocks=64, kv_connector=connector,
                      kv_connector_config=config, kv_load_failure_policy=policy)


def transfer(llm: hwplug.LLM):
    return llm.engine.scheduler.kv_transfer


# --- layouts --------------------------------------------------------------------------------

def test_the_fingerprint_covers_every_field_including_fp8_scales():
    base = kv_layout_fingerprint(LAYOUT)
    changes = dict(backend="X", layout="OTHER", kv_cache_dtype="bfloat16", block_size=8,
                   num_kv_heads=4, head_size=8, num_layers=3, scales=(0.5, 0.5))
    for name, value in changes.items():
        assert kv_layout_fingerprint(replace(LAYOUT, **{name: value})) != base, name
    assert kv_layout_fingerprint(replace(LAYOUT)) == base


@pytest.fixture
def other_layouts(fresh_discovery):
    """Two layouts registered as a plugin's: a transposed view and one with blocks last."""
    with kv_layouts.registered(HEADS_FIRST, BLOCKS_LAST):
        yield


def test_a_layout_only_difference_converts_any_other_names_the_fields(other_layouts):
    blocks = torch.randn(2, 3, 16, 2, 16)
    hnd = replace(LAYOUT, backend="OTHER_ATTN", layout=HEADS_FIRST.name)
    there = layout_converter(LAYOUT, hnd)(blocks, LAYOUT, hnd)
    assert there.shape == (2, 3, 2, 16, 16) and torch.equal(there, blocks.transpose(2, 3))
    assert torch.equal(layout_converter(hnd, LAYOUT)(there, hnd, LAYOUT), blocks)
    last = replace(LAYOUT, layout=BLOCKS_LAST.name)  # between two plugins' layouts
    moved = layout_converter(hnd, last)(there, hnd, last)
    assert moved.shape == (2, 16, 2, 16, 3)
    assert torch.equal(layout_converter(last, LAYOUT)(moved, last, LAYOUT), blocks)
    same_bytes = replace(LAYOUT, backend="TRITON_ATTN")
    assert layout_converter(same_bytes, LAYOUT)(blocks, same_bytes, LAYOUT) is blocks
    with pytest.raises(KVLayoutMismatchError, match="kv_cache_dtype 'float32' vs 'bfloat16'"
                       ".*scales") as caught:
        layout_converter(LAYOUT, replace(hnd, kv_cache_dtype="bfloat16", scales=(1.0,)))
    assert caught.value.fields == ["kv_cache_dtype", "scales"]
    with pytest.raises(KVLayoutMismatchError, match="TPU is no registered KV-cache layout"):
        layout_converter(LAYOUT, replace(LAYOUT, layout="TPU"))


def test_a_registered_converter_takes_precedence_over_the_derived_one(other_layouts):
    hnd = replace(LAYOUT, layout=HEADS_FIRST.name)
    calls = []

    def direct(blocks, source, target):
        calls.append((source.layout, target.layout))
        return blocks.transpose(2, 3)

    token = current_source.set(__name__)
    try:
        register_layout_converter(LAYOUT.layout, hnd.layout, direct)
    finally:
        current_source.reset(token)
    try:
        blocks = torch.randn(2, 3, 16, 2, 16)
        assert torch.equal(layout_converter(LAYOUT, hnd)(blocks, LAYOUT, hnd),
                           blocks.transpose(2, 3))
        assert calls == [("NHD", "TEST_HND")]
        assert isinstance(layout_converter(hnd, LAYOUT), ThroughReference)  # the other way
    finally:
        layout_converters.drop_source(__name__)


def test_connector_options_are_checked(model_dir, tmp_path):
    with pytest.raises(hwplug.errors.ConfigError, match="needs kv_connector_config"):
        hwplug.LLM(model_dir, num_kv_blocks=8, kv_connector="shared_storage")
    with pytest.raises(hwplug.errors.ConfigError, match="does not fit connector cpu_offload"):
        llm_with(model_dir, "cpu_offload", path=tmp_path)
    with pytest.raises(hwplug.errors.ConfigError,
                       match="kv_load_failure_policy must be one of fail, recompute .*'retry'"):
        llm_with(model_dir, "cpu_offload", policy="retry")
    with pytest.raises(hwplug.errors.ConfigError, match="need a kv_connector"):
        hwplug.LLM(model_dir, num_kv_blocks=8, kv_load_failure_policy="recompute")
    with pytest.raises(hwplug.errors.UnknownNameError, match="shared_storage"):
        hwplug.LLM(model_dir, num_kv_blocks=8, kv_connector="lmcache")


# --- cpu_offload ----------------------------------------------------------------------------

def test_cpu_offload_serves_what_the_prefix_cache_dropped(model_dir, prompts, expected):
    llm = llm_with(model_dir, "cpu_offload", max_bytes=10 * 2**20)
    assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == expected
    assert transfer(llm).num_loaded_blocks == 0 and len(llm.connector.store) == 3 * 4
    assert llm.reset_prefix_cache()
    assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == expected
    assert transfer(llm).num_loaded_blocks == 3 * 4


def test_cpu_offload_keeps_to_its_byte_cap_least_recently_used_first(model_dir, prompts):
    block_bytes = 2 * 2 * 16 * 2 * 16 * 4  # layers x K/V x tokens x heads x head size x fp32
    llm = llm_with(model_dir, "cpu_offload", max_bytes=5 * block_bytes)
    llm.generate(prompts[:1], GREEDY)
    first = set(llm.connector.store._blocks)
    llm.generate(prompts[1:2], GREEDY)
    store = llm.connector.store
    assert store.nbytes <= 5 * block_bytes and len(store) == 5
    assert len(first & set(store._blocks)) == 1  # the 3 oldest of the first request went


# --- shared_storage -------------------------------------------------------------------------

def test_shared_storage_blocks_are_reused_by_a_second_engine(model_dir, prompts, expected,
                                                              tmp_path):
    writer = llm_with(model_dir, "shared_storage", path=tmp_path)
    assert [o.token_ids for o in writer.generate(prompts, GREEDY)] == expected
    files = sorted(tmp_path.rglob("*.safetensors"))
    assert len(files) == 3 * 4 and not [p for p in tmp_path.rglob(".*") if p.is_file()]
    with safe_open(files[0], framework="pt") as handle:
        stored = KVLayout.from_json(handle.metadata()[LAYOUT_KEY])
        assert stored == writer.connector.layout
        assert sorted(handle.keys()) == ["layers.0", "layers.1"]
    reader = llm_with(model_dir, "shared_storage", path=tmp_path)
    assert [o.token_ids for o in reader.generate(prompts, GREEDY)] == expected
    assert transfer(reader).num_loaded_blocks == 3 * 4


READER = """
import json, sys
import hwplug
llm = hwplug.LLM(sys.argv[1], num_kv_blocks=64, kv_connector="shared_storage",
                 kv_connector_config={"path": sys.argv[2]})
prompts = json.loads(sys.argv[3])
tokens = [o.token_ids for o in llm.generate(prompts, hwplug.SamplingParams(max_tokens=6,
                                                                           ignore_eos=True))]
print(json.dumps([tokens, llm.engine.scheduler.kv_transfer.num_loaded_blocks]))
"""


@pytest.mark.slow
def test_a_second_process_reuses_the_first_ones_prefills(model_dir, prompts, expected,
                                                         tmp_path):
    llm_with(model_dir, "shared_storage", path=tmp_path).generate(prompts, GREEDY)
    result = subprocess.run([sys.executable, "-c", READER, str(model_dir), str(tmp_path),
                             json.dumps(prompts)], capture_output=True, text=True,
                            timeout=300, check=True)
    tokens, loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert tokens == expected and loaded == 3 * 4


# --- faults ---------------------------------------------------------------------------------

def foreign_dtype(path: Path) -> None:
    """Rewrite the block as an engine of another KV dtype would have described it."""
    with safe_open(path, framework="pt") as handle:
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
        metadata = handle.metadata()
    layout = replace(KVLayout.from_json(metadata[LAYOUT_KEY]), kv_cache_dtype="bfloat16")
    save_file(tensors, path, metadata={**metadata, LAYOUT_KEY: layout.to_json()})


FAULTS = {"corrupt": corrupt, "truncated": truncate, "fingerprint": foreign_dtype,
          "another block": another_blocks_kv, "missing": None}


@pytest.mark.parametrize("policy", ["fail", "recompute"])
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_bad_block_fails_or_is_recomputed_by_the_policy(model_dir, prompts, expected,
                                                           tmp_path, fault, policy):
    llm_with(model_dir, "shared_storage", path=tmp_path).generate(prompts[:1], GREEDY)
    if FAULTS[fault] is not None:
        FAULTS[fault](sorted(tmp_path.rglob("*.safetensors"))[1])
    connector = Forgetful if fault == "missing" else "shared_storage"
    llm = llm_with(model_dir, connector, path=tmp_path, policy=policy)
    other = llm.stream(prompts[1], GREEDY)  # another request in flight meanwhile
    if policy == "fail":
        with pytest.raises(KVTransferError, match="could not be loaded by connector"):
            llm.generate(prompts[:1], GREEDY)
    else:
        assert llm.generate(prompts[:1], GREEDY)[0].token_ids == expected[0]
    assert transfer(llm).num_failed_blocks >= 1
    assert "".join(other) == other.output.text and other.output.token_ids == expected[1]
    assert llm._loop.wait_until_idle(timeout=30)
    assert llm.block_manager.num_free_blocks == llm.block_manager.num_blocks


def test_blocks_written_in_another_layout_are_converted(model_dir, prompts, expected, tmp_path,
                                                        other_layouts):
    writer = llm_with(model_dir, "shared_storage", path=tmp_path)
    writer.generate(prompts[:1], GREEDY)
    other = replace(writer.connector.layout, backend="OTHER_ATTN", layout=BLOCKS_LAST.name)
    for path in tmp_path.rglob("*.safetensors"):  # as a BLOCKS_LAST engine would store them
        with safe_open(path, framework="pt") as handle:
            convert = layout_converter(writer.connector.layout, other)
            tensors = {name: convert(handle.get_tensor(name), writer.connector.layout, other)
                       for name in handle.keys()}
            metadata = handle.metadata()
        save_file(tensors, path, metadata={**metadata, LAYOUT_KEY: other.to_json(),
                                           CHECKSUMS_KEY: json.dumps(
            {name: checksum(tensor) for name, tensor in tensors.items()})})
    reader = llm_with(model_dir, "shared_storage", path=tmp_path)
    assert reader.generate(prompts[:1], GREEDY)[0].token_ids == expected[0]
    assert transfer(reader).num_loaded_blocks == 4 and transfer(reader).num_failed_blocks == 0


def test_concurrent_requests_share_one_connector_safely(model_dir, prompts, expected, tmp_path):
    llm = llm_with(model_dir, "shared_storage", path=tmp_path)
    results = {}
    threads = [threading.Thread(target=lambda i=i: results.update(
        {i: llm.generate(prompts[i:i + 1], GREEDY)[0].token_ids})) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert [results[i] for i in range(3)] == expected
