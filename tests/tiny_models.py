"""Tiny random decoder models built identically in any process (for multi-process tests),
and the seeded random weights the model tests give transformers models."""

from __future__ import annotations

import torch
from model_harness import InMemoryCheckpoint, PagedBatch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

from hwplug.model_zoo.context import build_model
from hwplug.model_zoo.parallel import TensorParallel

_SIZES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, vocab_size=96,
              max_position_embeddings=64)
CONFIGS = {
    "llama": lambda: LlamaConfig(**_SIZES, architectures=["LlamaForCausalLM"]),
    "llama-tied-bias": lambda: LlamaConfig(**_SIZES, architectures=["LlamaForCausalLM"],
                                           tie_word_embeddings=True, attention_bias=True),
    "qwen3": lambda: Qwen3Config(**_SIZES, architectures=["Qwen3ForCausalLM"], head_dim=32),
    # 6 query heads over 3 KV heads: at 3 ranks each keeps one KV head whole
    "llama-3kv": lambda: LlamaConfig(**{**_SIZES, "hidden_size": 96, "intermediate_size": 192,
                                        "num_attention_heads": 6, "num_key_value_heads": 3,
                                        "vocab_size": 99}, architectures=["LlamaForCausalLM"]),
}
PROMPTS = ((5, 17, 3, 90, 41, 8, 2), (61, 7, 7, 29))


def randomize(model: torch.nn.Module, std: float = 0.15, seed: int = 0) -> torch.Generator:
    """Seeded random weights, in place: norms in [0.5, 1.5) (away from 1), the rest normal
    with ``std`` (large enough that every block matters, small enough to stay finite).
    Returns the generator, for further draws that follow from the same seed."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(torch.rand(param.shape, generator=generator) + 0.5 if "norm" in name
                        else torch.randn(param.shape, generator=generator) * std)
    return generator


def random_weights(config) -> dict[str, torch.Tensor]:
    """The state dict of ``config``'s transformers causal LM with :func:`randomize`'s
    weights."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    randomize(model)
    return model.state_dict()


def random_state(name: str) -> tuple[object, dict[str, torch.Tensor]]:
    config = CONFIGS[name]()
    return config, random_weights(config)


def greedy_logits(name: str, steps: int, parallel: TensorParallel | None = None
                  ) -> torch.Tensor:
    """``[steps, len(PROMPTS), vocab]`` logits of greedy decoding from :data:`PROMPTS`."""
    config, state = random_state(name)
    model, ctx = build_model(InMemoryCheckpoint(config, state), dtype="float32", block_size=8,
                             parallel=parallel)
    batch = PagedBatch(ctx, config.num_hidden_layers, len(PROMPTS),
                       max(map(len, PROMPTS)) + steps)
    chunks = [torch.tensor(p) for p in PROMPTS]
    lens, out = [len(p) for p in PROMPTS], []
    with torch.inference_mode():
        for _ in range(steps):
            hidden = batch.run(model, chunks, lens)
            last = torch.tensor([len(c) for c in chunks]).cumsum(0) - 1
            out.append(model.compute_logits(hidden[last]))
            chunks, lens = [t.view(1) for t in out[-1].argmax(-1)], [n + 1 for n in lens]
    return torch.stack(out)
