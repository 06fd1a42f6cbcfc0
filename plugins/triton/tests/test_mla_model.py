"""A tiny random-weight DeepSeek-V3 with its latent attention on hwplug-triton's MLA kernels
(Triton's interpreter, registered for the cpu platform here and preferred): the model's
own calls (its query and ``W_UK`` / ``W_UV`` views, its scale) through the kernels, a
9-token prefill (two blocks of 8) and 2 decode steps of two sequences, give the logits of the same model
on the cpu platform's kernels (which tests/test_mla_models.py checks against
transformers)."""

from __future__ import annotations

import torch
from model_harness import InMemoryCheckpoint, PagedBatch
from test_models_vs_transformers import random_sequences, reference_and_ours
from test_moe_models import CONFIGS
from triton_cases import interpreter_only

from hwplug import current_platform, kernels
from hwplug.model_zoo.context import build_model
from hwplug.registry import current_source
from hwplug_triton import MLA_OPS, register

#: Max |logit difference| over the logits' range: fp32 throughout, the kernels' dot order
#: and exp2 softmax against the references'.
LOGIT_RTOL = 1e-4


def _logits(config, state) -> tuple[torch.Tensor, dict[str, set[str]]]:
    """Logits of two 9-token prompts and 2 decode steps each, and the variants that served
    the model's MLA ops."""
    model, ctx = build_model(InMemoryCheckpoint(config, state), dtype="float32", block_size=8)
    sequences = random_sequences(config.vocab_size, (11, 11))
    batch = PagedBatch(ctx, model.num_layers, 2, 11)
    steps = [model.compute_logits(batch.run(model, [s[:9] for s in sequences], [9, 9]))]
    for n in range(9, 11):
        steps.append(model.compute_logits(batch.run(model, [s[n:n + 1] for s in sequences],
                                                    [n + 1, n + 1])))
    used = ctx.kernels.used()
    return torch.cat(steps), {op: used.get(op, set()) for op in MLA_OPS}


@interpreter_only
def test_deepseek_on_the_triton_mla_kernels_gives_the_cpu_platforms_logits(fresh_discovery,
                                                                           monkeypatch):
    config = CONFIGS["deepseek-v3"]()
    config.first_k_dense_replace = config.num_hidden_layers  # dense: no expert flips
    reference, _, _ = reference_and_ours(config)
    state = reference.state_dict()
    want, served = _logits(config, state)
    assert "triton_test" not in set().union(*served.values())
    current_platform()
    token = current_source.set("test_triton_mla_model")
    try:
        register(kernels, platforms=("cpu",), name="triton_test", ops=MLA_OPS)
        monkeypatch.setenv("HWPLUG_PREFERRED_KERNELS", ",".join(
            f"{op}=triton_test" for op in MLA_OPS))
        got, served = _logits(config, state)
    finally:
        current_source.reset(token)
        kernels.drop_source("test_triton_mla_model")
    assert served == {op: {"triton_test"} for op in MLA_OPS}
    error = float((got - want).abs().max() / (want.max() - want.min()))
    assert error < LOGIT_RTOL, error
