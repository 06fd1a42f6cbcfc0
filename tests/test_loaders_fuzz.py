"""Loader fuzzing: seeded mutations of real checkpoints load cleanly or fail typed.

Each case copies a real checkpoint, mutates it with a seeded random generator, then loads
it and builds the model (``build_model(load_checkpoint(path))``). Every outcome must be a
clean build or a :class:`~hwplug.errors.ModelError` / :class:`~hwplug.errors.ConfigError`;
any other exception, or a case running past :data:`CASE_LIMIT_S` (a hang), fails the test
with the seed and the mutations, so it reproduces. The checkpoints:

- the packaged SmolLM2 GGUF, cut to 2 layers and 256 tokens (tests/tiny_checkpoints.py;
  the full file takes seconds to parse per case), mutated mostly in its metadata and tensor
  table, where the structure is;
- a tiny Llama directory saved by transformers, mutated in the safetensors header (digits
  of shapes and offsets, dtype names), in raw bytes, and in ``config.json`` values.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import signal
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from gguf import GGUFReader
from tiny_checkpoints import shrink_gguf, write_tiny_llama

from hwplug.errors import ConfigError, ModelError
from hwplug.model_zoo.context import build_model
from hwplug.model_zoo.loaders import load_checkpoint, resolve_model
from hwplug.model_zoo.loaders.gguf_file import GGUF_SIZE_KEYS

pytestmark = pytest.mark.slow  # parses the real GGUF and mutates it many times

#: Cases per checkpoint kind (together about 30 s on 2 cores of an AMD EPYC).
GGUF_CASES = 120
DIRECTORY_CASES = 300
#: A case running longer than this is a hang.
CASE_LIMIT_S = 30
TYPED = (ModelError, ConfigError)
#: Values a mutation writes: the boundaries where parsers and size checks break.
INTEGERS = (0, 1, 2, 0x7F, 0xFF, 0x7FFF_FFFF, 0xFFFF_FFFF, 0x7FFF_FFFF_FFFF_FFFF, 10**7)
DTYPES = ("F32", "F16", "BF16", "I8", "U8", "I32", "I64", "BOOL", "F8_E4M3", "F64", "XX")
CONFIG_VALUES = (0, -1, 1, 3, 10**7, 10**12, 2.5, "x", None, [], {}, True)
#: GGUF metadata keys of the sizes a config states, mutated more often than the rest.
SIZE_KEYS = tuple(GGUF_SIZE_KEYS.values())


class Hang(BaseException):
    """A case ran past :data:`CASE_LIMIT_S` (a BaseException, so that no ``except
    Exception`` in the code under test can turn it into a typed error)."""


@contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    def expire(signum, frame):
        raise Hang(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def write_int(data: bytearray, offset: int, rng: random.Random) -> str:
    value, width = rng.choice(INTEGERS), rng.choice((4, 8))
    data[offset:offset + width] = (value % (1 << 8 * width)).to_bytes(width, "little")
    return f"wrote {value} as {width} bytes at {offset}"


def flip_byte(data: bytearray, offset: int, rng: random.Random) -> str:
    old = data[offset]
    data[offset] = rng.choice((0, 0xFF, old ^ (1 << rng.randrange(8)), rng.randrange(256)))
    return f"byte {offset}: {old} -> {data[offset]}"


def mutate_bytes(data: bytearray, structured_end: int, rng: random.Random) -> list[str]:
    """One to three mutations, most inside ``data[:structured_end]``; sometimes a
    truncation."""
    done = []
    for _ in range(rng.randint(1, 3)):
        end = structured_end if rng.random() < 0.8 else len(data)
        offset = rng.randrange(min(end, len(data)))
        if rng.random() < 0.08:
            del data[offset:]
            done.append(f"truncated to {offset} bytes")
            break
        done.append((write_int if rng.random() < 0.5 else flip_byte)(data, offset, rng))
    return done


def mutate_safetensors_header(data: bytearray, rng: random.Random) -> list[str]:
    """Change a digit (of a shape or an offset) or a dtype name in the JSON header, which
    stays valid JSON (padded with spaces, as the format allows, when it gets shorter)."""
    size = int.from_bytes(data[:8], "little")
    header = data[8:8 + size].decode()
    if rng.random() < 0.5:
        found = rng.choice(list(re.finditer(r"\d", header)))
        new, what = str(rng.randrange(10)), "digit"
    else:
        found = rng.choice(list(re.finditer(r'"dtype":"(\w+)"', header)))
        new, what = rng.choice(DTYPES), "dtype"
    start, end = found.span(found.lastindex or 0)
    encoded = (header[:start] + new + header[end:]).encode().ljust(size)
    data[:8 + size] = len(encoded).to_bytes(8, "little") + encoded
    return [f"header {what} at {start}: {found.group(found.lastindex or 0)} -> {new}"]


def mutate_config(path: Path, rng: random.Random) -> list[str]:
    config = json.loads(path.read_text())
    key = rng.choice(sorted(config))
    config[key] = rng.choice(CONFIG_VALUES)
    path.write_text(json.dumps(config))
    return [f"config.json {key} = {config[key]!r}"]


def outcome(path: Path) -> str:
    """``"loaded"``, or the typed error's class name; anything else propagates."""
    try:
        with time_limit(CASE_LIMIT_S):
            build_model(load_checkpoint(path))
    except TYPED as exc:
        return type(exc).__name__
    return "loaded"


def run_cases(count: int, make_case: Callable[[int, Path], tuple[Path, list[str]]],
              tmp_path: Path) -> dict[str, int]:
    """Run ``count`` seeded cases; fail listing every case with an untyped outcome."""
    seen: dict[str, int] = {}
    bad = []
    for seed in range(count):
        path, mutations = make_case(seed, tmp_path / f"case{seed}")
        try:
            result = outcome(path)
        except (Exception, Hang) as exc:
            where = traceback.extract_tb(exc.__traceback__)[-1]
            bad.append(f"seed {seed} ({'; '.join(mutations)}): {exc!r} at "
                       f"{where.filename}:{where.lineno}")
            continue
        seen[result] = seen.get(result, 0) + 1
        shutil.rmtree(path.parent if path.is_file() else path, ignore_errors=True)
    assert not bad, "untyped outcomes:\n" + "\n".join(bad)
    return seen


Slot = tuple[int, int, str]  # (offset, width in bytes, what it is)


def integer_slots(reader: GGUFReader) -> list[list[Slot]]:
    """Per metadata field and per tensor-table entry, where its integers are (counts,
    lengths, value types, values, dimensions, tensor types and offsets)."""
    slots = []
    for field in [*reader.fields.values(), *(t.field for t in reader.tensors)]:
        offset, found = field.offset, []
        for part in field.parts:
            if part.dtype.kind in "iu" and part.itemsize > 1:
                found += [(offset + i * part.itemsize, part.itemsize, field.name)
                          for i in range(min(part.size, 4))]
            offset += part.nbytes
        slots.append(found)
    return [found for found in slots if found]


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, int, list[list[Slot]]]:
    """The cut SmolLM2 GGUF's bytes, where its tensor data starts, and its integer slots."""
    path = shrink_gguf(resolve_model(None), tmp_path_factory.mktemp("gguf") / "small.gguf")
    reader = GGUFReader(path)
    return path.read_bytes(), reader.data_offset, integer_slots(reader)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NaN weights
def test_mutated_gguf_files_load_or_fail_typed(small_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("HWPLUG_CACHE_DIR", str(tmp_path / "cache"))
    original, data_offset, slots = small_gguf
    sizes = [group[-1:] for group in slots if group[0][2].endswith(SIZE_KEYS)]  # the values

    def make_case(seed: int, case: Path) -> tuple[Path, list[str]]:
        rng = random.Random(seed)
        data = bytearray(original)
        if seed % 3 == 2:
            mutations = mutate_bytes(data, data_offset, rng)
        else:  # a size, or any metadata or tensor-table integer, set to a boundary value
            offset, width, what = rng.choice(rng.choice(sizes if seed % 3 == 0 else slots))
            value = rng.choice(INTEGERS) % (1 << 8 * width)
            data[offset:offset + width] = value.to_bytes(width, "little")
            mutations = [f"{what}: {value} at {offset}"]
        case.mkdir()
        (case / "model.gguf").write_bytes(data)
        return case / "model.gguf", mutations

    seen = run_cases(GGUF_CASES, make_case, tmp_path)
    assert seen.get("ModelError", 0) > GGUF_CASES // 4, seen  # the mutations do bite


def test_mutated_model_directories_load_or_fail_typed(tmp_path):
    pristine = write_tiny_llama(tmp_path / "pristine")
    weights = (pristine / "model.safetensors").read_bytes()
    header_end = 8 + int.from_bytes(weights[:8], "little")

    def make_case(seed: int, case: Path) -> tuple[Path, list[str]]:
        rng = random.Random(seed)
        shutil.copytree(pristine, case)
        kind = seed % 3
        if kind == 2:
            return case, mutate_config(case / "config.json", rng)
        data = bytearray(weights)
        mutations = (mutate_safetensors_header(data, rng) if kind == 0
                     else mutate_bytes(data, header_end, rng))
        (case / "model.safetensors").write_bytes(data)
        return case, mutations

    seen = run_cases(DIRECTORY_CASES, make_case, tmp_path)
    assert seen.get("ModelError", 0) > DIRECTORY_CASES // 4, seen
