"""Checked command-line input: a bad value is a one-line typed error, never a traceback.

argparse ``type=`` functions for counts, paths and text (they raise
``argparse.ArgumentTypeError``, which the ``hwplug`` parser turns into a
:class:`~hwplug.errors.ConfigError` naming the argument), and :func:`read_text_file` for
files named on the command line. Text must be valid UTF-8: a shell can pass any bytes,
which Python keeps as lone surrogates that no tokenizer accepts.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hwplug.errors import ConfigError


def positive_int(text: str) -> int:
    """An integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def path_name(text: str) -> Path:
    """A path name, which cannot hold a NUL byte."""
    if "\0" in text:
        raise argparse.ArgumentTypeError(f"{text!r} holds a NUL byte, which no path name can")
    return Path(text)


def utf8_text(text: str) -> str:
    """Text that is valid UTF-8 (no lone surrogates, as undecodable argument bytes become)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not valid UTF-8: character {exc.start} stands for a byte that no "
            "UTF-8 text holds") from None
    return text


def read_text_file(file: Path, what: str) -> str:
    """The UTF-8 text of the regular file ``file``; :class:`ConfigError` naming ``what``
    (e.g. ``--prompts-file``) when it is missing, not a regular file (a directory, a
    device), unreadable or not UTF-8."""
    try:
        if not file.is_file():
            problem = "is not a regular file" if file.exists() else "does not exist"
            raise ConfigError(f"{what} {file} {problem}")
        return file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {file}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {file} is not UTF-8 text: byte 0x{exc.object[exc.start]:02x} "
                          f"at offset {exc.start}") from None
