"""Speculative decoding end to end (issue 31, item 5), and its engine parts.

Greedy output with speculation equals greedy output without it, token for token, for the
packaged SmolLM2 on 20 prompts, with both proposers (the draft: SmolLM2 cut to its first 8
layers), at batch 1 (one prompt at a time) and batch 8; a stop string inside a verify
step's tokens and a seeded sampled request as well. Verify steps replay step graphs (as
decode steps do), with the tokens of eager steps, and run eagerly when their batch also
prefills. Then, without a model: prompt
lookup, the scheduler's verify steps (k + 1 tokens, rejected proposals' blocks given back,
only accepted tokens in the prefix cache) and the config's errors.
"""

from __future__ import annotations

import logging
from collections import Counter

import pytest

import hwplug
from hwplug.errors import ConfigError
from hwplug.model_zoo.engine.block_manager import BlockManager
from hwplug.model_zoo.engine.decode_graphs import RECORD_AT
from hwplug.model_zoo.engine.proposal_length import ProposalLength
from hwplug.model_zoo.engine.scheduler import Scheduler
from hwplug.model_zoo.engine.sequence import Sequence
from hwplug.model_zoo.llm_config import LLMConfig
from hwplug.model_zoo.sampling import SamplingParams
from hwplug.model_zoo.speculative.ngram import lookup

PROMPTS = [
    "Repeat exactly: the cat sat on the mat. the cat sat on the mat.",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):",
    "Count: one, two, three, four, five, six, seven,",
    "The capital of France is",
    "Write a haiku about the sea.",
    "Quote the sentence 'All models are wrong, but some are useful.' and explain it.",
    "List the days of the week: Monday, Tuesday, Wednesday,",
    "for i in range(10):\n    print(i)\nfor j in range(10):\n",
    "Once upon a time, there was a little robot who",
    "Translate to French: good morning, good evening, good night.",
    "The alphabet: a b c d e f g h i j k",
    "Explain photosynthesis in one sentence.",
    "<html><body><p>Hello</p><p>World</p><p>",
    "What is 12 times 12?",
    "Rename x to count in: x = 0\nx += 1\nprint(x)\n\nResult:\n",
    "Summarise: 'The meeting is moved to Friday. The meeting room is 4B.'",
    "Why is the sky blue?",
    "1, 1, 2, 3, 5, 8, 13, 21,",
    "import os\nimport sys\nimport json\nimport",
    "Tell me a joke about programmers.",
]
GREEDY = hwplug.SamplingParams(max_tokens=8)
OPTIONS = {"max_num_seqs": 8, "max_model_len": 256}
#: Fixed-length proposals (adaptive_length off): which paths a run takes does not depend on
#: the machine's timings (test_the_adaptive_length_keeps_the_greedy_output has it on).
SPECULATIVE = {"ngram": {"method": "ngram", "num_speculative_tokens": 4,
                         "adaptive_length": False},
               "draft_model": {"method": "draft_model", "num_speculative_tokens": 3,
                               "num_layers": 8, "adaptive_length": False}}


def generate(llm: hwplug.LLM, batch: int) -> list[list[int]]:
    """Greedy tokens of every prompt, ``batch`` prompts at a time."""
    return [output.outputs[0].token_ids for start in range(0, len(PROMPTS), batch)
            for output in llm.generate(PROMPTS[start:start + batch], GREEDY)]


#: A copying prompt, and a stop string its greedy output reaches in the middle of a
#: verify step's accepted tokens.
COPY = "Colors: red, green, blue, yellow, red, green, blue, yellow, red, green,"
STOP = hwplug.SamplingParams(max_tokens=24, stop=["blue, red, green, blue"])


@pytest.fixture(scope="module")
def expected() -> tuple[list[list[int]], list[int]]:
    llm = hwplug.LLM(**OPTIONS)
    try:
        return generate(llm, 8), llm.generate(COPY, STOP)[0].token_ids
    finally:
        llm.close()


@pytest.mark.parametrize("method", sorted(SPECULATIVE))
def test_greedy_output_is_the_same_with_speculation(expected, method):
    llm = hwplug.LLM(**OPTIONS, speculative_config=SPECULATIVE[method])
    try:
        assert llm.config.speculative.startswith(method)
        for batch in (1, 8):
            assert generate(llm, batch) == expected[0], (method, batch)
        # the tokens after a stop string inside a verify step's tokens are dropped
        stopped = llm.generate(COPY, STOP)[0]
        assert stopped.token_ids == expected[1] and stopped.finish_reason == "stop"
        stats = llm.engine.stats()
        # proposals were verified, some accepted and some rejected (both paths ran)
        assert 0 < stats.spec_accepted_tokens < stats.spec_proposed_tokens
        assert stats.mean_accepted_length == 1 + (stats.spec_accepted_tokens
                                                  / stats.spec_verifications)
        assert stats.kv_blocks_used == 0  # every block given back, rejected ones included
        assert stats.replayed_verify_steps > 0  # verify steps replayed step graphs
        # a seeded sampled request goes through the stochastic rule, reproducibly
        sampled = hwplug.SamplingParams(max_tokens=8, temperature=0.8, top_p=0.9, seed=3)
        first = llm.generate(PROMPTS[0], sampled)[0].token_ids
        assert llm.generate(PROMPTS[0], sampled)[0].token_ids == first
        assert llm.engine.stats().spec_verifications > stats.spec_verifications
    finally:
        llm.close()


#: Chunked prefill (32 tokens a step): LONG's chunks share steps with COPY's verify steps
#: when both run at once.
CHUNKED = {"max_num_seqs": 2, "max_model_len": 128, "max_num_batched_tokens": 32}
LONG = " ".join(PROMPTS[:4])


def test_verify_steps_replay_step_graphs_with_the_eager_tokens(caplog):
    params = hwplug.SamplingParams(max_tokens=16, ignore_eos=True)
    tokens = {}
    for graphs in (True, False):  # verify steps of j + 1 rows: bucket j + 1 each
        llm = hwplug.LLM(**CHUNKED, speculative_config=SPECULATIVE["ngram"],
                         step_graphs=graphs)
        try:
            caplog.clear()
            with caplog.at_level(logging.DEBUG, "hwplug.model_zoo.engine"):
                alone = llm.generate(COPY, params)[0].outputs[0].token_ids
                single = llm.engine.stats()
                # the verify steps that ran eagerly before their bucket was recorded
                unrecorded = Counter(record.args[1] for record in caplog.records
                                     if "is recorded at its step" in record.msg
                                     and record.args[0] > 1)
                pair = [out.outputs[0].token_ids for out in llm.generate([COPY, LONG], params)]
            stats = llm.engine.stats()
            tokens[graphs] = alone, pair
            assert single.spec_verifications > 0 and stats.spec_accepted_tokens > 0
            if not graphs:
                assert llm.runner.graphs is None and stats.replayed_verify_steps == 0
                continue
            # alone, every verify step (one sequence each, in the bucket of its rows)
            # replayed but those before its bucket was recorded (RECORD_AT)
            assert unrecorded and set(unrecorded.values()) == {RECORD_AT - 1}
            assert single.replayed_verify_steps == (single.spec_verifications
                                                    - sum(unrecorded.values()))
            replayed = llm.runner.graphs
            assert replayed.verify_replays == stats.replayed_verify_steps
            assert (f"({replayed.replays} steps, {stats.replayed_verify_steps} of them verify "
                    f"steps)") in replayed.describe()
            # beside LONG's prefill chunks COPY's verify steps ran eagerly, saying why; once
            # both decode, their verify steps replay
            assert "a verify step runs eagerly: its batch also prefills" in caplog.text
            assert stats.replayed_verify_steps > single.replayed_verify_steps
        finally:
            llm.close()
    assert tokens[True] == tokens[False]
    assert tokens[True][1][0] == tokens[True][0]  # COPY's tokens, alone or beside LONG


def test_prompt_lookup_proposes_what_followed_the_latest_longest_match():
    tokens = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    assert lookup(tokens, 2, 4, 3) == [7, 8, 5]  # "2 3" last seen before 7 8 5
    assert lookup(tokens, 1, 1, 2) == [7, 8]  # "3" -> the latest earlier 3
    assert lookup(tokens + [4], 1, 3, 2) == []  # 4 never appeared before
    assert lookup([5, 6, 5, 6], 2, 2, 5) == [5, 6]  # up to the end of the tokens
    assert lookup(tokens, 1, 16, 3) == [7, 8, 5]  # up to 16: "2 3" is the longest match


def test_a_shorter_match_proposes_only_when_every_occurrence_agrees():
    # "3" alone (shorter than 2) is followed by 9 once and by 7 once: ambiguous
    ambiguous = [1, 2, 3, 9, 4, 2, 3, 7, 8, 6, 3]
    assert lookup(ambiguous, 2, 4, 3, unambiguous=True) == []
    # "8" occurs once before: unambiguous, proposed although shorter than 2
    once = [*ambiguous, 5, 8]
    assert lookup(once, 2, 4, 3, unambiguous=True) == [6, 3, 5]
    assert lookup(once, 2, 4, 3) == []  # without the option: none
    # "2 3" twice, followed by 9 and 7: "1 2 3" is the longest and proposes as before
    assert lookup([1, 2, 3, 9, 4, 2, 3, 7, 1, 2, 3], 3, 4, 2, unambiguous=True) == [9, 4]
    # the same token after every occurrence of a 2-token match: proposed
    assert lookup([5, 2, 3, 9, 6, 2, 3, 9, 7, 2, 3], 3, 4, 2, unambiguous=True) == [9, 7]


def test_a_verify_step_keeps_accepted_tokens_and_gives_back_rejected_blocks():
    blocks = BlockManager(8, 4)
    scheduler = Scheduler(blocks, max_num_seqs=2, max_num_batched_tokens=64, max_model_len=64)
    seq = Sequence([1, 2, 3, 4, 5, 6], SamplingParams(max_tokens=20))
    scheduler.add(seq)
    scheduler.update(scheduler.schedule(), [7])  # prefill: 6 computed, token 7 sampled
    seq.spec_token_ids = [8, 9, 10, 11, 12, 13]
    batch = scheduler.schedule()
    assert batch.num_new_tokens == [7] and batch.sampled == [True]
    assert len(seq.block_table) == 4  # 13 tokens: 4 blocks of 4
    # the target kept 8 and 9, then chose 20 itself
    ((advanced, kept),) = scheduler.update(batch, [[8, 9, 20]])
    assert advanced is seq and kept == [8, 9, 20]
    assert seq.token_ids == [1, 2, 3, 4, 5, 6, 7, 8, 9, 20] and seq.spec_token_ids == []
    assert seq.num_computed_tokens == 9  # 20 is computed in the next step
    assert len(seq.block_table) == 3 and blocks.num_free_blocks == 5
    # full blocks of accepted tokens are cached under their hashes; nothing past them
    assert seq.num_cached_blocks == 2 and blocks.num_cached_blocks == 2


def test_proposals_the_token_budget_cannot_take_are_dropped():
    blocks = BlockManager(8, 4)
    scheduler = Scheduler(blocks, max_num_seqs=2, max_num_batched_tokens=3, max_model_len=64)
    seq = Sequence([1, 2], SamplingParams(max_tokens=20))
    scheduler.add(seq)
    scheduler.update(scheduler.schedule(), [3])
    seq.spec_token_ids = [4, 5, 6, 7]
    batch = scheduler.schedule()
    assert batch.num_new_tokens == [3] and seq.spec_token_ids == [4, 5]


@pytest.mark.parametrize(("config", "message"), [
    ({"method": "eagle", "num_speculative_tokens": 2}, "must be one of draft_model, ngram"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "an integer in \\[1, 15\\]"),
    ({"method": "ngram", "num_speculative_tokens": 2, "n": 3},
     "no option n; options: method, num_speculative_tokens, adaptive_length, "
     "prompt_lookup_min"),
    ({"method": "ngram", "num_speculative_tokens": 2, "adaptive_length": 1},
     "adaptive_length'\\] must be True or False, got int 1"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 20},
     "prompt_lookup_min \\(20\\) must be <= prompt_lookup_max \\(16\\)"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_unambiguous": "yes"},
     "prompt_lookup_unambiguous'\\] must be True or False, got str 'yes'"),
    ({"method": "draft_model", "num_speculative_tokens": 2, "num_layers": 0},
     "num_layers'\\] must be None"),
])
def test_a_bad_speculative_config_names_the_valid_choices(config, message):
    with pytest.raises(ConfigError, match=message):
        LLMConfig.create(speculative_config=config)


def test_the_adaptive_length_keeps_the_greedy_output(expected):
    llm = hwplug.LLM(**OPTIONS, speculative_config={"method": "ngram",
                                                    "num_speculative_tokens": 4})
    try:
        assert generate(llm, 8) == expected[0]
        assert llm.engine.stats().spec_verifications > 0
        # the engine timed its replayed decode and verify steps for the length's cost fit
        assert llm.engine.speculator.lengths.steps_timed > 0
    finally:
        llm.close()


def timed_steps(lengths: ProposalLength, fixed: float, per_row: float, rows=(1, 5)) -> None:
    """Steps of each of ``rows`` query rows, timed as ``fixed + per_row * rows``."""
    for _ in range(20):
        for count in rows:
            lengths.observe_step(count, fixed + per_row * count)


def test_proposal_length_is_what_pays_for_the_verify_rows():
    """p ** j >= r: a row costing a fifth of a one-row step (r = 0.2) takes proposals while
    the chance that all of them are accepted stays above 0.2."""
    lengths = ProposalLength()
    assert lengths.length(1, 4, 1) == 1  # no spread of row counts timed yet: one token
    timed_steps(lengths, fixed=0.008, per_row=0.002)
    assert lengths.row_cost(1) == pytest.approx(0.2)
    assert lengths.row_cost(8) == pytest.approx(0.016 / 0.024)  # a step shared by 8
    assert lengths.length(1, 4, 1) == 2  # the prior 1 in 2: 0.25 >= 0.2 > 0.125
    for _ in range(10):  # everything accepted: p -> 1
        lengths.observe_verification(1, 4, 4)
    assert lengths.length(1, 4, 1) == 4
    assert lengths.length(1, 2, 1) == 2  # never past the limit


def test_a_sequence_whose_proposals_fail_probes_one_token_now_and_then():
    lengths = ProposalLength()
    timed_steps(lengths, fixed=0.008, per_row=0.002)
    for _ in range(10):
        lengths.observe_verification(7, 1, 0)
    assert [lengths.length(7, 4, 1) for _ in range(32)] == ([0] * 15 + [1]) * 2
    # weights bound steps (rows almost free): proposing pays even at low acceptance
    cheap = ProposalLength()
    timed_steps(cheap, fixed=0.020, per_row=0.0001)
    for _ in range(10):
        cheap.observe_verification(7, 1, 0)
        cheap.observe_verification(7, 4, 1)
    assert cheap.length(7, 4, 1) >= 1
    cheap.keep_only({8})  # 7 finished: back to the prior
    assert cheap.length(7, 4, 1) == 4
