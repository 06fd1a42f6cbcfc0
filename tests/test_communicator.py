"""Device communicators in real gloo process groups (2 and 3 processes), every collective
against what one process computes from all ranks' inputs, uneven sizes included."""

from __future__ import annotations

import logging

import pytest
import torch
from dist_workers import collectives, expected_collectives, run

from hwplug.communicator import DeviceCommunicator, communicator_for
from hwplug.platforms.cpu.platform import CpuPlatform

DEFAULT = "hwplug.communicator:DeviceCommunicator"


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
def test_every_collective_matches_the_single_process_result(world_size):
    got = run(collectives, world_size, DEFAULT)
    for rank, (ours, theirs) in enumerate(zip(got, expected_collectives(world_size), strict=True)):
        for name, want in theirs.items():
            torch.testing.assert_close(ours[name], want, msg=f"rank {rank}: {name}")
        assert ours["backend"] == "all_to_all"


def test_the_cpu_platform_uses_the_torch_distributed_default():
    assert CpuPlatform.device_communicator is None
    assert DeviceCommunicator.all2all_backends == ("all_to_all",)


def test_an_unsupported_all2all_backend_warns_once_and_uses_the_default(monkeypatch, caplog):
    import torch.distributed as dist

    monkeypatch.setenv("HWPLUG_ALL2ALL_BACKEND", "deepep_low_latency")
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        with caplog.at_level(logging.WARNING):
            comms = [communicator_for(CpuPlatform()) for _ in range(2)]
        assert [c.all2all_backend for c in comms] == ["all_to_all"] * 2
        assert caplog.text.count("does not implement the all-to-all backend "
                                 "'deepep_low_latency'") == 1
    finally:
        dist.destroy_process_group()
