"""``hwplug`` commands that run a model end the process promptly (``os._exit`` after
flushing and the ``atexit`` handlers): the output and exit status are those of a normal
exit, whether stdout is a pipe or a file. The garbage collector, paused while the model
loads, is on again afterwards with the loaded objects frozen."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts hwplug in subprocesses with a real model

#: Runs ``hwplug ARGS`` as the program does (``main()`` without argv), with an atexit
#: handler registered first that must still run and print, and an object that says when
#: the interpreter's teardown frees it (skipped after a model ran).
PROGRAM = """
import atexit, gc, sys
atexit.register(lambda: print(f"gc on {gc.isenabled()}, frozen {gc.get_freeze_count() > 0}",
                              "atexit ran", file=sys.stderr, flush=True))
class Witness:
    def __del__(self):
        sys.__stderr__.write("torn down\\n")
witness = Witness()
from hwplug.cli.main import main
sys.argv = ["hwplug", *sys.argv[1:]]
sys.exit(main())
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}


def _in_process(args: list[str], capfd: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from hwplug.cli.main import main

    code = main(args)  # with argv: returns, never exits
    return code, capfd.readouterr().out


def test_generate_output_and_status_match_the_in_process_command(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    args = ["generate", "The capital of France is", "--max-tokens", "6"]
    piped = subprocess.run([sys.executable, "-c", PROGRAM, *args], capture_output=True,
                           text=True, env=_env(), timeout=180)
    assert piped.returncode == 0, piped.stderr
    assert piped.stderr.rstrip().endswith("atexit ran")
    assert "torn down" not in piped.stderr  # ended without the teardown
    assert "gc on True, frozen True" in piped.stderr  # paused for the load, then frozen
    assert "6 tokens in" in piped.stderr
    with open(tmp_path / "out.txt", "w") as out:  # a file: block-buffered stdout
        to_file = subprocess.run([sys.executable, "-m", "hwplug", *args], stdout=out,
                                 stderr=subprocess.PIPE, text=True, env=_env(), timeout=180)
    assert to_file.returncode == 0, to_file.stderr
    code, text = _in_process(args, capfd)
    assert code == 0 and text.strip()
    assert piped.stdout == text == (tmp_path / "out.txt").read_text()


def test_commands_that_run_no_model_exit_normally() -> None:
    out = subprocess.run([sys.executable, "-c", PROGRAM, "models"], capture_output=True,
                         text=True, env=_env(), timeout=180)
    assert out.returncode == 0, out.stderr
    assert "LlamaForCausalLM" in out.stdout
    assert out.stderr.rstrip().endswith("torn down")  # after the atexit handlers
    assert "gc on True, frozen False" in out.stderr


@pytest.mark.parametrize("args, status", [
    (["generate", "Hi", "--temperature", "-1"], 2),  # a typed error: one line
    (["embed", "Hi", "--model", "/nonexistent/model.gguf"], 2),
])
def test_errors_keep_their_status_and_message(args: list[str], status: int,
                                              capfd: pytest.CaptureFixture[str]) -> None:
    out = subprocess.run([sys.executable, "-c", PROGRAM, *args], capture_output=True,
                         text=True, env=_env(), timeout=180)
    assert out.returncode == status, out.stderr
    assert "error:" in out.stderr and out.stderr.rstrip().endswith("atexit ran")
    from hwplug.cli.main import main

    assert main(args) == status
    assert capfd.readouterr().err.count("error:") == 1
