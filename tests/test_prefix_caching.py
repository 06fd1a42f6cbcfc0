"""Prefix caching and KV events: chained block hashes, reuse, LRU eviction, events in order.

The block manager is driven directly for the bookkeeping; ``hwplug.LLM`` on the tiny
random Llama for outputs, which must be identical with the cache on and off, and for the
events a subscriber (and a ZeroMQ subscriber) receives.
"""

from __future__ import annotations

import hashlib
import random
import struct

import pytest
from tiny_llama import tiny_model_dir  # noqa: F401 (fixture)

import hwplug
from hwplug.model_zoo.engine import BlockManager, Sequence
from hwplug.model_zoo.engine.block_hash import hash_block, root_hash
from hwplug.model_zoo.engine.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

SIZE = 4
GREEDY = hwplug.SamplingParams(max_tokens=6, ignore_eos=True)


def computed(manager: BlockManager, seq: Sequence) -> Sequence:
    """Allocate and 'compute' all of ``seq``'s tokens, registering its full blocks."""
    prefix = manager.cached_prefix(seq)
    assert manager.allocate(seq, seq.num_tokens - len(prefix) * SIZE, prefix)
    seq.num_computed_tokens = seq.num_tokens
    manager.cache_full_blocks(seq)
    return seq


# --- hashes ---------------------------------------------------------------------------------

def test_block_hash_is_sha256_of_parent_tokens_and_extra_keys():
    parent = root_hash("model")
    expected = hashlib.sha256(bytes.fromhex(parent) + struct.pack("<4q", 1, 2, 3, 4))
    assert hash_block(parent, [1, 2, 3, 4]) == expected.hexdigest()
    assert hash_block(parent, [1, 2, 3, 4], ("salt",)) != expected.hexdigest()
    assert root_hash("model") != root_hash("other model")


def test_equal_prefixes_share_hashes_and_a_salt_separates_them():
    manager = BlockManager(16, SIZE)
    first = Sequence(list(range(10)))
    second = Sequence(list(range(8)) + [50, 51])
    salted = Sequence(list(range(10)), hwplug.SamplingParams(cache_salt="tenant-a"))
    for seq in (first, second, salted):
        manager.hash_blocks(seq)
    assert len(first.block_hashes) == 2 and first.block_hashes == second.block_hashes
    assert first.block_hashes[1] == hash_block(first.block_hashes[0], [4, 5, 6, 7])
    assert salted.block_hashes[0] != first.block_hashes[0]


# --- the block manager ---------------------------------------------------------------------

def test_a_cached_prefix_is_reused_and_one_token_is_always_computed():
    manager = BlockManager(16, SIZE)
    computed(manager, Sequence(list(range(10))))
    again = Sequence(list(range(10)))
    assert len(manager.cached_prefix(again)) == 2
    exact = Sequence(list(range(8)))  # block-aligned: its last block is recomputed
    assert len(manager.cached_prefix(exact)) == 1
    off = BlockManager(16, SIZE, enable_prefix_caching=False)
    computed(off, Sequence(list(range(10))))
    assert off.cached_prefix(Sequence(list(range(10)))) == []


def test_shared_blocks_are_counted_once_and_freed_blocks_stay_cached():
    manager = BlockManager(6, SIZE)
    first = computed(manager, Sequence(list(range(10))))
    second = computed(manager, Sequence(list(range(9))))
    assert second.block_table[:2] == first.block_table[:2]
    assert manager.num_free_blocks == 6 - 4 and manager.num_hit_blocks == 2
    manager.free(first)
    manager.free(second)
    assert manager.num_free_blocks == 6 and manager.num_cached_blocks == 2


def test_eviction_takes_the_least_recently_released_block():
    events = []
    manager = BlockManager(4, SIZE)
    manager.events.subscribe(events.append)
    old = computed(manager, Sequence([1] * 4 + [2]))  # caches block [1,1,1,1]
    new = computed(manager, Sequence([3] * 4 + [4]))  # caches block [3,3,3,3]
    manager.free(old)
    manager.free(new)
    manager.events.flush()
    assert manager.allocate(Sequence([9] * 8), 8)  # needs 2 blocks: partial ones go first
    assert manager.num_cached_blocks == 2
    manager.allocate(Sequence([8] * 4), 4)  # now one cached block must go: the older one
    manager.events.flush()
    removed = [e for batch in events for e in batch.events if isinstance(e, BlockRemoved)]
    assert [e.block_hashes for e in removed] == [[old.block_hashes[0]]]


# --- through hwplug.LLM ------------------------------------------------------------------

def shared_prefix_prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    system = [rng.randrange(1000, 30000) for _ in range(40)]
    return [system + [rng.randrange(1000, 30000) for _ in range(rng.randrange(1, 25))]
            for _ in range(6)]


def test_outputs_are_identical_with_and_without_prefix_caching(model_dir):
    prompts = shared_prefix_prompts()
    off = hwplug.LLM(model_dir, num_kv_blocks=64, enable_prefix_caching=False)
    on = hwplug.LLM(model_dir, num_kv_blocks=64)
    expected = [o.token_ids for o in off.generate(prompts, GREEDY)]
    first = [o.token_ids for o in on.generate(prompts[:1], GREEDY)]
    rest = [o.token_ids for o in on.generate(prompts[1:], GREEDY)]
    assert first + rest == expected
    assert on.block_manager.num_hit_blocks >= 5 * 2  # the 40-token system prompt, 16/block
    assert off.block_manager.num_hit_blocks == 0
    # a tight cache: hits, evictions and preemptions together still give the same tokens
    tight = hwplug.LLM(model_dir, num_kv_blocks=8, max_num_batched_tokens=16)
    assert [o.token_ids for o in tight.generate(prompts, GREEDY)] == expected


def test_events_arrive_in_order_with_hashes_tokens_and_extra_keys(model_dir):
    llm = hwplug.LLM(model_dir, num_kv_blocks=8)
    batches = []
    unsubscribe = llm.kv_events.subscribe(batches.append)
    prompt = shared_prefix_prompts()[0][:40]
    output = llm.generate([prompt], hwplug.SamplingParams(max_tokens=30, ignore_eos=True,
                                                          cache_salt="tenant-a"))[0]
    events = [event for batch in batches for event in batch.events]
    stored = [e for e in events if isinstance(e, BlockStored)]
    tokens = prompt + output.token_ids
    hashes = [h for e in stored for h in e.block_hashes]
    assert len(hashes) == len(tokens) // 16 == 4  # 69 computed tokens: 4 full blocks
    seq = Sequence(tokens, hwplug.SamplingParams(cache_salt="tenant-a"),
                   root_hash=llm.engine.root_hash)
    llm.block_manager.hash_blocks(seq)
    assert hashes == seq.block_hashes[:4]
    assert stored[0].parent_block_hash == llm.engine.root_hash
    for event in stored[1:]:
        assert event.parent_block_hash == hashes[hashes.index(event.block_hashes[0]) - 1]
    assert [t for e in stored for t in e.token_ids] == tokens[:64]
    assert [k for e in stored for k in e.extra_keys] == [("tenant-a",), (), (), ()]
    assert all(e.block_size == 16 for e in stored)
    # an 8-block cache: a different prompt evicts them, least recently released first
    llm.generate([shared_prefix_prompts(1)[0][:40]], hwplug.SamplingParams(
        max_tokens=70, ignore_eos=True))
    removed = [h for batch in batches for e in batch.events if isinstance(e, BlockRemoved)
               for h in e.block_hashes]
    assert removed and removed[0] == hashes[-1]
    assert llm.reset_prefix_cache()
    assert isinstance(batches[-1].events[-1], AllBlocksCleared)
    unsubscribe()
    count = len(batches)
    llm.generate([prompt], GREEDY)
    assert len(batches) == count


def test_events_are_published_over_zeromq(model_dir):
    zmq = pytest.importorskip("zmq")
    from hwplug.model_zoo.engine.zmq_events import decode_batch

    llm = hwplug.LLM(model_dir, num_kv_blocks=16, kv_events_endpoint="tcp://127.0.0.1:*")
    socket = zmq.Context.instance().socket(zmq.SUB)
    socket.connect(llm.kv_events_endpoint)
    socket.setsockopt(zmq.SUBSCRIBE, b"kv-events")
    received = []
    for attempt in range(50):  # a SUB socket misses what is sent before it joined
        llm.generate([[1000 + attempt] * 20], GREEDY)
        if socket.poll(100):
            received.append(socket.recv_multipart())
            break
    assert received, "no KV event batch arrived over ZeroMQ"
    topic, sequence, payload = received[0]
    batch = decode_batch(payload)
    assert topic == b"kv-events" and len(sequence) == 8
    assert isinstance(batch.events[0], BlockStored) and len(batch.events[0].token_ids) == 16
    socket.close(linger=0)
    llm.close()
