"""A plugin cannot change torch's process-global state behind hwplug's back: what its
import or hooks change (default dtype, default device, grad mode, thread count) is put
back, with a warning naming the plugin and the change."""

from __future__ import annotations

import logging

import pytest
import torch

#: Changes torch's state at import and in a hook, as careless plugin code does.
MEDDLING = """
import torch
from hwplug import hookimpl

hwplug_api_version = ">=1,<2"
torch.set_default_dtype(torch.float64)
torch.set_grad_enabled(False)

@hookimpl
def hwplug_register_kernels(registry):
    torch.set_num_threads(1)
"""


@pytest.fixture
def torch_state_restored():
    """The test process's torch state as it was, whatever the plugin left."""
    dtype, grad, threads = torch.get_default_dtype(), torch.is_grad_enabled(), \
        torch.get_num_threads()
    yield
    torch.set_default_dtype(dtype)
    torch.set_grad_enabled(grad)
    torch.set_num_threads(threads)


def test_a_plugins_changes_to_torch_state_are_put_back(site, fresh_discovery, caplog,
                                                     torch_state_restored):
    threads = torch.get_num_threads()
    assert threads > 1, "the check needs a machine with 2 or more torch threads"
    module = site.module("meddling")
    site.add("acme-meddling", {"hwplug.plugins": {"meddling": module}}, {module: MEDDLING})
    with caplog.at_level(logging.WARNING, logger="hwplug.discovery.torch_state"):
        resolution = fresh_discovery.discover()
    assert {r.name: r.status for r in resolution.plugins}["meddling"] != "failed"
    assert torch.get_default_dtype() == torch.float32
    assert torch.is_grad_enabled()
    assert torch.get_num_threads() == threads
    assert [r.getMessage() for r in caplog.records] == [
        "plugin meddling changed torch's process-global state in its import (default dtype "
        "torch.float32 -> torch.float64; grad mode enabled -> disabled): put back",
        f"plugin meddling changed torch's process-global state in its hwplug_register_kernels "
        f"(threads {threads} -> 1): put back"]
