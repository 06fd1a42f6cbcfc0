"""A token row's numbers on the CPU platform do not depend on the step that computes it.

The packaged SmolLM2 (its GGUF blocks kept, and dequantized to fp32 weights), run without
the engine: the last token of each of eight sequences is computed alone in a decode step,
in a decode step of all eight, and as the last row of a prefill of its whole sequence
(beside another sequence's prefill, so past the rows at which a kernel could change its
tiling); its hidden state and logits must be bitwise equal (``torch.equal``) every way.
Then the engine's case (issue 29, item 6): 104 greedy prompts with KV blocks for four
sequences at a time, so sequences are preempted and their generated tokens recomputed in
a prefill, give every prompt the tokens of a run with room for all of them.
"""

from __future__ import annotations

import random

import pytest
import torch
from model_harness import PagedBatch

import hwplug
from hwplug.attention import AttentionMetadata

pytestmark = pytest.mark.slow  # loads the real model

#: Tokens of sequence i: 9 + 17 i, so the eight prefills of the contexts fill a step of
#: over 500 rows and one sequence's prefill alone spans from 9 to 128 rows.
LENGTHS = [9 + 17 * i for i in range(8)]


@pytest.fixture(scope="module")
def quantized() -> hwplug.LLM:
    return hwplug.LLM(num_kv_blocks=256)  # room for 64 sequences of 53 tokens


@pytest.fixture(scope="module", params=["gguf", "fp32"])
def llm(request, quantized) -> hwplug.LLM:
    if request.param == "gguf":
        return quantized
    return hwplug.LLM(num_kv_blocks=128, dequantize=True)


def _run(batch: PagedBatch, model: torch.nn.Module, seqs: list[int],
         chunks: list[torch.Tensor], context_lens: list[int]) -> torch.Tensor:
    """Hidden states ``[sum len(chunks), hidden]`` of a step in which sequence ``seqs[i]``
    of ``batch`` computes ``chunks[i]``, the last tokens of its ``context_lens[i]``."""
    positions = torch.cat([torch.arange(c - len(q), c)
                           for q, c in zip(chunks, context_lens, strict=True)])
    tables = batch.block_tables[seqs]
    rows = torch.repeat_interleave(torch.arange(len(seqs)),
                                   torch.tensor([len(q) for q in chunks]))
    blocks = tables[rows, positions // batch.block_size].long()
    starts = torch.tensor([0, *(len(q) for q in chunks)]).cumsum(0).to(torch.int32)
    metadata = AttentionMetadata(
        slot_mapping=blocks * batch.block_size + positions % batch.block_size,
        block_tables=tables, seq_lens=torch.tensor(context_lens, dtype=torch.int32),
        query_start_loc=starts, max_query_len=max(len(q) for q in chunks),
        max_seq_len=max(context_lens))
    with torch.inference_mode():
        return model(torch.cat(chunks), positions, batch.kv_caches, metadata)


def _rows(llm: hwplug.LLM, tokens: list[torch.Tensor]) -> dict[str, list[torch.Tensor]]:
    """Each sequence's last row (hidden state, logits) computed three ways: ``alone`` (a
    decode step of that row), ``batch`` (a decode step of every sequence's last row) and
    ``prefill`` (the whole sequence in one step, beside the next sequence's prefill)."""
    model, ctx = llm.model, llm.ctx
    count, lens = len(tokens), [len(t) for t in tokens]
    context = PagedBatch(ctx, model.num_layers, count, max(lens))
    _run(context, model, list(range(count)), [t[:-1] for t in tokens], [n - 1 for n in lens])
    alone = [_run(context, model, [i], [tokens[i][-1:]], [lens[i]])[0] for i in range(count)]
    batch = list(_run(context, model, list(range(count)), [t[-1:] for t in tokens], lens))
    # (each step writes its rows' KV before attending, so a step rewriting a last token's
    # slot changes nothing another reads)
    prefill = []
    for i in range(count):
        pair = [i, (i + 1) % count]
        fresh = PagedBatch(ctx, model.num_layers, count, max(lens), seed=i + 1)
        hidden = _run(fresh, model, pair, [tokens[j] for j in pair], [lens[j] for j in pair])
        prefill.append(hidden[lens[i] - 1])
    with torch.inference_mode():
        return {way: [(row, model.compute_logits(row[None])[0]) for row in rows]
                for way, rows in (("alone", alone), ("batch", batch), ("prefill", prefill))}


def test_a_rows_numbers_do_not_depend_on_its_step(llm):
    generator = torch.Generator().manual_seed(0)
    tokens = [torch.randint(1000, 30000, (n,), generator=generator) for n in LENGTHS]
    rows = _rows(llm, tokens)
    differ = []
    for way in ("batch", "prefill"):
        for i, ((hidden, logits), (hidden_alone, logits_alone)) in enumerate(
                zip(rows[way], rows["alone"], strict=True)):
            if not (torch.equal(hidden, hidden_alone) and torch.equal(logits, logits_alone)):
                differ.append(f"{way} row of sequence {i}: hidden max diff "
                              f"{(hidden - hidden_alone).abs().max().item():.3g}, logits "
                              f"{(logits - logits_alone).abs().max().item():.3g}")
    assert not differ, "; ".join(differ)


def test_preempted_sequences_keep_their_greedy_tokens(quantized):
    rng = random.Random(29)
    prompts = [[rng.randrange(1000, 30000) for _ in range(rng.randrange(3, 30))]
               for _ in range(104)]
    params = hwplug.SamplingParams(max_tokens=24, ignore_eos=True)
    roomy = [out.token_ids for out in quantized.generate(prompts, params)]
    # blocks of 16 for 53 tokens at most: 4 each, so 16 blocks hold four sequences (before
    # the kernels were batch-invariant, 2 of these 104 outputs changed)
    tight = hwplug.LLM(num_kv_blocks=16, block_size=16, max_num_seqs=16)
    together = [out.token_ids for out in tight.generate(prompts, params)]
    assert tight.engine.scheduler.num_preemptions > 0
    tight.close()
    changed = [i for i, (a, b) in enumerate(zip(together, roomy, strict=True)) if a != b]
    assert not changed, f"{len(changed)} of {len(prompts)} outputs changed: {changed}"
