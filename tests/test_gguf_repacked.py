"""GGUF models on the repacked Q4_K / Q5_K / Q6_K / IQ4_XS kernel (``ggml_linear_repacked``):
where the plan binds the VNNI build for it, the quant method repacks those runs once at
load, the logits are bitwise those of the rows' kernel, the rows read back unchanged, the
mapped file's pages the repack read are released, and the plan reports the variant that
ran."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from test_ggml_kernels import runnable
from test_gguf_quantized import _mappings, _resident, _stored, prefill_logits
from tiny_checkpoints import shrink_gguf

from hwplug.kernel_registry.reference.ggml import dequantize
from hwplug.model_zoo.context import build_model
from hwplug.model_zoo.loaders import load_checkpoint, resolve_model
from hwplug.model_zoo.loaders.repacked_cache import discard_for
from hwplug.model_zoo.weights_report import weight_storage

#: Keeps every GGUF run as rows: the repacked kernel is not chosen.
ROWS_ONLY = "ggml_linear_repacked/ggml_vnni"


@pytest.fixture(scope="module", params=[Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_XS],
                ids=lambda t: t.name)
def k_gguf(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model's first two layers with ``ffn_down`` (1536 inputs: six
    super-blocks, 576 rows: 36 groups of 16) in a K-quant (SmolLM2-135M Q4_K_M keeps its
    ``ffn_down`` in Q6_K and, at other shapes, Q4_K)."""
    runnable("ggml_vnni")
    return shrink_gguf(resolve_model(None), tmp_path_factory.mktemp("gguf") / "k.gguf",
                       layers=2, vocab=1536, retype={"ffn_down": int(request.param)})


def _build(path: Path, monkeypatch: pytest.MonkeyPatch, repacked: bool,
           disabled: str = ROWS_ONLY):
    if repacked:
        monkeypatch.delenv("HWPLUG_DISABLED_KERNELS", raising=False)
    else:
        monkeypatch.setenv("HWPLUG_DISABLED_KERNELS", disabled)
    checkpoint = load_checkpoint(path)
    model, ctx = build_model(checkpoint, dtype="float32")
    return checkpoint, model, ctx


def test_repacked_weights_give_the_rows_logits_bitwise(k_gguf: Path,
                                                       monkeypatch: pytest.MonkeyPatch):
    """A prefill of 23 tokens and of one (the decode row count) gives bitwise the logits of
    the model on the rows; only the K-quant runs are repacked, the embedding never."""
    logits = {}
    for repacked in (True, False):
        _, model, ctx = _build(k_gguf, monkeypatch, repacked)
        for layer in model.model.layers:
            assert layer.mlp.down_proj.gguf_repacked == (frozenset({0}) if repacked
                                                         else frozenset())
            assert layer.mlp.gate_up_proj.gguf_repacked == frozenset()  # Q4_1: rows
        assert model.model.embed_tokens.gguf_repacked == frozenset()  # tied to the head
        logits[repacked] = [prefill_logits(model, ctx, ids)
                            for ids in (list(range(3, 26)), [7])]
        used = ctx.kernels.used()
        if repacked:
            assert used["ggml_linear_repacked"] == {"ggml_vnni"}
            assert used["ggml_repack"] == {"ggml_vnni"}
        else:
            assert "ggml_linear_repacked" not in used and "ggml_repack" not in used
    for got, want in zip(logits[True], logits[False], strict=True):
        assert torch.equal(got, want)


def test_repacked_runs_read_back_as_the_files_rows(k_gguf: Path,
                                                   monkeypatch: pytest.MonkeyPatch):
    """The run holds other bytes than the file (the groups moved), outside the mapping;
    ``dequantize`` un-repacks them to the stored rows' values; the pages of the file the
    repack read are released (resident: less than one of the two layers' tensors)."""
    gc.collect()  # other tests' mappings of the file
    discard_for(k_gguf)  # this load repacks (not mapping the cache an earlier one wrote)
    checkpoint, model, _ = _build(k_gguf, monkeypatch, True)
    resident = _resident(k_gguf)  # before the reader below maps the file again
    reader, ranges = GGUFReader(k_gguf), _mappings(k_gguf)
    sizes = []
    for index, layer in enumerate(model.model.layers):
        down = layer.mlp.down_proj
        stored = _stored(reader, f"blk.{index}.ffn_down.weight")
        (kind, packed), = down.gguf_runs
        assert packed.shape == stored.shape and not torch.equal(packed, stored)
        assert not any(lo <= packed.data_ptr() < hi for lo, hi in ranges)
        assert torch.equal(down.quant_method.dequantize(down), dequantize(stored, kind))
        sizes.append(stored.numel())
    assert resident < min(sizes), resident
    repacked = [g for g in weight_storage(model, checkpoint.mapped)
                if g.why.startswith("repacked")]
    assert [(g.held_as, g.where, g.count) for g in repacked] == [
        (f"GGUF {Q(kind).name}", "memory", 2)]
    del checkpoint


def test_without_a_native_repack_the_runs_stay_rows(k_gguf: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture):
    """A native repacked linear but only the reference repack (as when its library fails
    to build): the first layer's repack falls back, so nothing is held repacked (the
    reference repacked linear would un-interleave at every call) and it says so."""
    _, model, ctx = _build(k_gguf, monkeypatch, False, disabled="ggml_repack/ggml_vnni")
    assert all(not m.gguf_repacked for m in model.modules() if hasattr(m, "gguf_repacked"))
    assert "stay as rows: ggml_repack fell back" in caplog.text
    prefill_logits(model, ctx, [7, 8])
    assert "ggml_linear_repacked" not in ctx.kernels.used()


#: Keeps a tied table as rows: its repacked lookup is not chosen.
TABLE_AS_ROWS = "ggml_embedding_repacked/ggml_vnni"


#: A random-weight Qwen2.5-1.5B Q4_K_M (benchmarks/make_gguf.py): tied embeddings in Q6_K
#: (the default model's 576 columns fit no super-block type).
TIED_Q6K = Path("/work/models/qwen2.5-1.5b-random-Q4_K_M.gguf")


@pytest.fixture(scope="module")
def tied_q6k_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """:data:`TIED_Q6K` cut to one layer and 1530 tokens (95 groups of 16 and 10 rows
    after them)."""
    runnable("ggml_vnni")
    if not TIED_Q6K.is_file():
        pytest.skip(f"no {TIED_Q6K} (benchmarks/make_gguf.py qwen2.5-1.5b Q4_K_M writes one)")
    return shrink_gguf(TIED_Q6K, tmp_path_factory.mktemp("tied") / "tied.gguf",
                       layers=1, vocab=1530)


def test_a_tied_table_is_held_once_repacked_for_head_and_lookup(
        tied_q6k_gguf: Path, monkeypatch: pytest.MonkeyPatch):
    """The tied Q6_K table repacked once: the head multiplies it repacked and the embedding
    looks its rows up there (every id, the 10 after the last group too, bitwise the stored
    rows' values); the logits bitwise those with the table as rows; the file's pages the
    repack read released (resident: less than the table)."""
    logits = {}
    for repacked in (False, True):
        gc.collect()
        checkpoint, model, ctx = _build(tied_q6k_gguf, monkeypatch, repacked,
                                        disabled=TABLE_AS_ROWS)
        table = model.model.embed_tokens
        assert table.serves_head
        assert table.gguf_repacked == (frozenset({0}) if repacked else frozenset())
        if repacked:
            resident = _resident(tied_q6k_gguf)
            stored = _stored(GGUFReader(tied_q6k_gguf), "token_embd.weight")
            assert resident < stored.numel(), resident
            (kind, packed), = table.gguf_runs
            assert kind == Q.Q6_K and not torch.equal(packed, stored)
            ids = torch.arange(1530).flip(0)
            assert torch.equal(table(ids), dequantize(stored, kind)[ids])
        logits[repacked] = [prefill_logits(model, ctx, ids)
                            for ids in (list(range(1500, 1530)), [1525])]
        used = ctx.kernels.used()
        assert (used.get("ggml_embedding_repacked") == {"ggml_vnni"}) == repacked
        assert "ggml_embedding" not in used if repacked else used["ggml_embedding"]
        del checkpoint, model
    for got, want in zip(logits[True], logits[False], strict=True):
        assert torch.equal(got, want)
