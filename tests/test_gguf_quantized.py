"""GGUF checkpoints kept in their blocks (the ``gguf`` quant method) against the same file
dequantized to float32.

Both load through hwplug (the dequantized one is checked against transformers in
test_generate_smollm2.py), so what differs is only the GGUF path: blocks kept and
un-permuted as rows, fused layers made of shards of different types, the embedding read
row by row, and the kernels' int8 rounding of activations (llama.cpp's): logits within
:data:`LOGIT_RTOL` of their range.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from model_harness import PagedBatch
from tiny_checkpoints import shrink_gguf, write_tiny_llama

from hwplug.errors import ConfigError
from hwplug.model_zoo.context import ModelContext, build_model
from hwplug.model_zoo.loaders import load_checkpoint, resolve_model

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


@pytest.mark.slow
def test_a_gguf_loads_kept_in_blocks_by_default():
    checkpoint = load_checkpoint(None)
    model, ctx = build_model(checkpoint, dtype="float32")
    assert ctx.quant_method.get_name() == "gguf"
    file_bytes = sum(t.n_bytes for t in GGUFReader(checkpoint.source).tensors)
    resident = sum(p.numel() * p.element_size() for p in model.parameters())
    assert resident <= 1.2 * file_bytes, (resident, file_bytes)
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert [kind for kind, _ in qkv.gguf_runs] == [Q.Q4_1]  # q, k, v rows in one run
    assert model.model.embed_tokens.gguf_runs[0][0] == Q.Q8_0


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
            assert [kind for kind, _ in qkv.gguf_runs] == [Q.Q5_0, Q.Q8_0]
            if graphs:
                replayed = llm.runner.graphs
                assert replayed.recorded == [1] and not replayed.refused, replayed.describe()
                assert replayed.replays == 3  # the decode steps after the prefill's token
        finally:
            llm.close()
    assert tokens[0] == tokens[1]
