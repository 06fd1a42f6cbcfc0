"""dtype ``auto``: the platform's best dtype (facts, best first) that the checkpoint allows."""

from __future__ import annotations

import pytest
from fake_hw import x86_cpuinfo
from transformers import LlamaConfig

from hwplug.dtypes import auto_dtype
from hwplug.errors import UnsupportedError
from hwplug.model_zoo.context import create_context
from hwplug.model_zoo.llm_config import LLMConfig
from hwplug.model_zoo.models.llama import LlamaForCausalLM

CPU_WITHOUT_BF16 = "fpu sse avx2 fma f16c"
CPU_WITH_AMX = "fpu sse avx2 fma avx512f avx512_bf16 amx_tile amx_bf16"
CPU_WITH_AVX512_BF16 = "fpu sse avx2 fma f16c avx512f avx512_bf16"  # Zen 4/5: no AMX


@pytest.mark.parametrize("platform_dtypes, checkpoint, expected", [
    (("bfloat16", "float16", "float32"), None, "bfloat16"),        # a GPU, unknown storage
    (("bfloat16", "float16", "float32"), "float32", "bfloat16"),   # fp32 runs in anything
    (("bfloat16", "float16", "float32"), "float16", "float16"),    # fp16 is not cast to bf16
    (("float32", "bfloat16", "float16"), "bfloat16", "float32"),   # a CPU without bf16
    (("bfloat16", "float32", "float16"), "float16", "float32"),    # a bf16 CPU, fp16 weights
])
def test_auto_takes_the_first_platform_dtype_the_checkpoint_allows(platform_dtypes, checkpoint,
                                                                   expected):
    assert auto_dtype(platform_dtypes, checkpoint) == expected


def test_auto_with_nothing_allowed_names_both_lists():
    with pytest.raises(UnsupportedError, match=r"no dtype the platform supports \(bfloat16\) "
                                               r"can hold a float16 checkpoint"):
        auto_dtype(("bfloat16",), "float16")


def tiny_llama(dtype: str) -> LlamaConfig:
    return LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                       num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=64, torch_dtype=dtype)


@pytest.mark.parametrize("flags, checkpoint, expected", [
    (CPU_WITHOUT_BF16, "bfloat16", "float32"),
    (CPU_WITH_AVX512_BF16, "bfloat16", "float32"),
    (CPU_WITH_AVX512_BF16, None, "float32"),
    (CPU_WITH_AMX, "bfloat16", "bfloat16"),
    (CPU_WITH_AMX, "float16", "float32"),
])
def test_a_model_on_the_cpu_platform_gets_the_dtype_its_cpu_runs_best(
        tmp_path, monkeypatch, fresh_discovery, flags, checkpoint, expected):
    x86_cpuinfo(tmp_path, flags)
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(tmp_path))
    ctx = create_context(LlamaForCausalLM, tiny_llama(checkpoint),
                         fresh_discovery.current_platform())
    assert ctx.platform.name == "cpu"
    assert ctx.engine_config.dtype == expected and ctx.engine_config.checkpoint_dtype == checkpoint


def test_an_explicit_dtype_overrides_auto(tmp_path, monkeypatch, fresh_discovery):
    x86_cpuinfo(tmp_path, CPU_WITH_AMX)
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(tmp_path))
    ctx = create_context(LlamaForCausalLM, tiny_llama("bfloat16"),
                         fresh_discovery.current_platform(), LLMConfig(dtype="float32"))
    assert ctx.engine_config.dtype == "float32"
