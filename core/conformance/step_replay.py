"""The platform's step replay (``Platform.step_recorder()``), checked on a tiny model.

A random two-layer Llama (GQA, float32) is built on the platform; two sequences decode
:data:`STEPS` tokens from position 0 through an engine runner that replays step graphs and,
beside it, one that runs every step eagerly, each over its own KV cache. Every replayed
step's logits must match the eager step's within :data:`TOLERANCE` of their range, with
the same greedy tokens, and steps must replay: a recorder whose replay repeats a stale
input, output or kernel choice fails. A recorder that refuses the step (saying why, e.g.
an op without a native kernel on this CPU) leaves the check not checked with its reason;
a platform without a recorder skips it; one whose device is absent is not checked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hwplug.attention import AttentionMetadata
from hwplug.conformance.result import Outcome
from hwplug.conformance.target import Target

if TYPE_CHECKING:  # the engine is imported when the check runs, not with the kit (0.6 s)
    from hwplug.model_zoo.context import InMemoryCheckpoint
    from hwplug.model_zoo.engine.model_runner import ModelRunner

#: Decode steps per sequence (the first of a batch size runs eagerly: it is recorded at
#: the second).
STEPS = 12
#: Max |logit difference| over the logits' range, replayed vs eager: float32 throughout; a
#: replay may split the attention as for the longest context, the eager step for its own.
TOLERANCE = 1e-4
SEQUENCES = 2
MAX_MODEL_LEN = 64


def _tiny_llama() -> InMemoryCheckpoint:
    from transformers import LlamaConfig, LlamaForCausalLM

    from hwplug.model_zoo.context import InMemoryCheckpoint

    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=MAX_MODEL_LEN,
                         architectures=["LlamaForCausalLM"])
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # peaked next-token distributions: no near-ties to flip
        for name, param in model.named_parameters():
            param.normal_(1.0 if "norm" in name else 0.0, 0.3, generator=generator)
    return InMemoryCheckpoint(config, model.state_dict())


def decode_logits(runner: ModelRunner, tokens: list[int], positions: list[int],
                  slots: list[int], tables: list[list[int]]) -> tuple[torch.Tensor, bool]:
    """A decode step's logits (row i: ``tokens[i]`` at ``positions[i]``, stored at
    ``slots[i]``, blocks ``tables[i]``), from the runner's step graph where it replays one,
    else eagerly; and whether it replayed. Runs under inference mode, as the engine's steps
    do."""
    from hwplug.model_zoo.engine.model_runner import StepInputs

    device = runner.device
    with torch.inference_mode():
        if runner.graphs is not None:
            replayed = runner.graphs.logits(tokens, positions, slots, tables)
            if replayed is not None:
                return replayed.clone(), True
        metadata = AttentionMetadata(
            slot_mapping=torch.tensor(slots, device=device),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(positions, dtype=torch.int32, device=device) + 1,
            query_start_loc=torch.arange(len(tokens) + 1, dtype=torch.int32, device=device),
            max_query_len=1, max_seq_len=max(positions) + 1)
        hidden = runner.forward(StepInputs(torch.tensor(tokens, device=device),
                                           torch.tensor(positions, device=device), metadata,
                                           None))
        return runner.model.compute_logits(hidden), False


def check_step_replay(target: Target) -> Outcome:
    """See the module docstring."""
    platform = target.platform
    if platform is None:
        return "skipped", "the plugin declares no platform"
    if target.placement.simulating:
        return "not checked", f"steps replay on {platform.name}'s device, absent here"
    recorder = platform.step_recorder()
    if recorder is None:
        return "skipped", f"platform {platform.name} replays no steps (step_recorder() is None)"
    from hwplug.model_zoo.context import build_model
    from hwplug.model_zoo.engine.model_runner import GraphLimits, ModelRunner

    model, ctx = build_model(_tiny_llama(), platform=platform, dtype="float32")
    blocks = -(-MAX_MODEL_LEN // ctx.engine_config.block_size)
    graphed = ModelRunner(model, ctx, SEQUENCES * blocks,
                          step_graphs=GraphLimits(SEQUENCES, MAX_MODEL_LEN))
    eager = ModelRunner(model, ctx, SEQUENCES * blocks)
    tables = [list(range(i * blocks, (i + 1) * blocks)) for i in range(SEQUENCES)]
    tokens, worst, replays = [1 + i for i in range(SEQUENCES)], 0.0, 0
    for position in range(STEPS):
        positions = [position] * SEQUENCES
        size = ctx.engine_config.block_size
        slots = [table[position // size] * size + position % size for table in tables]
        got, replayed = decode_logits(graphed, tokens, positions, slots, tables)
        want, _ = decode_logits(eager, tokens, positions, slots, tables)
        replays += replayed
        error = float((got - want).abs().max() / (want.max() - want.min()))
        if error > TOLERANCE or got.argmax(-1).tolist() != want.argmax(-1).tolist():
            return "failed", (f"{recorder.name}: decode step {position + 1} "
                              f"({'replayed' if replayed else 'eager'}) gives logits "
                              f"{error:.2e} of their range from the eager step's (tolerance "
                              f"{TOLERANCE:g}), greedy tokens {got.argmax(-1).tolist()} "
                              f"against {want.argmax(-1).tolist()}")
        worst = max(worst, error)
        tokens = want.argmax(-1).tolist()
    graphs = graphed.graphs
    if graphs.refused:
        return "not checked", f"{recorder.name}: the recorder refused the step: " \
                              f"{'; '.join(sorted(set(graphs.refused.values())))}"
    if not replays:
        return "failed", f"{recorder.name}: no decode step replayed ({graphs.describe()})"
    return "passed", (f"{recorder.name} on {target.placement.device}: {replays} of {STEPS} "
                      f"decode steps of {SEQUENCES} sequences replayed, logits within "
                      f"{worst:.1e} of their range of the eager steps'")
