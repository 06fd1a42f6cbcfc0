"""The engine's parts without a model: block manager, scheduler, sampling, detokenizer.

The scheduler is driven step by step as the engine drives it, with made-up sampled tokens;
top-k, top-p and the repetition penalty are checked against transformers' logits
processors; the detokenizer against a byte-level tokenizer, where one character can take
several tokens.
"""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from hwplug.errors import ConfigError
from hwplug.model_zoo.engine import (
    BlockManager,
    Detokenizer,
    FinishReason,
    Scheduler,
    Sequence,
    SequenceStatus,
)
from hwplug.model_zoo.sampling import (
    SamplingParams,
    SamplingRow,
    _apply_output_penalties,
    _truncate,
    sample,
)

EOS = 0


def make_scheduler(num_blocks: int = 64, block_size: int = 4, max_num_seqs: int = 8,
                   max_num_batched_tokens: int = 64, max_model_len: int = 1000,
                   prefix_caching: bool = True) -> Scheduler:
    manager = BlockManager(num_blocks, block_size, enable_prefix_caching=prefix_caching)
    return Scheduler(manager, max_num_seqs=max_num_seqs,
                     max_num_batched_tokens=max_num_batched_tokens,
                     max_model_len=max_model_len, eos_token_ids=[EOS])


def request(prompt_len: int, max_tokens: int = 4, **params) -> Sequence:
    return Sequence(list(range(1, prompt_len + 1)),
                    SamplingParams(max_tokens=max_tokens, **params))


def run_to_completion(scheduler: Scheduler, token: int = 7, max_steps: int = 1000
                      ) -> list[dict[int, int]]:
    """Step until done, sampling ``token`` every time; returns each step's
    {seq_id: num_new_tokens}, and checks the block accounting after every step."""
    steps = []
    while scheduler.has_unfinished():
        batch = scheduler.schedule()
        assert batch, "scheduler stalled"
        assert batch.num_tokens <= scheduler.max_num_batched_tokens
        assert len(scheduler.running) <= scheduler.max_num_seqs
        steps.append({seq.seq_id: n for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True)})
        scheduler.update(batch, [token] * len(batch.sampled_seqs))
        used = {block for seq in scheduler.running for block in seq.block_table}  # shared once
        assert len(used) + scheduler.block_manager.num_free_blocks == scheduler.block_manager.num_blocks
        assert len(steps) < max_steps
    return steps


# --- block manager -----------------------------------------------------------------------

def test_block_manager_allocates_what_the_tokens_need_and_frees_it():
    manager = BlockManager(num_blocks=5, block_size=4)
    seq = request(6)
    assert manager.allocate(seq, 6) and len(seq.block_table) == 2
    seq.num_computed_tokens = 6
    assert manager.allocate(seq, 2) and len(seq.block_table) == 2  # fits in block 2
    assert manager.allocate(seq, 3) and len(seq.block_table) == 3
    assert len(set(seq.block_table)) == 3 and manager.num_free_blocks == 2
    manager.free(seq)
    assert seq.block_table == [] and manager.num_free_blocks == 5


def test_block_manager_allocation_is_all_or_nothing():
    manager = BlockManager(num_blocks=3, block_size=4)
    first, second = request(8), request(8)
    assert manager.allocate(first, 8)
    assert not manager.allocate(second, 8)
    assert second.block_table == [] and manager.num_free_blocks == 1


# --- scheduler -----------------------------------------------------------------------------

def test_long_prompt_is_prefilled_in_chunks_alongside_decodes():
    scheduler = make_scheduler(max_num_batched_tokens=8)
    short, long = request(3, max_tokens=6), request(20, max_tokens=2)
    scheduler.add(short)
    scheduler.add(long)
    first = scheduler.schedule()
    assert first.num_new_tokens == [3, 5] and first.sampled == [True, False]
    scheduler.update(first, [7])
    second = scheduler.schedule()  # short decodes, long continues its prefill
    assert second.seqs == [short, long] and second.num_new_tokens == [1, 7]
    assert second.sampled == [True, False]
    scheduler.update(second, [7])
    third = scheduler.schedule()
    assert third.num_new_tokens == [1, 7] and third.sampled == [True, False]
    scheduler.update(third, [7])
    fourth = scheduler.schedule()  # the last 1 prompt token: long samples its first token
    assert fourth.num_new_tokens == [1, 1] and fourth.sampled == [True, True]
    scheduler.update(fourth, [7, 7])
    assert long.num_output_tokens == 1 and long.num_computed_tokens == 20


def test_waiting_sequences_join_up_to_max_num_seqs():
    scheduler = make_scheduler(max_num_seqs=2)
    seqs = [request(2, max_tokens=3) for _ in range(3)]
    for seq in seqs:
        scheduler.add(seq)
    steps = run_to_completion(scheduler)
    assert set(steps[0]) == {seqs[0].seq_id, seqs[1].seq_id}
    joined = next(i for i, step in enumerate(steps) if seqs[2].seq_id in step)
    assert joined == 3  # right after the first two finished their 3 tokens
    assert all(seq.finish_reason is FinishReason.LENGTH for seq in seqs)


def test_out_of_blocks_preempts_the_newest_and_recomputes_it():
    # 4 blocks of 4 tokens; two sequences that each grow to 12 tokens cannot both fit
    # (without prefix caching: a cache hit would spare part of the recompute)
    scheduler = make_scheduler(num_blocks=4, block_size=4, prefix_caching=False)
    old, new = request(4, max_tokens=8), request(4, max_tokens=8)
    scheduler.add(old)
    scheduler.add(new)
    steps = run_to_completion(scheduler)
    assert scheduler.num_preemptions >= 1
    assert old.num_output_tokens == new.num_output_tokens == 8
    # the newest one was preempted: at some step only the old one ran, then new came back
    # and recomputed its prompt and output so far in one prefill
    recompute = [step[new.seq_id] for step in steps if step.get(new.seq_id, 0) > 1]
    assert len(recompute) == 2 and recompute[1] > 4
    assert scheduler.block_manager.num_free_blocks == 4


def test_preempted_sequence_keeps_its_place_at_the_front_of_the_queue():
    scheduler = make_scheduler(num_blocks=3, block_size=4, max_num_batched_tokens=64)
    first, second, third = (request(4, max_tokens=5) for _ in range(3))
    for seq in (first, second, third):
        scheduler.add(seq)
    batch = scheduler.schedule()
    assert batch.seqs == [first, second, third]
    scheduler.update(batch, [7, 7, 7])  # each now needs a second block; 0 free
    batch = scheduler.schedule()
    assert batch.seqs == [first]
    assert list(scheduler.waiting) == [second, third]
    assert second.num_computed_tokens == 0 and second.block_table == []
    assert second.status is SequenceStatus.WAITING


@pytest.mark.parametrize(("params", "tokens", "reason", "num_output"), [
    (dict(max_tokens=10), [5, EOS, 5], FinishReason.STOP, 2),
    (dict(max_tokens=3, ignore_eos=True), [EOS, EOS, EOS, EOS], FinishReason.LENGTH, 3),
    (dict(max_tokens=10, stop_token_ids=(9,)), [5, 9, 5], FinishReason.STOP, 2),
    (dict(max_tokens=2), [5, 5, 5], FinishReason.LENGTH, 2),
])
def test_finish_reasons(params, tokens, reason, num_output):
    scheduler = make_scheduler()
    seq = Sequence([1, 2, 3], SamplingParams(**params))
    scheduler.add(seq)
    for token in tokens:
        if seq.is_finished:
            break
        scheduler.update(scheduler.schedule(), [token])
    assert seq.finish_reason is reason and seq.num_output_tokens == num_output
    assert not scheduler.running and scheduler.block_manager.num_free_blocks == 64


def test_generation_stops_at_the_models_context_length():
    scheduler = make_scheduler(max_model_len=6)
    seq = request(4, max_tokens=100)
    scheduler.add(seq)
    run_to_completion(scheduler)
    assert seq.num_tokens == 6 and seq.finish_reason is FinishReason.LENGTH


def test_finish_of_a_waiting_sequence_removes_it():
    scheduler = make_scheduler()
    seq = request(4)
    scheduler.add(seq)
    scheduler.finish(seq, FinishReason.ABORT)
    assert not scheduler.has_unfinished() and seq.finish_reason is FinishReason.ABORT


# --- sampling -------------------------------------------------------------------------------

def rows(params: SamplingParams, n: int) -> list[SamplingRow]:
    return [SamplingRow(params) for _ in range(n)]


def test_greedy_is_argmax():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sample(logits.clone(), rows(SamplingParams(), 6)), logits.argmax(-1))


def test_mixed_greedy_and_sampled_rows():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(), SamplingParams(temperature=1.0, top_k=1)] * 2
    got = sample(logits.clone(), [SamplingRow(p) for p in params],
                 torch.Generator().manual_seed(1))
    assert torch.equal(got, logits.argmax(-1))


@pytest.mark.parametrize(("top_k", "top_p"), [(0, 0.3), (5, 1.0), (10, 0.8), (3, 0.05)])
def test_top_k_top_p_keep_the_same_tokens_as_transformers(top_k, top_p):
    logits = torch.randn(8, 100, generator=torch.Generator().manual_seed(top_k)) * 3
    ours = _truncate(logits.clone(), [SamplingParams(temperature=1, top_k=top_k,
                                                     top_p=top_p)] * 8)
    theirs = logits.clone()
    if top_k:
        theirs = TopKLogitsWarper(top_k)(None, theirs)
    if top_p < 1:
        theirs = TopPLogitsWarper(top_p)(None, theirs)
    assert torch.equal(ours.isinf(), theirs.isinf())
    assert torch.equal(ours[~ours.isinf()], logits[~ours.isinf()])


def test_repetition_penalty_matches_transformers():
    logits = torch.randn(8, 30, generator=torch.Generator().manual_seed(0))
    # each row's history holds its two most likely tokens, so the penalty can move the argmax
    histories = [[*row.topk(2).indices.tolist(), 5, 5] for row in logits]
    params = SamplingParams(repetition_penalty=1.5)
    penalised = torch.stack([
        RepetitionPenaltyLogitsProcessor(1.5)(torch.tensor([history]), row[None].clone())[0]
        for row, history in zip(logits, histories, strict=True)])
    got = sample(logits.clone(), [SamplingRow(params, token_ids=h) for h in histories])
    assert torch.equal(got, penalised.argmax(-1))
    assert not torch.equal(got, logits.argmax(-1))


def test_frequency_and_presence_penalties_count_only_output_tokens():
    logits = torch.zeros(3, 6)
    logits[:, 0] = 1.0
    # prompt [0, 0, 3], output [1, 1, 2]: token 0 is only in the prompt, so untouched
    row = {"token_ids": [0, 0, 3, 1, 1, 2], "num_prompt_tokens": 3}
    rows = [SamplingRow(SamplingParams(frequency_penalty=0.5), **row),
            SamplingRow(SamplingParams(presence_penalty=1.5), **row),
            SamplingRow(SamplingParams(frequency_penalty=-1.0, presence_penalty=0.25), **row)]
    penalised = logits.clone()
    for i, penalty_row in enumerate(rows):
        _apply_output_penalties(penalised[i], penalty_row.token_ids[3:], penalty_row.params)
    assert penalised[0].tolist() == [1.0, -1.0, -0.5, 0.0, 0.0, 0.0]
    assert penalised[1].tolist() == [1.0, -1.5, -1.5, 0.0, 0.0, 0.0]
    assert penalised[2].tolist() == [1.0, 1.75, 0.75, 0.0, 0.0, 0.0]
    assert sample(logits.clone(), rows).tolist() == [0, 0, 1]


def test_penalties_outside_their_range_are_refused():
    with pytest.raises(ConfigError, match="frequency_penalty"):
        SamplingParams(frequency_penalty=2.5)
    with pytest.raises(ConfigError, match="presence_penalty"):
        SamplingParams(presence_penalty=float("nan"))


def test_sampled_frequencies_follow_the_softmax():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0]).repeat(20000, 1)
    params = SamplingParams(temperature=2.0)
    tokens = sample(logits.clone(), rows(params, 20000), torch.Generator().manual_seed(0))
    frequencies = torch.bincount(tokens, minlength=4).float() / 20000
    torch.testing.assert_close(frequencies, (logits[0] / 2).softmax(-1), atol=0.015, rtol=0)


def test_seeded_rows_do_not_depend_on_the_rest_of_the_batch():
    logits = torch.randn(3, 1000, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=1.0, seed=5)

    def seeded_row() -> SamplingRow:
        return SamplingRow(params, torch.Generator().manual_seed(5))

    alone = [sample(logits[1:2].clone(), [seeded_row()]).item() for _ in range(2)]
    in_batch = sample(logits.clone(), [SamplingRow(SamplingParams(temperature=1.0)),
                                       seeded_row(), SamplingRow(SamplingParams())],
                      torch.Generator().manual_seed(99))
    assert alone[0] == alone[1] == in_batch[1].item()


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(temperature=-0.5), "temperature must be a finite number >= 0"),
    (dict(top_p=0.0), "top_p must be a number in (0, 1]"),
    (dict(top_p=1.5), "top_p must be a number in (0, 1]"),
    (dict(top_k=-1), "top_k must be an integer >= 0"),
    (dict(max_tokens=0), "max_tokens must be an integer >= 1"),
    (dict(repetition_penalty=0), "repetition_penalty must be a finite number > 0"),
])
def test_invalid_sampling_parameters_name_the_valid_range(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("]", r"\]")):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("limits", [dict(max_num_seqs=0), dict(max_num_batched_tokens=-1)])
def test_bad_engine_limits_fail_before_the_model_loads(tmp_path, limits):
    import hwplug

    with pytest.raises(ConfigError, match=f"{next(iter(limits))} must be an integer >= 1"):
        hwplug.LLM(tmp_path / "no-such-model.gguf", **limits)


def test_a_single_stop_string_becomes_a_tuple():
    assert SamplingParams(stop="\n").stop == ("\n",)


# --- detokenizer --------------------------------------------------------------------------

class ByteTokenizer:
    """Token = one UTF-8 byte; 256 is a special token that decodes to nothing."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def encode(self, text: str) -> list[int]:
        return list(text.encode())


def feed(detokenizer: Detokenizer, text: str, extra: list[int] = ()) -> tuple[bool, list[str]]:
    streamed = []
    for token in ByteTokenizer().encode(text) + list(extra):
        stopped = detokenizer.add_token(token)
        streamed.append(detokenizer.stream(stopped))
        if stopped:
            return True, streamed
    streamed.append(detokenizer.stream(True))
    return False, streamed


def test_detokenizer_emits_whole_characters_only():
    detokenizer = Detokenizer(ByteTokenizer(), ByteTokenizer().encode("prompt "))
    stopped, streamed = feed(detokenizer, "naïve 日本", extra=[256])
    assert not stopped and detokenizer.text == "naïve 日本"
    assert "".join(streamed) == "naïve 日本"
    assert all("\ufffd" not in delta for delta in streamed)


def test_detokenizer_cuts_the_stop_string_and_never_streams_it():
    detokenizer = Detokenizer(ByteTokenizer(), [65], stop=["END", "\n\n"])
    stopped, streamed = feed(detokenizer, "one EN two END three")
    assert stopped and detokenizer.text == "one EN two "
    assert "".join(streamed) == "one EN two "


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_preemption_under_kv_pressure_always_progresses(prefix_caching):
    # 104 requests, KV for about 4 of them at their full length: the oldest running
    # sequence is never the one preempted, so each step advances it; the run ends within
    # the steps the requests would take one after the other (each prompt in chunks of the
    # step budget, then one step per output token)
    block_size, max_tokens, budget = 4, 12, 16
    prompts = [4 + (7 * i) % 17 for i in range(104)]
    longest = -(-(max(prompts) + max_tokens) // block_size)
    scheduler = make_scheduler(num_blocks=4 * longest, block_size=block_size,
                               max_num_seqs=8, max_num_batched_tokens=budget,
                               prefix_caching=prefix_caching)
    seqs = [request(n, max_tokens=max_tokens) for n in prompts]
    for seq in seqs:
        scheduler.add(seq)
    bound = sum(-(-n // budget) + max_tokens for n in prompts)
    steps = run_to_completion(scheduler, max_steps=bound)
    assert all(seq.num_output_tokens == max_tokens for seq in seqs)
    assert scheduler.num_preemptions > 0  # the pressure was real
    assert len(steps) <= bound
