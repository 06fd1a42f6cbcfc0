"""A tiny random Llama saved as a Hugging Face directory, for fast ``hwplug.LLM`` tests.

Two layers of width 64 with GQA (4 query heads over 2 KV heads), tied embeddings, and the
WordPiece tokenizer of the packaged all-MiniLM-L6-v2 model (30522 tokens, read from disk,
no conversion), so ``hwplug.LLM(path)`` loads in well under a second and a step takes
milliseconds. The weights are drawn large enough that the next-token distribution is
peaked: greedy choices are not near-ties that batching could flip. ``[SEP]`` ends a
sequence. transformers' ``LlamaForCausalLM.from_pretrained(path)`` holds the same weights.

A test module imports :func:`tiny_model_dir`, the fixture ``model_dir`` (one model per
module), and :func:`random_prompts` / :func:`plain_tokens` for prompts and the reference
output of a plain engine.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hwplug
from hwplug.model_zoo.loaders import ALIASES

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.txt")
VOCAB_SIZE = 30522
SEP = 102  # [SEP] of the WordPiece vocabulary


def write_tiny_llama(directory: Path, seed: int = 0, max_position_embeddings: int = 512
                     ) -> Path:
    """Write the model into ``directory`` (created) and return it."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer_dir = ALIASES["all-minilm-l6-v2"].locate()
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, directory / name)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings, tie_word_embeddings=True,
        bos_token_id=101, eos_token_id=SEP, architectures=["LlamaForCausalLM"])
    model = LlamaForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # norms around 1, everything else N(0, 0.3)
        for name, param in model.named_parameters():
            param.normal_(1.0 if "norm" in name else 0.0, 0.3, generator=generator)
    model.save_pretrained(directory, safe_serialization=True)
    return directory


@pytest.fixture(scope="module", name="model_dir")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model, written once per test module."""
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def random_prompts(seed: int, count: int, length: int | None = None) -> list[list[int]]:
    """``count`` prompts of random ordinary tokens: ``length`` each, or 3 to 29."""
    rng = random.Random(seed)
    return [[rng.randrange(1000, 30000) for _ in range(length or rng.randrange(3, 30))]
            for _ in range(count)]


def plain_tokens(model_dir: Path, prompts: list[list[int]],
                 params: hwplug.SamplingParams) -> list[list[int]]:
    """The output tokens of an engine without prefix caching or connector."""
    plain = hwplug.LLM(model_dir, num_kv_blocks=64, enable_prefix_caching=False)
    return [output.token_ids for output in plain.generate(prompts, params)]
