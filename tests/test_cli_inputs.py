"""Bad command-line input is a one-line typed error (exit status 2), never a traceback.

Bytes that are not UTF-8 reach ``hwplug`` for real, through a subprocess's argv and a
file; a NUL byte cannot pass through ``exec``, so those cases call ``main`` in-process
(as a script or a test driving it would).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hwplug.cli.main import main


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run ``hwplug argv`` in-process; assert exit status 2 and one line on stderr."""
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    return lines[0]


@pytest.mark.parametrize("argv, message", [
    (["generate", "--prompts-file", "a\0b"],
     "error: ConfigError: hwplug generate: argument --prompts-file: 'a\\x00b' holds a NUL "
     "byte, which no path name can (see hwplug generate --help)"),
    (["generate", "--model", "a\0b", "hi"],
     "error: ModelError: model 'a\\x00b' is not a usable path (embedded null byte); give an "
     "alias"),
    (["new-plugin", "acme", "--dir", "/tmp/a\0b"],
     "error: ConfigError: hwplug new-plugin: argument --dir: '/tmp/a\\x00b' holds a NUL byte"),
    (["generate", "--model", "m" * 5000, "hi"],
     "(5000 characters) is not a usable path (File name too long)"),
    (["embed", "caf\udce9"],
     "error: ConfigError: hwplug embed: argument TEXT: 'caf\\udce9' is not valid UTF-8: "
     "character 3 stands for a byte that no UTF-8 text holds"),
    (["generate", "hi", "--stop", "\udcff"], "argument --stop: '\\udcff' is not valid UTF-8"),
    (["conformance", "cpu", "--kernel-examples", "0"],
     "error: ConfigError: hwplug conformance: argument --kernel-examples: must be at least 1, "
     "got 0 (see hwplug conformance --help)"),
    (["conformance", "cpu", "--attention-examples", "many"],
     "argument --attention-examples: 'many' is not an integer"),
    (["kernels", "--num-tokens", "-4"], "argument --num-tokens: must be at least 1, got -4"),
    (["kernels", "--dtype", "float64"],
     "argument --dtype: invalid choice: 'float64' (choose from 'float32', 'bfloat16'"),
    (["generate", "--max-tokens", "lots", "hi"],
     "error: ConfigError: hwplug generate: argument --max-tokens: invalid int value: 'lots'"),
    ([], "error: ConfigError: hwplug: the following arguments are required: COMMAND"),
    (["nosuch"], "argument COMMAND: invalid choice: 'nosuch'"),
])
def test_bad_arguments_are_one_line_typed_errors(capsys, argv, message):
    line = one_line_error(capsys, argv)
    assert line.startswith(message) if message.startswith("error:") else message in line


def test_a_prompts_file_that_is_not_a_utf8_text_file(capsys, tmp_path: Path):
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("café\n".encode("latin-1"))
    assert one_line_error(capsys, ["generate", "--prompts-file", str(latin1)]) == (
        f"error: ConfigError: --prompts-file {latin1} is not UTF-8 text: byte 0xe9 at offset 3")
    assert one_line_error(capsys, ["generate", "--prompts-file", str(tmp_path)]) == (
        f"error: ConfigError: --prompts-file {tmp_path} is not a regular file")
    assert one_line_error(capsys, ["generate", "--prompts-file", "/dev/zero"]) == (
        "error: ConfigError: --prompts-file /dev/zero is not a regular file")
    missing = tmp_path / "missing.txt"
    assert one_line_error(capsys, ["generate", "--prompts-file", str(missing)]) == (
        f"error: ConfigError: --prompts-file {missing} does not exist")


def test_an_unwritable_plugin_directory_is_a_config_error(capsys, tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the plugin's parent directory should be")
    line = one_line_error(capsys, ["new-plugin", "acme", "--dir", str(blocker / "plugin")])
    assert line.startswith("error: ConfigError: cannot write the plugin into ")
    assert "Not a directory" in line


def test_argv_bytes_that_are_not_utf8_are_refused_in_a_real_process(tmp_path: Path):
    proc = subprocess.run([sys.executable, "-m", "hwplug", "generate", b"caf\xe9"],
                          capture_output=True, env={**os.environ, "LC_ALL": "C.UTF-8"},
                          timeout=120)
    stderr = proc.stderr.decode()
    assert proc.returncode == 2, stderr
    assert stderr.strip().splitlines() == [
        "error: ConfigError: hwplug generate: argument prompt: 'caf\\udce9' is not valid "
        "UTF-8: character 3 stands for a byte that no UTF-8 text holds (see hwplug generate "
        "--help)"]
