"""hwplug-xpu's communicator in real gloo process groups: every collective, dispatch and
combine by all-gather + reduce-scatter included, against the single-process result."""

from __future__ import annotations

import pytest
import torch
from dist_workers import collectives, expected_collectives, run

from hwplug.communicator import communicator_for
from hwplug_xpu.communicator import XpuCommunicator
from hwplug_xpu.platform import XpuPlatform

XPU = "hwplug_xpu.communicator:XpuCommunicator"


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
def test_allgather_reducescatter_all_to_all_matches_the_single_process_result(world_size):
    got = run(collectives, world_size, XPU)
    for rank, (ours, theirs) in enumerate(zip(got, expected_collectives(world_size),
                                              strict=True)):
        assert ours["backend"] == "allgather_reducescatter"
        for name, want in theirs.items():
            torch.testing.assert_close(ours[name], want, msg=f"rank {rank}: {name}")


def test_the_xpu_platform_names_its_communicator(monkeypatch):
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert type(communicator_for(XpuPlatform())) is XpuCommunicator
        monkeypatch.setenv("HWPLUG_ALL2ALL_BACKEND", "all_to_all")
        assert communicator_for(XpuPlatform()).all2all_backend == "all_to_all"
    finally:
        dist.destroy_process_group()
