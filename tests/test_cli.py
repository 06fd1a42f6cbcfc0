"""The hwplug command as a user runs it: a subprocess, real discovery, real output."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HWPLUG = [sys.executable, "-m", "hwplug"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*HWPLUG, *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)


def test_info_json_reports_platform_plugins_and_settings():
    out = run("info", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["platform"]["name"] == "cpu"
    assert data["platform"]["dist_backend"] == "gloo"
    assert {"cuda", "rocm", "xpu", "tpu", "cpu-arm"} <= {c["name"] for c in data["candidates"]}
    assert all(c["reason"] for c in data["candidates"])
    plugins = {p["name"]: p for p in data["plugins"]}
    assert plugins["cuda"]["status"] == "loaded"
    assert plugins["cuda"]["distribution"] == "hwplug-cuda"
    assert "TORCH_PAGED" in data["registries"]["attention_backends"]
    assert "TRITON_ATTN" in data["registries"]["attention_backends"]
    assert "triton" in data["registries"]["kernels"]["rms_norm"]
    assert data["settings"]["HWPLUG_PLATFORM"] is None
    options = {o["option"]: o for o in data["llm_options"]}  # from LLMConfig's fields
    assert options["max_num_seqs"] == {"option": "max_num_seqs", "flag": "--max-num-seqs",
                                       "variable": None, "default": 64,
                                       "help": "sequences run at once at most"}
    assert options["attention_backend"]["variable"] == "HWPLUG_ATTENTION_BACKEND"


def test_info_table_and_forced_missing_platform():
    out = run("info")
    assert out.returncode == 0 and "platform cpu" in out.stdout
    bad = run("info", env={"HWPLUG_PLATFORM": "rocm"})
    assert bad.returncode == 2
    assert "PlatformError" in bad.stderr and "Traceback" not in bad.stderr
    assert "probe failed" in bad.stderr


@pytest.mark.slow
def test_kernels_explains_rejections():
    out = run("kernels", "--json", "--op", "rms_norm", "--dtype", "float32")
    assert out.returncode == 0, out.stderr
    why = json.loads(out.stdout)["ops"]["rms_norm"]["float32"]
    # the fused C kernel (avx2 build, else the portable one), then torch's fused op
    assert why["chosen"].startswith("fused_")
    assert why["fallbacks"][-2:] == ["torch_fused", "reference"]
    assert why["rejected"]["triton"] == "serves platform cuda, not cpu"


@pytest.mark.slow
def test_kernels_show_the_token_range_a_variant_is_limited_to():
    out = run("kernels", "--json", "--op", "linear", "--dtype", "float32")
    why = json.loads(out.stdout)["ops"]["linear"]["float32"]
    if why["chosen"] != "gemv_avx2":  # a CPU without AVX2
        pytest.skip(f"the C linear does not serve this CPU ({why['rejected']})")
    assert why["num_tokens"] == {"gemv_avx2": [1, 2], "gemm_avx2": [2, None]}
    assert why["fallbacks"][:2] == ["gemm_avx2", "onednn_packed"]
    table = run("kernels", "--op", "linear", "--dtype", "float32", env={"COLUMNS": "200"})
    assert "gemv_avx2 (tokens [1, 2))" in table.stdout
    assert "gemm_avx2 (tokens [2, inf))" in table.stdout
    prefill = run("kernels", "--json", "--op", "linear", "--dtype", "float32",
                  "--num-tokens", "128")
    why = json.loads(prefill.stdout)["ops"]["linear"]["float32"]
    assert why["chosen"] == "gemm_avx2" and why["fallbacks"][0] == "onednn_packed"
    assert why["rejected"]["gemv_avx2"] == "num_tokens 128 outside [1, 2)"


def test_disabled_unknown_kernel_is_a_clean_error():
    out = run("kernels", env={"HWPLUG_DISABLED_KERNELS": "nonexistent"})
    assert out.returncode == 2
    assert "HWPLUG_DISABLED_KERNELS names unknown kernel variants: nonexistent" in out.stderr


@pytest.mark.parametrize("value, message, known", [
    ("rms_nrom=torch_fused", "error: ConfigError: HWPLUG_PREFERRED_KERNELS names unknown ops: "
                             "rms_nrom; known ops: ", "rms_norm"),
    ("rms_norm=torch_fusd", "error: ConfigError: HWPLUG_PREFERRED_KERNELS names unknown "
                            "variants of rms_norm: torch_fusd; known: ", "torch_fused"),
])
def test_preferred_kernels_naming_an_unknown_op_or_variant_is_a_clean_error(value, message,
                                                                             known):
    out = run("kernels", "--op", "silu_and_mul", env={"HWPLUG_PREFERRED_KERNELS": value})
    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    assert line.startswith(message) and known in line.removeprefix(message).split(", "), line


@pytest.mark.parametrize("command", ["models"])
def test_models_lists_builtin_architectures(command):
    out = run(command, "--json")
    assert out.returncode == 0, out.stderr
    assert "LlamaForCausalLM" in json.loads(out.stdout)


def test_an_unexpected_error_is_one_line_and_debug_adds_the_traceback(site, monkeypatch,
                                                                      capsys):
    from hwplug.cli import main

    crash = site.module("crashing_command")
    site.add("acme-cmd", {}, {crash: "def add_arguments(parser):\n    pass\n\n"
                                     "def run(args, console):\n"
                                     "    raise RuntimeError('vendor library crashed')\n"})
    monkeypatch.setitem(main.COMMANDS, "crash", (crash, "a command that crashes"))
    assert main.main(["crash"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: internal error (RuntimeError): vendor library crashed (run with --debug for "
        "the traceback)"]
    for argv, env in ((["crash", "--debug"], None), (["--debug", "crash"], None),
                      (["crash"], "1")):
        if env:
            monkeypatch.setenv("HWPLUG_DEBUG", env)
        assert main.main(argv) == 1
        err = capsys.readouterr().err
        assert "Traceback (most recent call last)" in err and err.rstrip().endswith(
            "error: internal error (RuntimeError): vendor library crashed"), err


def test_a_typed_error_is_one_line_without_a_traceback():
    out = run("kernels", "--op", "no_such_op")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    [line] = out.stderr.strip().splitlines()
    prefix = "error: UnknownNameError: unknown op 'no_such_op'; registered: "
    assert line.startswith(prefix)
    assert {"gelu_and_mul", "linear", "paged_attention", "reshape_and_cache", "rms_norm",
            "rotary_embedding", "scaled_mm", "silu_and_mul"} <= set(
                line.removeprefix(prefix).split(", "))  # and the ops plugins define
