"""The AITER call is checked against the installed AITER when the variant loads (issue 28).

AMD's AITER needs an AMD GPU and is not installed here, so the tests stand in for the
vendor's library at its boundary only: a module object named ``aiter`` whose
``paged_attention_rocm`` has the signature of the release the call is written for (0.1.20:
19 leading parameters, then ``mtp`` and ``q_scale`` with defaults) or a drifted one. The
call's own code, the signature check and the error are hwplug-rocm-aiter's, unmocked.
"""

from __future__ import annotations

import importlib
import importlib.resources
import inspect
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from hwplug.errors import UnsupportedError
from hwplug_rocm_aiter.layout import ROCM_PA, key_view
from hwplug_rocm_aiter.plugin import AITER_REQUIREMENT, TESTED_AITER

API = "hwplug_rocm_aiter.aiter_api"


def _released(out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache, num_kv_heads,
              scale, block_tables, context_lens, block_size, max_context_len, alibi_slopes,
              kv_cache_dtype, k_scale, v_scale, fp8_out_scale=None, partition_size=256, mtp=1,
              q_scale=None):
    """AITER 0.1.20's ``paged_attention_rocm`` signature (aiter/ops/attention.py)."""


def _block_mapping(out, exp_sums, block_mapping, max_logits, tmp_out, query, key_cache,
                   value_cache, num_kv_heads, scale, block_tables, context_lens, block_size,
                   max_context_len, alibi_slopes, kv_cache_dtype, k_scale, v_scale,
                   fp8_out_scale=None, partition_size=256):
    """A drifted signature: a parameter inserted after ``exp_sums``."""


def _new_required(out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache,
                  num_kv_heads, scale, block_tables, context_lens, block_size, max_context_len,
                  alibi_slopes, kv_cache_dtype, k_scale, v_scale, fp8_out_scale,
                  partition_size, workspace):
    """A drifted signature: a new parameter without a default."""


def _load_with(monkeypatch: pytest.MonkeyPatch, function, version: str = TESTED_AITER):
    """Import the call's module against a stand-in ``aiter`` holding ``function`` (each
    call recorded in ``calls``); return both."""
    calls = []

    def recorded(*args, **kwargs):
        calls.append(inspect.signature(function).bind(*args, **kwargs).arguments)

    fake = types.ModuleType("aiter")
    fake.__version__ = version
    if function is not None:
        fake.paged_attention_rocm = recorded
        recorded.__signature__ = inspect.signature(function)
    monkeypatch.setitem(sys.modules, "aiter", fake)
    monkeypatch.delitem(sys.modules, API, raising=False)
    return importlib.import_module(API), calls


def test_the_release_the_call_is_written_for_loads_and_gets_each_tensor_by_name(monkeypatch):
    api, calls = _load_with(monkeypatch, _released)
    cache = torch.randn(ROCM_PA.shape(6, 16, 2, 64), dtype=torch.bfloat16)
    query = torch.randn(3, 8, 64, dtype=torch.bfloat16)
    metadata = SimpleNamespace(max_seq_len=300, block_tables=torch.arange(18).view(3, 6),
                               seq_lens=torch.tensor([300, 17, 64]))
    out = api.paged_attention(query, cache, metadata, SimpleNamespace(scale=0.125))
    (bound,) = calls
    assert bound["query"] is query and bound["out"] is out and out.shape == query.shape
    assert torch.equal(bound["key_cache"], key_view(cache))
    assert bound["key_cache"].shape == (6, 2, 64 // 8, 16, 8)  # x = 16 bytes of bf16
    assert torch.equal(bound["value_cache"], cache[1])
    assert (bound["num_kv_heads"], bound["block_size"], bound["scale"]) == (2, 16, 0.125)
    assert bound["block_tables"] is metadata.block_tables
    assert bound["context_lens"] is metadata.seq_lens
    assert bound["max_context_len"] == 300 and bound["alibi_slopes"] is None
    assert bound["kv_cache_dtype"] == "auto" and bound["partition_size"] == 256
    partitions = -(-300 // 256)
    assert bound["exp_sums"].shape == bound["max_logits"].shape == (3, 8, partitions)
    assert bound["tmp_out"].shape == (3, 8, partitions, 64)


@pytest.mark.parametrize(("function", "problem"), [
    (_block_mapping, "parameter 3 is 'block_mapping', the call passes 'max_logits' there"),
    (_new_required, "it requires parameters the call does not pass: workspace"),
    (None, "it has no paged_attention_rocm"),
])
def test_another_signature_is_refused_at_load_naming_both_versions(monkeypatch, function,
                                                                    problem):
    with pytest.raises(UnsupportedError) as raised:
        _load_with(monkeypatch, function, version="0.1.99")
    message = str(raised.value)
    assert message.startswith(f"unsupported AITER version 0.1.99, tested with {TESTED_AITER}")
    assert problem in message and f"install amd-aiter{AITER_REQUIREMENT}" in message


def test_the_extra_and_the_gate_pin_the_tested_release():
    from packaging.specifiers import SpecifierSet

    pyproject = (importlib.resources.files("hwplug_rocm_aiter").parent / "pyproject.toml")
    assert f'aiter = ["amd-aiter{AITER_REQUIREMENT}"]' in pyproject.read_text()
    pinned = SpecifierSet(AITER_REQUIREMENT)
    assert TESTED_AITER in pinned and "0.1.20.post1" in pinned
    assert "0.1.19" not in pinned and "0.1.21" not in pinned
