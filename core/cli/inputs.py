"""Checked command-line input: a bad value is a one-line typed error, never a traceback.

argparse ``type=`` functions for counts, paths and text (they raise
``argparse.ArgumentTypeError``, which the ``hwplug`` parser turns into a
:class:`~hwplug.errors.ConfigError` naming the argument), and :func:`read_text_file` for
files named on the command line. Text must be valid UTF-8: a shell can pass any bytes,
which Python keeps as lone surrogates that no tokenizer accepts.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hwplug.errors import ConfigError


def number(kind: type[int] | type[float], valid: Callable[[float], bool],
           message: str) -> Callable[[str], Any]:
    """An argparse type: ``kind`` parsed from the text, refused with ``message`` (formatted
    with ``value`` and ``text``) where ``valid`` does not hold."""
    noun = "an integer" if kind is int else "a number"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if not valid(value):
            raise argparse.ArgumentTypeError(message.format(value=value, text=text))
        return value
    return parse


#: An integer of at least 1.
positive_int = number(int, lambda value: value >= 1, "must be at least 1, got {value}")


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
