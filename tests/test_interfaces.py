"""Extension classes are checked at definition; registries and env vars behave as documented."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hwplug import envs
from hwplug.attention import AttentionSpec
from hwplug.attention_selection import select_backend, settle_attention
from hwplug.config import EngineConfig
from hwplug.errors import (
    ConfigError,
    DuplicateNameError,
    RemovedError,
    UnknownNameError,
    UnsupportedError,
)
from hwplug.platform_interface import DeviceCapability, Platform
from hwplug.platforms.cpu.platform import CpuPlatform
from hwplug.registry import Registry


def test_misspelt_platform_method_fails_at_class_creation():
    with pytest.raises(TypeError, match="get_device_capabilty is not part of the Platform "
                                        "interface; did you mean 'get_device_capability'"):
        class Bad(Platform):
            def get_device_capabilty(self, device_id=0):
                return None


def test_incompatible_override_fails_at_class_creation():
    with pytest.raises(TypeError, match="incompatible signature: new parameter 'extra'"):
        class Bad(Platform):
            def memory_info(self, device_id=0, *, extra):
                return None

    with pytest.raises(TypeError, match="parameter 'device_id' is missing"):
        class AlsoBad(Platform):
            def get_device_name(self):
                return "x"


def test_private_helpers_are_allowed():
    class Fine(Platform):
        name = "fine"

        def _helper(self):
            return 1

    assert Fine()._helper() == 1


def test_backend_validate_explains_each_reason():
    from hwplug.kernel_registry.torch_paged import TorchPagedBackend

    class Narrow(TorchPagedBackend):
        supported_head_sizes = (64, 128)
        supports_sliding_window = False
        supported_kv_cache_dtypes = ("float32",)

        @classmethod
        def get_name(cls):
            return "NARROW"

    spec = AttentionSpec(num_heads=6, num_kv_heads=4, head_size=80, dtype="bfloat16",
                         block_size=24, sliding_window=128)
    reasons = Narrow.validate(spec)
    assert "head size 80 not in 64, 128" in reasons
    assert "block size 24 not in 1, 8, 16, 32, 64, 128, 256" in reasons
    assert "sliding window not supported" in reasons
    assert "KV-cache dtype bfloat16 not in float32" in reasons
    assert "6 query heads not a multiple of 4 KV heads" in reasons
    assert TorchPagedBackend.validate(AttentionSpec(8, 2, 64)) == []


def test_backend_selection_and_override(fresh_discovery):
    platform = fresh_discovery.current_platform()
    spec = AttentionSpec(num_heads=8, num_kv_heads=2, head_size=64)
    assert select_backend(platform, spec).backend.get_name() == "TORCH_PAGED"
    with pytest.raises(UnknownNameError, match="unknown attention backend 'NOPE'"):
        select_backend(platform, spec, "NOPE")


def test_platform_without_backends_says_so(fresh_discovery):
    class Bare(Platform):
        name = "bare"
        supported_dtypes = ("float32",)
        supported_kv_cache_dtypes = ("float32",)

    fresh_discovery.current_platform()
    with pytest.raises(UnsupportedError, match="declares no attention backend"):
        select_backend(Bare(), AttentionSpec(4, 4, 64))


def test_block_size_is_settled_at_configuration(fresh_discovery):
    platform = fresh_discovery.current_platform()
    config = EngineConfig(num_heads=4, num_kv_heads=2, head_size=64, dtype="float32")
    platform.check_and_update_config(config)
    assert (config.block_size, config.attention_backend, config.kv_cache_dtype) == (
        16, "TORCH_PAGED", "float32")
    odd = EngineConfig(num_heads=4, num_kv_heads=2, head_size=64, dtype="float32", block_size=24)
    with pytest.raises(ConfigError, match="block_size 24 is not accepted by the attention "
                                          "backends that can serve this model: TORCH_PAGED "
                                          "accepts 1, 8, 16, 32"):
        settle_attention(platform, odd)
    assert odd.block_size == 24 and odd.attention_backend is None  # nothing half-settled
    with pytest.raises(UnsupportedError, match="dtype 'fp8_e4m3' is not supported.*float32"):
        platform.check_and_update_config(EngineConfig(4, 2, 64, dtype="fp8_e4m3"))


PROCESS_ENV_PROBE = """
import os, hwplug
platform = hwplug.current_platform()
first = platform.apply_process_env()
import torch
print(first, platform.apply_process_env(), os.environ.get("GOMP_SPINCOUNT"))
"""


@pytest.mark.parametrize(("preset", "expected"), [
    (None, "{'GOMP_SPINCOUNT': '10000000'} {} 10000000"),
    ({"GOMP_SPINCOUNT": "500"}, "{} {} 500"),  # the user's choice stands
    ({"OMP_WAIT_POLICY": "PASSIVE"}, "{} {} None"),  # and so does their wait policy
], ids=["unset", "user-set", "user-policy"])
@pytest.mark.slow
def test_cpu_process_env_is_applied_before_torch_loads(preset, expected):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(preset or {})
    out = subprocess.run([sys.executable, "-c", PROCESS_ENV_PROBE], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected


def test_capability_comparisons():
    assert DeviceCapability.parse("8.9") > DeviceCapability(8, 0)
    assert DeviceCapability.parse((9, 0)).as_int() == 90
    assert not CpuPlatform().has_capability("7.0")


def test_registry_lifecycle():
    reg: Registry[int] = Registry("widget")
    reg.register("old", 1)
    reg.register("lazy", "math:pi")
    assert reg.get("lazy") == pytest.approx(3.14159, abs=1e-4)
    with pytest.raises(DuplicateNameError):
        reg.register("old", 2)
    reg.register("old", 2, override=True)
    reg.deprecate("old", "new")
    assert reg.get("old") == 2
    reg.remove("old", "new")
    with pytest.raises(RemovedError, match="widget 'old' was removed; use 'new' instead"):
        reg.get("old")
    with pytest.raises(UnknownNameError, match="unknown widget 'x'; registered: lazy"):
        reg.get("x")


def test_env_parsing_and_errors(monkeypatch):
    monkeypatch.setenv("HWPLUG_DISABLED_KERNELS", " a, b ,")
    assert envs.HWPLUG_DISABLED_KERNELS == ("a", "b")
    monkeypatch.setenv("HWPLUG_PREFERRED_KERNELS", "rms_norm=x|y")
    assert envs.HWPLUG_PREFERRED_KERNELS == {"rms_norm": ("x", "y")}
    monkeypatch.setenv("HWPLUG_PREFERRED_KERNELS", "rms_norm")
    with pytest.raises(ConfigError, match="expected op=variant"):
        envs.get("HWPLUG_PREFERRED_KERNELS")
    monkeypatch.setenv("HWPLUG_LOG_LEVEL", "loud")
    with pytest.raises(ConfigError, match="debug, info, warning, error"):
        envs.get("HWPLUG_LOG_LEVEL")
    with pytest.raises(ConfigError, match="not a declared hwplug variable"):
        envs.get("HWPLUG_NOPE")
