"""Turning sampled tokens into text: incremental detokenizing, stop strings, ``Output``.

:class:`Detokenizer` follows one sequence: :meth:`~Detokenizer.add_token` decodes only a
small window of recent tokens per step (so the cost does not grow with the output),
holds back bytes of an incomplete UTF-8 character, and reports when the text reaches one
of the stop strings (the text is then cut just before it). :meth:`~Detokenizer.stream`
hands out the text that can no longer change: while a stop string could still be
forming at the end, that tail is held back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: Prompt tokens decoded ahead of the first output token, so a tokenizer that drops a
#: leading space at the start of a decode (SentencePiece) still yields it mid-text.
CONTEXT_TOKENS = 5
_INCOMPLETE = "\ufffd"


@dataclass(frozen=True)
class Logprob:
    """One token's log-probability, its ``rank`` (1 = most likely) in the distribution it
    was drawn from, and its text (vLLM's ``Logprob``)."""

    logprob: float
    rank: int
    decoded_token: str | None = None


#: One dict per generated token: the sampled token and the top-k, token id -> Logprob.
SampleLogprobs = list[dict[int, Logprob]]
#: One entry per prompt token; the first is None (nothing predicts it).
PromptLogprobs = list["dict[int, Logprob] | None"]


@dataclass
class CompletionOutput:
    """One of the ``n`` completions of a prompt (vLLM's ``CompletionOutput``).

    ``text`` is the generated text (stop string removed), ``token_ids`` the generated
    tokens, ``finish_reason`` ``"stop"``, ``"length"`` or ``"abort"``, and ``stop_reason``
    the stop string or stop token id that ended it (None for an end-of-sequence token or
    a length limit). With ``SamplingParams(logprobs=k)``, ``logprobs[i]`` maps the sampled
    token i and the k most likely tokens at that step to their :class:`Logprob`, and
    ``cumulative_logprob`` is the sum of the sampled tokens' log-probabilities; both are
    None without it.
    """

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str
    cumulative_logprob: float | None = None
    logprobs: SampleLogprobs | None = None
    stop_reason: int | str | None = None


@dataclass
class Output:
    """A finished request (vLLM's ``RequestOutput``): the prompt, its ``n`` completions in
    ``outputs`` and, with ``SamplingParams(prompt_logprobs=k)``, ``prompt_logprobs``:
    ``None`` for the first prompt token, then for each prompt token a dict mapping it and
    the k tokens the model found most likely at that position to their :class:`Logprob`.

    ``text``, ``token_ids``, ``finish_reason``, ``logprobs`` and ``cumulative_logprob``
    are those of the first completion (the only one when ``n == 1``).
    """

    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    prompt: str | None = None
    prompt_logprobs: PromptLogprobs | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str:
        return self.outputs[0].finish_reason

    @property
    def logprobs(self) -> SampleLogprobs | None:
        return self.outputs[0].logprobs

    @property
    def cumulative_logprob(self) -> float | None:
        return self.outputs[0].cumulative_logprob


class Detokenizer:
    """Incremental text of one sequence's output tokens."""

    def __init__(self, tokenizer: Any, prompt_ids: Sequence[int],
                 stop: Sequence[str] = ()) -> None:
        self._tokenizer = tokenizer
        self._ids = list(prompt_ids[-CONTEXT_TOKENS:])
        # decoded text covers _ids[:_read]; _ids[_prefix:_read] is the context window
        self._prefix, self._read = 0, len(self._ids)
        self._stop = tuple(stop)
        self._holdback = max(map(len, self._stop), default=1) - 1
        self._streamed = 0
        self.text = ""
        #: The stop string the text reached, once it has.
        self.stop_reason: str | None = None

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    def add_token(self, token_id: int) -> bool:
        """Append one output token; True when the text now contains a stop string (the
        text is cut before it and nothing more should be added)."""
        self._ids.append(token_id)
        before = self._decode(self._ids[self._prefix:self._read])
        after = self._decode(self._ids[self._prefix:])
        if len(after) <= len(before) or after.endswith(_INCOMPLETE):
            return False  # a special token, or a character still missing bytes
        delta = after[len(before):]
        self._prefix, self._read = self._read, len(self._ids)
        start = max(0, len(self.text) - self._holdback)
        self.text += delta
        return self._cut_at_stop(start)

    def _cut_at_stop(self, start: int) -> bool:
        found = [(index, stop) for stop in self._stop
                 if (index := self.text.find(stop, start)) >= 0]
        if found:
            index, self.stop_reason = min(found)
            self.text = self.text[:index]
        return bool(found)

    def stream(self, finished: bool) -> str:
        """Text not handed out before that can no longer change (all of it once
        ``finished``)."""
        end = len(self.text) if finished else max(self._streamed,
                                                  len(self.text) - self._holdback)
        delta = self.text[self._streamed:end]
        self._streamed = end
        return delta
