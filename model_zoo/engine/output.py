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


@dataclass
class Output:
    """A finished request: the generated ``text`` (stop string removed), its
    ``token_ids``, ``finish_reason`` (``"stop"`` or ``"length"``) and the prompt length
    in tokens."""

    text: str
    token_ids: list[int]
    finish_reason: str
    num_prompt_tokens: int


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
        found = [i for i in (self.text.find(stop, start) for stop in self._stop) if i >= 0]
        if found:
            self.text = self.text[:min(found)]
        return bool(found)

    def stream(self, finished: bool) -> str:
        """Text not handed out before that can no longer change (all of it once
        ``finished``)."""
        end = len(self.text) if finished else max(self._streamed,
                                                  len(self.text) - self._holdback)
        delta = self.text[self._streamed:end]
        self._streamed = end
        return delta
