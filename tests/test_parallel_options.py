"""Parallel runs fail fast and typed (issue 29, item 7): the ``p2p`` connector's
rendezvous options and the KV-events endpoint are checked before anything waits or binds;
a p2p peer that never comes is a ``KVTransferError`` within ``timeout_s``. (Tensor-parallel
ranks that die or never join: tests/test_workers.py.)
"""

from __future__ import annotations

import time

import pytest
import torch.distributed as dist
from dist_workers import free_port

from hwplug.connector import KVLayout, KVTransferError
from hwplug.errors import ConfigError
from hwplug.model_zoo.connectors.p2p import P2PConnector
from hwplug.model_zoo.engine.zmq_events import ZmqEventPublisher
from hwplug.model_zoo.llm_config import LLMConfig

LAYOUT = KVLayout(backend="TORCH_PAGED", layout="NHD", kv_cache_dtype="float32", block_size=16,
                  num_kv_heads=2, head_size=16, num_layers=2)


def tcp() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


@pytest.mark.parametrize(("options", "named"), [
    ({"rank": 0, "world_size": 1}, "world_size must be .*>= 2"),
    ({"rank": "0", "world_size": 2}, "rank must be"),
    ({"rank": 2, "world_size": 2}, "rank 2 is outside world_size 2"),
    ({"rank": 0, "world_size": 2, "peer_rank": 0}, "peer_rank 0 is this connector's own rank"),
    ({"rank": 0, "world_size": 2, "peer_rank": 5}, "peer_rank 5 is outside world_size 2"),
    ({"rank": 0, "world_size": 2, "init_method": "tcp://127.0.0.1:99999"}, "init_method"),
    ({"rank": 0, "world_size": 2, "init_method": "udp://127.0.0.1:5"}, "init_method"),
    ({"rank": 0, "world_size": 2, "init_method": 29500}, "init_method"),
    ({"rank": 0, "world_size": 2, "timeout_s": "soon"}, "timeout_s"),
    ({"rank": 0, "world_size": 2, "timeout_s": -1}, "timeout_s"),
    ({"rank": 0, "world_size": 2, "max_bytes": "1GB"}, "max_bytes"),
])
def test_p2p_rendezvous_options_are_checked_before_anything_waits(options, named):
    started = time.monotonic()
    with pytest.raises(ConfigError, match=named):
        P2PConnector(LAYOUT, role="producer", **{"init_method": tcp(), **options})
    assert time.monotonic() - started < 5
    assert not dist.is_initialized()


def test_a_world_of_one_is_refused_at_once_not_after_a_wait_for_a_peer(monkeypatch):
    port = free_port()
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0",
                        "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(name, value)
    started = time.monotonic()
    with pytest.raises(ConfigError, match="the group has 1 rank, a p2p pair needs two"):
        P2PConnector(LAYOUT, role="consumer")  # env://, joined alone
    assert time.monotonic() - started < 5
    assert not dist.is_initialized()  # the group it made is gone


def test_a_peer_that_never_joins_is_a_transfer_error_within_timeout_s():
    started = time.monotonic()
    with pytest.raises(KVTransferError, match=r"could not join tcp://127\.0\.0\.1:\d+ as rank "
                                              r"0 of 2 within 1 s"):
        P2PConnector(LAYOUT, role="producer", rank=0, world_size=2, init_method=tcp(),
                     timeout_s=1)
    assert time.monotonic() - started < 10
    assert not dist.is_initialized()


@pytest.mark.parametrize("endpoint", ["tcp://*:99999", "tcp://*:0", "tcp://*", 5557,
                                      "udp://127.0.0.1:5557", "127.0.0.1:5557", ""])
def test_a_kv_events_endpoint_that_is_not_one_to_bind_names_the_option(endpoint):
    with pytest.raises(ConfigError, match="kv_events_endpoint"):
        LLMConfig.create(kv_events_endpoint=endpoint)
    with pytest.raises(ConfigError, match="endpoint"):
        ZmqEventPublisher(endpoint)


def test_a_valid_kv_events_endpoint_binds_the_port_it_names():
    endpoint = tcp()
    assert LLMConfig.create(kv_events_endpoint=endpoint).kv_events_endpoint == endpoint
    publisher = ZmqEventPublisher(endpoint)
    assert publisher.endpoint == endpoint
    publisher.close()
