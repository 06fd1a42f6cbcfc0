"""GGUF checkpoints kept in their blocks (the ``gguf`` quant method) against the same file
dequantized to float32, and where the blocks live.

Both load through hwplug (the dequantized one is checked against transformers in
test_generate_smollm2.py), so what differs is only the GGUF path: blocks kept and
un-permuted as rows, fused layers made of shards of different types, the embedding read
row by row, and the kernels' int8 rounding of activations (llama.cpp's): logits within
:data:`LOGIT_RTOL` of their range. Blocks the model uses as the file stores them are views
of the ``.gguf`` mapped into this process (checked against ``/proc/self/maps``); only the
rows the conversion reorders (llama's Q/K) are a copy, in the conversion cache.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from model_harness import PagedBatch
from tiny_checkpoints import shrink_gguf, write_tiny_llama

from hwplug.errors import ConfigError, ModelError
from hwplug.model_zoo.context import ModelContext, build_model
from hwplug.model_zoo.loaders import load_checkpoint, resolve_model
from hwplug.model_zoo.loaders.cache import entry_dir
from hwplug.model_zoo.loaders.gguf_file import BLOCKS_CACHE_KIND
from hwplug.model_zoo.weights_report import JOINED, summarize, weight_storage

#: Max |kept - dequantized| logit over the dequantized logits' range: the weights are the
#: same values, so this is the activations' int8 rounding. Measured: 0.011 (SmolLM2 Q4_1,
#: first decode step of 8 prompts); 0.017 (2 layers, six types).
LOGIT_RTOL = 0.04
#: Types the mixed file stores (q, k, v differ, so do gate and up; down is a K-quant).
MIXED = {"attn_q": Q.Q5_0, "attn_k": Q.Q8_0, "attn_v": Q.Q4_0, "ffn_gate": Q.Q5_1,
         "ffn_up": Q.Q4_1, "ffn_down": Q.Q6_K, "attn_output": Q.F16}


def prefill_logits(model: torch.nn.Module, ctx: ModelContext, ids: list[int]) -> torch.Tensor:
    """The model's logits at every position of a one-sequence prefill of ``ids``."""
    batch = PagedBatch(ctx, model.num_layers, 1, len(ids))
    hidden = batch.run(model, [torch.tensor(ids)], [len(ids)])
    with torch.inference_mode():
        return model.compute_logits(hidden)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / (want.max() - want.min()))


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shrink_gguf(resolve_model(None), tmp_path_factory.mktemp("gguf") / "mixed.gguf",
                       layers=2, vocab=1536, retype={k: int(v) for k, v in MIXED.items()})


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model's first two layers, every tensor as the file stores it (Q4_1
    matrices; ``ffn_gate`` and ``ffn_up`` next to each other)."""
    return shrink_gguf(resolve_model(None), tmp_path_factory.mktemp("gguf") / "small.gguf",
                       layers=2, vocab=1536)


def _mappings(path: Path) -> list[tuple[int, int]]:
    """The address ranges of this process's mappings of ``path`` (``/proc/self/maps``)."""
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == str(path.resolve()):
            start, end = (int(address, 16) for address in fields[0].split("-"))
            ranges.append((start, end))
    return ranges


def _inside(tensor: torch.Tensor, ranges: list[tuple[int, int]]) -> bool:
    end = tensor.data_ptr() + tensor.numel() * tensor.element_size()
    return any(start <= tensor.data_ptr() and end <= stop for start, stop in ranges)


def _stored(reader: GGUFReader, name: str) -> torch.Tensor:
    """GGUF tensor ``name``'s bytes as ``uint8 [rows, row_bytes]`` (a copy)."""
    data = next(t.data for t in reader.tensors if t.name == name)
    return torch.from_numpy(np.array(data).view(np.uint8).reshape(len(data), -1))


def test_gguf_blocks_are_views_of_the_mapped_file(small_gguf: Path):
    checkpoint = load_checkpoint(small_gguf)
    model, _ = build_model(checkpoint, dtype="float32")
    ranges, reader = _mappings(small_gguf), GGUFReader(small_gguf)
    assert ranges, "the .gguf is not mapped"
    layer = model.model.layers[1]
    # ffn_gate and ffn_up are adjacent in the file, of one type: one run viewing both
    (kind, gate_up), = layer.mlp.gate_up_proj.gguf_runs
    assert kind == Q.Q4_1 and _inside(gate_up, ranges)
    assert torch.equal(gate_up, torch.cat([_stored(reader, "blk.1.ffn_gate.weight"),
                                           _stored(reader, "blk.1.ffn_up.weight")]))
    for module, name in ((layer.mlp.down_proj, "blk.1.ffn_down.weight"),
                         (layer.self_attn.o_proj, "blk.1.attn_output.weight"),
                         (model.model.embed_tokens, "token_embd.weight")):
        (_, rows), = module.gguf_runs
        assert _inside(rows, ranges) and torch.equal(rows, _stored(reader, name)), name
    # llama's Q/K rows are reordered on conversion: copies, in the cache's repacked.bin; V is
    # in the .gguf. The three Q4_1 shards are joined into one run in memory (one kernel
    # call), and the mapped pages the join read are released again
    gguf, repacked = checkpoint.mapped
    assert gguf.path == small_gguf and repacked.path.name == "repacked.bin"
    assert repacked.copied["model.layers.1.self_attn.q_proj.qweight"] == (
        "LlamaTensorProcessor reorders its rows")
    qkv = layer.self_attn.qkv_proj
    (kind, rows), = qkv.gguf_runs
    assert kind == Q.Q4_1 and qkv.gguf_joined == {0}
    assert not _inside(rows, ranges) and not _inside(rows, _mappings(repacked.path))
    # released but the page each end of a shard shares with its neighbour in the file
    assert _resident(repacked.path) <= 2 * mmap.PAGESIZE * len(model.model.layers)
    views = dict(checkpoint.weights())
    assert torch.equal(rows, torch.cat([views["model.layers.1.self_attn.q_proj.qweight"],
                                        views["model.layers.1.self_attn.k_proj.qweight"],
                                        _stored(reader, "blk.1.attn_v.weight")]))
    assert not list(model.lm_head.parameters())  # tied: it reads the embedding's table
    groups = weight_storage(model, checkpoint.mapped)
    assert "dequantized: none" in summarize(groups)
    # the only GGUF runs in memory are the joined q/k/v shards; the rest are mapped views
    for group in groups:
        if group.held_as.startswith("GGUF"):
            assert group.where.startswith("in place") or (
                group.where == "memory" and group.why == JOINED), group
    # every matrix is held once, as GGUF blocks
    matrices = sum(int(t.n_bytes) for t in reader.tensors if len(t.shape) == 2)
    assert sum(g.nbytes for g in groups if g.held_as.startswith("GGUF")) == matrices
    # the conversion cache holds only what it reordered, not the weights again
    entry = entry_dir(small_gguf, BLOCKS_CACHE_KIND)
    reordered = sum(t.nbytes for t in repacked.tensors.values())
    assert repacked.size < reordered + 64 * len(repacked.tensors)
    assert (entry / "model.safetensors").stat().st_size < 64 * 1024  # types (no vectors)


@pytest.fixture(scope="module")
def v_in_q8_0(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """:func:`small_gguf` with every ``attn_v`` requantized to Q8_0 (Q/K stay Q4_1)."""
    return shrink_gguf(resolve_model(None), tmp_path_factory.mktemp("gguf") / "v8.gguf",
                       layers=2, vocab=1536, retype={"attn_v": Q.Q8_0})


@pytest.mark.parametrize("rows", [1, 9, 40, 200])
def test_a_layer_of_runs_of_two_types_is_bitwise_each_types_rows(v_in_q8_0: Path, rows: int):
    """Q and K (Q4_1, stored apart) join into one run, V (Q8_0) stays a run of its own, in
    place in the file: one kernel call each, and every output bitwise what each type's rows
    give in one call, at decode and prefill row counts."""
    checkpoint = load_checkpoint(v_in_q8_0)
    model, _ = build_model(checkpoint, dtype="float32")
    qkv = model.model.layers[1].self_attn.qkv_proj
    (qk_kind, qk), (v_kind, v) = qkv.gguf_runs
    assert (qk_kind, v_kind) == (Q.Q4_1, Q.Q8_0) and qkv.gguf_joined == {0}
    assert _inside(v, _mappings(v_in_q8_0)) and not _inside(qk, _mappings(v_in_q8_0))
    x = torch.randn(rows, qkv.gguf_shape[1], generator=torch.Generator().manual_seed(rows))
    with torch.inference_mode():
        got = qkv.quant_method.apply(qkv, x)
        want = torch.cat([qkv.gemm_kernel(x, qk, qk_kind, None),
                          qkv.gemm_kernel(x, v, v_kind, None)], dim=-1)
    assert torch.equal(got, want)


def _resident(path: Path) -> int:
    """Bytes of this process's mappings of ``path`` that are resident (``/proc/self/smaps``)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5 and ":" not in fields[0]:
            inside = len(fields) == 6 and fields[5] == str(path.resolve())
        elif inside and fields[0] == "Rss:":
            total += int(fields[1]) * 1024
    return total


def test_dequantized_weights_are_reported_with_the_reason(small_gguf: Path):
    model, _ = build_model(load_checkpoint(small_gguf, dequantize=True), dtype="float32")
    groups = weight_storage(model, (), "dequantize=True was asked")
    dequantized = [g for g in groups if g.dequantized]
    assert dequantized and dequantized[0].held_as == "float32"
    # 2 layers of 4 matrices (q/k/v and gate/up fused), and the embedding
    assert sum(g.count for g in dequantized) == 2 * 4 + 1
    assert summarize(groups).endswith("dequantize=True was asked")
    assert not any(g.held_as.startswith("GGUF") for g in groups)


def test_a_changed_gguf_is_refused_when_mapped(small_gguf: Path, tmp_path: Path):
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(small_gguf.read_bytes())
    checkpoint = load_checkpoint(copy)
    with open(copy, "ab") as file:  # the cache entry indexed the file before this
        file.write(b"\0" * 64)
    with pytest.raises(ModelError, match="it changed"):
        dict(checkpoint.weights())


@pytest.mark.slow
def test_a_gguf_loads_kept_in_blocks_by_default():
    checkpoint = load_checkpoint(None)
    anon_before = _rss_anon()
    model, ctx = build_model(checkpoint, dtype="float32")
    anon_grown = _rss_anon() - anon_before
    assert ctx.quant_method.get_name() == "gguf"
    file_bytes = sum(t.n_bytes for t in GGUFReader(checkpoint.source).tensors)
    # the blocks are the file's pages (or the cache's Q/K copies), not a copy in memory
    assert anon_grown < 0.25 * file_bytes, (anon_grown, file_bytes)
    ranges = _mappings(checkpoint.source)
    layer = model.model.layers[0]
    qkv = layer.self_attn.qkv_proj
    assert {kind for kind, _ in qkv.gguf_runs} == {Q.Q4_1}
    (_, gate_up), = layer.mlp.gate_up_proj.gguf_runs
    assert _inside(gate_up, ranges)
    (kind, table), = model.model.embed_tokens.gguf_runs
    assert kind == Q.Q8_0 and _inside(table, ranges)


def _rss_anon() -> int:
    """This process's anonymous resident memory in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


def test_fused_shards_of_different_types_match_the_dequantized_model(mixed_gguf: Path):
    kept, kept_ctx = build_model(load_checkpoint(mixed_gguf), dtype="float32")
    plain, plain_ctx = build_model(load_checkpoint(mixed_gguf, dequantize=True),
                                   dtype="float32")
    attention = kept.model.layers[1].self_attn
    assert [k for k, _ in attention.qkv_proj.gguf_runs] == [Q.Q5_0, Q.Q8_0, Q.Q4_0]
    assert [k for k, _ in kept.model.layers[1].mlp.gate_up_proj.gguf_runs] == [Q.Q5_1, Q.Q4_1]
    for name, module in kept.named_modules():
        if hasattr(module, "gguf_runs"):
            target = plain.get_submodule(name)
            weight = target.weight if hasattr(target, "weight") else None
            torch.testing.assert_close(module.quant_method.dequantize(module), weight,
                                       rtol=0, atol=0, msg=name)
    ids = list(range(3, 40))
    error = relative_error(prefill_logits(kept, kept_ctx, ids),
                           prefill_logits(plain, plain_ctx, ids))
    assert error < LOGIT_RTOL, error


def test_dequantize_applies_to_gguf_files_only(tmp_path: Path):
    directory = write_tiny_llama(tmp_path / "tiny")
    with pytest.raises(ConfigError, match="dequantize applies to GGUF files"):
        load_checkpoint(directory, dequantize=True)


#: SmolLM2-135M Q4_K_M's types where its v rows are Q8_0: q/k/v runs of two types in one
#: layer, the MLP's down a K-quant (its other dimensions are not multiples of 256).
Q4_K_M = {"attn_q": Q.Q5_0, "attn_k": Q.Q5_0, "attn_v": Q.Q8_0, "ffn_gate": Q.Q5_0,
          "ffn_up": Q.Q5_0, "ffn_down": Q.Q6_K, "attn_output": Q.Q5_0}


def test_a_q4_k_m_models_decode_steps_replay_as_step_graphs(tmp_path: Path):
    """Each run of a fused layer writes its columns of the layer's output (no torch.cat), so
    on the CPU every op of a decode step is a C call and the step replays as a step graph,
    with the eager steps' tokens."""
    import hwplug

    path = shrink_gguf(resolve_model(None), tmp_path / "q4_k_m.gguf", layers=2, vocab=1536,
                       retype={k: int(v) for k, v in Q4_K_M.items()})
    params = hwplug.SamplingParams(max_tokens=4, ignore_eos=True)
    prompt = list(range(3, 20))
    tokens = []
    for graphs in (True, False):
        llm = hwplug.LLM(str(path), max_num_seqs=1, step_graphs=graphs)
        try:
            tokens.append(llm.generate(prompt, params)[0].outputs[0].token_ids)
            qkv = llm.runner.model.model.layers[0].self_attn.qkv_proj
            assert [kind for kind, _ in qkv.gguf_runs][-1] == Q.Q8_0
            assert {kind for kind, _ in qkv.gguf_runs[:-1]} == {Q.Q5_0}
            if graphs:
                replayed = llm.runner.graphs
                assert replayed.recorded == [1] and not replayed.refused, replayed.describe()
                assert replayed.replays == 2  # the decode steps after the first one
        finally:
            llm.close()
    assert tokens[0] == tokens[1]
