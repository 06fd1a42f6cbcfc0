"""hwplug's BertModel on the real all-MiniLM-L6-v2 weights against transformers.BertModel."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from model_harness import InMemoryCheckpoint, PagedBatch
from transformers import BertModel as ReferenceBertModel

from hwplug.model_zoo.context import build_model
from hwplug.model_zoo.loaders import load_checkpoint, resolve_model

#: Max abs difference of token hidden states (fp32, values O(1)).
HIDDEN_ATOL = 1e-4
#: Minimum cosine similarity of the mean-pooled sentence embeddings.
MIN_COSINE = 0.9999
SENTENCES = ["A man is eating food.", "The new movie is awesome!",
             "hwplug runs the same model code on every accelerator it can find."]


@pytest.fixture(scope="module")
def checkpoint():
    return load_checkpoint(resolve_model("all-minilm-l6-v2"))


@pytest.fixture(scope="module")
def models(checkpoint):
    model, ctx = build_model(checkpoint)
    reference = ReferenceBertModel.from_pretrained(checkpoint.source).eval()
    return checkpoint.tokenizer, model, ctx, reference


def hidden_states(model, ctx, encoded) -> list[torch.Tensor]:
    """hwplug's token hidden states of each (unpadded) sequence of a padded ``encoded`` batch."""
    lengths = encoded.attention_mask.sum(-1).tolist()
    batch = PagedBatch(ctx, model.num_layers, len(lengths), max(lengths))
    ids = [row[:n] for row, n in zip(encoded.input_ids, lengths, strict=True)]
    types = torch.cat([row[:n] for row, n in zip(encoded.token_type_ids, lengths, strict=True)])
    return list(batch.run(model, ids, lengths, token_type_ids=types).split(lengths))


def reference_states(reference, encoded) -> list[torch.Tensor]:
    lengths = encoded.attention_mask.sum(-1).tolist()
    with torch.inference_mode():
        padded = reference(**encoded).last_hidden_state
    return [row[:n] for row, n in zip(padded, lengths, strict=True)]


def test_sentence_embeddings_match_transformers(models):
    tokenizer, model, ctx, reference = models
    encoded = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    ours, theirs = hidden_states(model, ctx, encoded), reference_states(reference, encoded)
    for got, want in zip(ours, theirs, strict=True):
        torch.testing.assert_close(got, want, atol=HIDDEN_ATOL, rtol=0)
    cosine = F.cosine_similarity(torch.stack([h.mean(0) for h in ours]),
                                 torch.stack([h.mean(0) for h in theirs]))
    assert cosine.min() >= MIN_COSINE


def test_sentence_pairs_use_token_types(models):
    tokenizer, model, ctx, reference = models
    encoded = tokenizer(SENTENCES[:2], SENTENCES[1:], padding=True, return_tensors="pt")
    assert encoded.token_type_ids.any()
    for got, want in zip(hidden_states(model, ctx, encoded), reference_states(reference, encoded),
                         strict=True):
        torch.testing.assert_close(got, want, atol=HIDDEN_ATOL, rtol=0)


def test_task_model_names_load_the_same_encoder(checkpoint, models):
    """A ``BertFor...`` checkpoint prefixes the encoder with ``bert.`` and adds task heads."""
    tokenizer, model, ctx, _ = models
    state = {f"bert.{name}": tensor for name, tensor in checkpoint.weights()}
    state["cls.predictions.bias"] = torch.zeros(checkpoint.config.vocab_size)
    prefixed, _ = build_model(InMemoryCheckpoint(checkpoint.config, state))
    encoded = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    for got, want in zip(hidden_states(prefixed, ctx, encoded),
                         hidden_states(model, ctx, encoded), strict=True):
        torch.testing.assert_close(got, want, atol=0, rtol=0)
