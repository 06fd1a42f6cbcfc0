"""``hwplug generate`` and ``hwplug embed`` as a user runs them: subprocesses, real models.

The embedding printed by ``hwplug embed --json`` is compared with transformers'
``BertModel`` on the same checkpoint, mean-pooled and L2-normalised.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from hwplug import current_platform

pytestmark = pytest.mark.slow  # each test starts hwplug in a subprocess with a real model

HWPLUG = [sys.executable, "-m", "hwplug"]


def run(*args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items()
            if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    return subprocess.run([*HWPLUG, *args], capture_output=True, text=True,
                          env={**base, **env}, timeout=180)


def test_generate_streams_text_then_reports_speed_and_kernels():
    out = run("generate", "The capital of France is", "--max-tokens", "8", "--verbose",
              COLUMNS="500")
    assert out.returncode == 0, out.stderr
    # one prompt: the KV cache is for one sequence of the context, capped (SmolLM2: 8192)
    assert re.search(r"option max_num_seqs\s*│\s*1\s", out.stderr), out.stderr
    assert "max_model_len=4096 tokens" in out.stderr
    assert "the model's context length 8192, capped at 4096" in out.stderr
    # the blocks are used in place from the file, nothing is dequantized
    assert "in place: mapped from SmolLM2-135M-Instruct.Q4_1.gguf" in out.stderr
    assert "dequantized: none" in out.stderr
    assert out.stdout.strip()
    assert "8 tokens in" in out.stderr and "tokens/s" in out.stderr
    assert "platform cpu, attention backend TORCH_PAGED" in out.stderr
    # the 6-token prefill (as one decode row per query) and the decode steps go to the
    # fused C decode kernel; ops the model never calls are not listed
    assert re.search(r"paged_attention=fused_(avx2|c)\b(?!\+)", out.stderr), out.stderr
    # the packaged GGUF keeps its blocks: its linears run the C kernel on them
    assert "weights gguf" in out.stderr and "ggml_linear=ggml_" in out.stderr
    assert " linear=" not in out.stderr and "scaled_mm" not in out.stderr
    # every decode step after the first (eager, before the recording) replayed the
    # batch-1 step graph
    assert "step graphs: decode batches of up to 1 sequences replayed (6 steps)" in out.stderr
    eager = run("generate", "The capital of France is", "--max-tokens", "8",
                "--no-step-graphs")
    assert eager.stdout == out.stdout and "step graphs: off" in eager.stderr


def test_dequantize_loads_float_weights_for_the_float_kernels():
    out = run("generate", "The capital of France is", "--max-tokens", "2", "--dequantize",
              "--kv-cache-dtype", "fp8_e4m3", "--calculate-kv-scales",
              "--kv-scale-granularity", "head", "--verbose", COLUMNS="500")
    assert out.returncode == 0, out.stderr
    assert re.search(r"dequantized: \d+ matrices \([\d.]+ MiB\): dequantize=True was asked",
                     out.stderr), out.stderr
    assert "KV cache fp8_e4m3" in out.stderr
    assert "weights unquantized" in out.stderr
    # AVX2 CPUs: the prompt through the C GEMM, the one-row decode step the C GEMV
    c_linear = {"avx2", "fma", "f16c"} <= current_platform().facts.features
    linear = "gemm_avx2+gemv_avx2" if c_linear else "onednn_packed"
    assert re.search(rf"linear={re.escape(linear)}(,|$)", out.stderr, re.M), out.stderr
    assert "ggml_linear" not in out.stderr


def test_generate_takes_every_llm_option_as_a_flag_and_shows_the_resolved_config(tmp_path):
    config = tmp_path / "connector.json"
    config.write_text(json.dumps({"path": str(tmp_path / "store")}))
    out = run("generate", "Hello", "--max-tokens", "2", "--verbose", "--max-num-seqs", "3",
              "--num-kv-blocks", "40", "--kv-connector", "shared_storage",
              "--kv-connector-config", f"@{config}", "--no-enable-prefix-caching")
    assert out.returncode == 0, out.stderr
    assert "resolved configuration" in out.stderr
    for setting in ("num_kv_blocks", "40", "option max_num_seqs", "option kv_connector",
                    "shared_storage", "option enable_prefix_caching", "attention_backend"):
        assert setting in out.stderr
    bad = run("generate", "Hello", "--kv-connector-config", "{not json")
    assert bad.returncode == 2 and "argument --kv-connector-config: not valid JSON" in bad.stderr
    bad = run("generate", "Hello", "--kv-connector-config", '{"path": "x"}')
    assert bad.returncode == 2 and ("kv_connector_config and kv_load_failure_policy need a "
                                    "kv_connector") in bad.stderr


def test_the_connector_options_have_hwplug_variables(tmp_path):
    store = tmp_path / "store"
    config = tmp_path / "connector.json"
    config.write_text(json.dumps({"path": str(store)}))
    out = run("generate", "The capital of France is", "--max-tokens", "2", "--verbose",
              HWPLUG_KV_CONNECTOR="shared_storage", HWPLUG_KV_CONNECTOR_CONFIG=f"@{config}",
              HWPLUG_KV_LOAD_FAILURE_POLICY="recompute")
    assert out.returncode == 0, out.stderr
    for setting in ("option kv_connector", "shared_storage", "recompute"):
        assert setting in out.stderr
    assert any(store.rglob("*")), "the connector saved no block"
    bad = run("generate", "Hello", HWPLUG_KV_CONNECTOR="shared_storage",
              HWPLUG_KV_CONNECTOR_CONFIG="{not json")
    assert bad.returncode == 2 and "not valid JSON" in bad.stderr
    bad = run("generate", "Hello", HWPLUG_KV_LOAD_FAILURE_POLICY="sometimes")
    assert bad.returncode == 2
    assert "HWPLUG_KV_LOAD_FAILURE_POLICY='sometimes' is not valid" in bad.stderr


def test_generate_a_batch_from_a_prompts_file(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hello, my name is\n\nThe sky is\n")
    out = run("generate", "--prompts-file", str(prompts), "--max-tokens", "4", "--chat")
    assert out.returncode == 0, out.stderr
    assert "[0] Hello, my name is" in out.stdout and "[1] The sky is" in out.stdout
    assert "tokens/s" in out.stderr


def test_speculative_decoding_reports_its_acceptance_and_refuses_a_bad_config():
    prompt = "Colors: red, green, blue, yellow, red, green, blue, yellow, red, green,"
    spec = run("generate", prompt, "--max-tokens", "16", "--max-model-len", "256",
               "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}')
    plain = run("generate", prompt, "--max-tokens", "16", "--max-model-len", "256")
    assert spec.returncode == 0 and spec.stdout == plain.stdout, spec.stderr
    found = re.search(r"speculative decoding \(ngram, k=4, prompt_lookup_min=3, "
                      r"prompt_lookup_max=16, prompt_lookup_unambiguous=True\): (\d+) of "
                      r"(\d+) proposed tokens accepted \(\d+%\), ([\d.]+) tokens per verify "
                      r"step", spec.stderr)
    assert found and 0 < int(found[1]) <= int(found[2]), spec.stderr
    bad = run("generate", "hi", "--speculative-config", '{"method": "medusa"}')
    assert bad.returncode == 2 and "must be one of draft_model, ngram" in bad.stderr


def test_a_missing_model_is_a_one_line_error(tmp_path):
    out = run("generate", "hi", "--model", str(tmp_path / "missing.gguf"))
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "error:" in out.stderr


def test_invalid_sampling_value_is_a_config_error():
    out = run("generate", "hi", "--top-p", "0")
    assert out.returncode == 2 and "ConfigError" in out.stderr and "(0, 1]" in out.stderr


def test_embed_json_matches_transformers_mean_pooling():
    from transformers import BertModel

    from hwplug.model_zoo.loaders import load_checkpoint, resolve_model

    texts = ["A man is eating food.", "hwplug embeds text"]
    out = run("embed", *texts, "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["dimension"] == 384 and len(data["embeddings"]) == 2
    ours = torch.tensor([item["embedding"] for item in data["embeddings"]])

    path = resolve_model("all-minilm-l6-v2")
    tokenizer = load_checkpoint(path).tokenizer
    reference = BertModel.from_pretrained(path, add_pooling_layer=False).eval()
    encoded = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.inference_mode():
        hidden = reference(**encoded).last_hidden_state
    mask = encoded.attention_mask[..., None].float()
    theirs = F.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    assert F.cosine_similarity(ours, theirs).min() > 0.9999


def test_generate_on_an_encoder_says_to_use_embed():
    out = run("generate", "hi", "--model", "all-minilm-l6-v2")
    assert out.returncode == 2 and "use embed()" in out.stderr


def test_an_unregistered_architecture_lists_the_registered_ones(tmp_path):
    from hwplug.model_zoo.loaders import resolve_model

    source = resolve_model("all-minilm-l6-v2")
    for item in source.iterdir():  # the real checkpoint, but a config naming another arch
        if item.name != "config.json":
            (tmp_path / item.name).symlink_to(item)
    config = json.loads((source / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config,
                                                      "architectures": ["FooForMaskedLM"]}))
    out = run("embed", "hi", "--model", str(tmp_path), HWPLUG_LOG_LEVEL="info")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "platform cpu set GOMP_SPINCOUNT=10000000" in out.stderr  # before torch loaded
    assert "unknown model architecture 'FooForMaskedLM'; registered: BertModel" in out.stderr
    assert "hwplug.register_model(" in out.stderr
