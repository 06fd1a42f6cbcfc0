"""The repacked-weights cache (:mod:`hwplug.model_zoo.loaders.repacked_cache`): a second
load maps the runs the first repacked (no repack runs, logits bitwise the same); a
truncated or corrupt cache is rebuilt, saying so; a changed GGUF gets a new entry, which
replaces the old one; ``discard_for`` removes a file's entry."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from test_gguf_quantized import (
    _inside,
    _mappings,
    prefill_logits,
    v_in_q8_0,  # noqa: F401 - a fixture
)
from test_gguf_repacked import _build, k_gguf  # noqa: F401 - k_gguf is a fixture

from hwplug import envs
from hwplug.model_zoo.loaders.cache import SOURCE_NAME
from hwplug.model_zoo.loaders.memory import format_bytes
from hwplug.model_zoo.loaders.repacked_cache import (
    CACHE_KIND,
    INDEX_NAME,
    JOIN_BUILD,
    PACKED_NAME,
    discard_for,
)
from hwplug.model_zoo.weights_report import JOINED, summarize, weight_storage

PROMPTS = (list(range(3, 26)), [7])


def _entries(joins: bool = False) -> list[Path]:
    """The entries of repacked runs (``joins``: of joined runs)."""
    root = envs.HWPLUG_CACHE_DIR.expanduser() / CACHE_KIND
    entries = sorted(p for p in root.iterdir() if not p.name.startswith(".")) \
        if root.is_dir() else []
    return [entry for entry in entries
            if (json.loads((entry / INDEX_NAME).read_text())["build"] == JOIN_BUILD) == joins]


@pytest.fixture
def no_repacked_cache() -> None:
    """Start without any repacked-weights entry (other tests may have written some)."""
    shutil.rmtree(envs.HWPLUG_CACHE_DIR.expanduser() / CACHE_KIND, ignore_errors=True)


def _load(path: Path, monkeypatch: pytest.MonkeyPatch):
    """``(logits of each prompt, repacked runs, the plan's ops used)`` of a fresh load."""
    _, model, ctx = _build(path, monkeypatch, True)
    runs = [rows for m in model.modules()
            for index, (_, rows) in enumerate(getattr(m, "gguf_runs", ()))
            if index in m.gguf_repacked]
    logits = [prefill_logits(model, ctx, ids) for ids in PROMPTS]
    return logits, runs, ctx.kernels.used()


def test_a_second_load_maps_the_cache_and_gives_the_same_logits(
        k_gguf: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        no_repacked_cache: None) -> None:
    first, first_runs, used = _load(k_gguf, monkeypatch)
    assert used["ggml_repack"] == {"ggml_vnni"} and first_runs
    entry, = _entries()
    packed = entry / PACKED_NAME
    assert packed.stat().st_size == pytest.approx(
        sum(r.numel() for r in first_runs), abs=64 * len(first_runs))
    second, runs, used = _load(k_gguf, monkeypatch)
    assert "ggml_repack" not in used  # nothing repacked
    assert used["ggml_linear_repacked"] == {"ggml_vnni"}
    ranges = _mappings(packed)
    assert ranges and all(_inside(run, ranges) for run in runs)  # the cache's pages
    for got, want in zip(second, first, strict=True):
        assert torch.equal(got, want)
    assert [r.shape for r in runs] == [r.shape for r in first_runs]
    assert all(torch.equal(a, b) for a, b in zip(runs, first_runs, strict=True))
    assert _entries() == [entry]


def test_the_weights_report_names_the_cache_the_runs_are_mapped_from(
        k_gguf: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        no_repacked_cache: None) -> None:
    def repacked_groups() -> list:
        _, model, _ = _build(k_gguf, monkeypatch, True)
        return [g for g in weight_storage(model) if "repacked once" in g.why]

    first = repacked_groups()
    assert first and all(g.where == "memory" for g in first)  # this load repacked them
    second = repacked_groups()
    assert second and all(g.where == "in place: mapped from the repacked-weights cache "
                          f"({PACKED_NAME})" for g in second)
    assert sum(g.nbytes for g in second) == sum(g.nbytes for g in first)
    assert summarize(second).startswith(f"{format_bytes(sum(g.nbytes for g in second))} "
                                        "in place in mapped files")


@pytest.mark.parametrize("damage", ["truncated", "overwritten", "no index"])
def test_a_damaged_cache_is_rebuilt(k_gguf: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
                                    caplog: pytest.LogCaptureFixture, damage: str,
                                    no_repacked_cache: None) -> None:
    want, _, _ = _load(k_gguf, monkeypatch)
    entry, = _entries()
    packed = entry / PACKED_NAME
    size = packed.stat().st_size
    if damage == "truncated":
        os.truncate(packed, size // 2)
    elif damage == "overwritten":
        with open(packed, "r+b") as file:
            file.write(bytes(4096))
    else:
        (entry / INDEX_NAME).unlink()
    got, _, used = _load(k_gguf, monkeypatch)
    assert "repacked-weights cache" in caplog.text and "rebuilding" in caplog.text
    assert used["ggml_repack"] == {"ggml_vnni"}
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    entry, = _entries()
    assert (entry / PACKED_NAME).stat().st_size == size
    caplog.clear()
    _, _, used = _load(k_gguf, monkeypatch)  # the rebuilt entry serves
    assert "ggml_repack" not in used and "rebuilding" not in caplog.text


def test_a_changed_gguf_gets_a_new_entry(k_gguf: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
                                         tmp_path: Path, no_repacked_cache: None) -> None:
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(k_gguf, copy)
    want, _, _ = _load(copy, monkeypatch)
    before = _entries()
    stat = copy.stat()
    os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # the file changed
    got, _, used = _load(copy, monkeypatch)
    assert used["ggml_repack"] == {"ggml_vnni"}  # repacked again, not read from the old entry
    after = _entries()
    assert len(after) == len(before) == 1 and after != before  # the old entry replaced
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    assert discard_for(k_gguf) == 0 and discard_for(copy) == 1 and not _entries()


def test_joined_runs_are_kept_apart_and_mapped_by_a_second_load(
        v_in_q8_0: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        no_repacked_cache: None) -> None:
    """Q and K (Q4_1, both in the conversion's repacked.bin) are joined into one run: the
    first load copies them and keeps the copy in an entry of its own, a second maps it
    (no copy), with bitwise the same logits; removing the joined entry leaves the other."""
    def load() -> tuple[list[torch.Tensor], torch.Tensor, list]:
        _, model, ctx = _build(v_in_q8_0, monkeypatch, True)
        qkv = model.model.layers[1].self_attn.qkv_proj
        assert qkv.gguf_joined == {0}
        groups = [g for g in weight_storage(model) if g.why == JOINED]
        return [prefill_logits(model, ctx, ids) for ids in PROMPTS], qkv.gguf_runs[0][1], groups

    want, first, groups = load()
    assert groups and all(g.where == "memory" for g in groups)
    entry, = _entries(joins=True)
    got, second, groups = load()
    assert _inside(second, _mappings(entry / PACKED_NAME)) and torch.equal(second, first)
    assert groups and all(g.where == "in place: mapped from the repacked-weights cache "
                          f"({PACKED_NAME})" for g in groups)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    assert _entries(joins=True) == [entry]  # read, not written again
    repacked = _entries()
    assert discard_for(v_in_q8_0.parent / "no.gguf") == 0
    source = json.loads((entry / INDEX_NAME).read_text())["source"]
    assert discard_for(Path(source), joins=True) == 1
    assert not _entries(joins=True) and _entries() == repacked


def test_a_new_conversion_takes_the_joined_runs_of_the_old_one_with_it(
        v_in_q8_0: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,  # noqa: F811
        no_repacked_cache: None) -> None:
    """The joined Q and K come from the conversion's repacked.bin: when the GGUF changes,
    its new conversion replaces the old one, and the joined entry of the old conversion's
    file goes when the new one is written."""
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(v_in_q8_0, copy)
    _build(copy, monkeypatch, True)
    old_entry, = _entries(joins=True)
    old_source = Path(json.loads((old_entry / INDEX_NAME).read_text())["source"])
    stat = copy.stat()
    os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # the file changed
    _build(copy, monkeypatch, True)
    new_entry, = _entries(joins=True)
    new_source = Path(json.loads((new_entry / INDEX_NAME).read_text())["source"])
    assert new_entry != old_entry and new_source.is_file()
    assert not old_source.exists() and new_source.parent != old_source.parent
    conversions = [p for p in new_source.parent.parent.iterdir()
                   if (p / SOURCE_NAME).is_file()
                   and (p / SOURCE_NAME).read_text() == str(copy.resolve())]
    assert conversions == [new_source.parent]
