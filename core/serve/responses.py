"""The JSON ``hwplug serve`` answers generation requests with, in OpenAI's shapes.

A :class:`Formatter` builds one request's answer: the whole response of a request that
does not stream (:meth:`Formatter.response`, from the engine's outputs), or, streaming,
one chunk per completion that an engine step advanced (:meth:`Formatter.chunks`, from
the step's :class:`~hwplug.model_zoo.engine.llm_engine.SampleDelta`) and the usage chunk
last. Completion ``i`` of prompt ``p`` is choice ``p * n + i``. The streamed texts of a
choice joined equal its text in the response that does not stream.

Log-probabilities take two shapes: a completion's legacy object (``tokens``,
``token_logprobs``, ``top_logprobs`` as token text -> log-probability, ``text_offset``)
and a chat completion's ``content`` list (``token``, ``logprob``, ``bytes``,
``top_logprobs``). They are the model's raw distribution (before temperature and
truncation); a streamed ``echo`` carries the prompt's text but not its log-probabilities.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from hwplug.serve.prepare import Prepared

if TYPE_CHECKING:
    from hwplug.model_zoo.engine.llm_engine import RequestUpdate
    from hwplug.model_zoo.engine.output import Logprob, Output


class Formatter:
    """The answer to one ``completion`` or ``chat`` request for ``model``; ``decode``
    gives a token's text (the first prompt token's, which has no log-probability)."""

    def __init__(self, kind: str, model: str, prepared: Prepared,
                 decode: Callable[[int], str]) -> None:
        self.model, self.prepared, self.decode = model, prepared, decode
        self.chat = kind == "chat"
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.object = "chat.completion" if self.chat else "text_completion"
        #: Tokens generated so far over every choice.
        self.completion_tokens = 0
        self._offsets: dict[int, int] = {}  # choice -> text streamed so far (text_offset)

    def usage(self) -> dict[str, int]:
        prompt = self.prepared.num_prompt_tokens
        return {"prompt_tokens": prompt, "completion_tokens": self.completion_tokens,
                "total_tokens": prompt + self.completion_tokens}

    def _head(self, suffix: str = "") -> dict[str, Any]:
        return {"id": self.id, "object": self.object + suffix, "created": self.created,
                "model": self.model}

    # --- the whole response ----------------------------------------------------------

    def response(self, outputs: Sequence[Output]) -> dict[str, Any]:
        """The response to a request that does not stream, from each prompt's output."""
        n = self.prepared.sampling.n
        choices = []
        for p, output in enumerate(outputs):
            for completion in output.outputs:
                self.completion_tokens += len(completion.token_ids)
                choice = {"index": p * n + completion.index,
                          "finish_reason": completion.finish_reason,
                          "stop_reason": completion.stop_reason}
                rows = completion.logprobs or []
                if self.chat:
                    choice["message"] = {"role": "assistant", "content": completion.text}
                    choice["logprobs"] = None if self.prepared.logprobs is None else {
                        "content": self._chat_logprobs(completion.token_ids, rows)}
                else:
                    text = completion.text
                    ids, all_rows = list(completion.token_ids), list(rows)
                    if self.prepared.echo:
                        text = self.prepared.prompt_texts[p] + text
                        ids = output.prompt_token_ids + ids
                        all_rows = list(output.prompt_logprobs or
                                        [None] * len(output.prompt_token_ids)) + all_rows
                    choice["text"] = text
                    choice["logprobs"] = None if self.prepared.logprobs is None else (
                        _legacy_logprobs(ids, all_rows, 0, self.decode))
                choices.append(choice)
        choices.sort(key=lambda choice: choice["index"])
        return {**self._head(), "choices": choices, "usage": self.usage()}

    # --- streaming -------------------------------------------------------------------

    def chunks(self, prompt_index: int, update: RequestUpdate) -> list[dict[str, Any]]:
        """One chunk per completion ``update`` advanced with something to tell (text,
        log-probabilities or its end)."""
        out = []
        for sample in update.samples:
            self.completion_tokens += len(sample.token_ids)
            index = prompt_index * self.prepared.sampling.n + sample.index
            first = index not in self._offsets
            text = sample.text
            if first and self.prepared.echo:
                text = self.prepared.prompt_texts[prompt_index] + text
            offset = self._offsets.get(index, 0)
            self._offsets[index] = offset + len(text)
            wants_logprobs = self.prepared.logprobs is not None
            if not (text or first or wants_logprobs or sample.finish_reason):
                continue
            choice: dict[str, Any] = {"index": index, "finish_reason": sample.finish_reason,
                                      "stop_reason": sample.stop_reason}
            rows = sample.logprobs or []
            if self.chat:
                choice["delta"] = {"role": "assistant", "content": text} if first else {
                    "content": text}
                choice["logprobs"] = {"content": self._chat_logprobs(
                    sample.token_ids, rows)} if wants_logprobs else None
            else:
                choice["text"] = text
                choice["logprobs"] = _legacy_logprobs(
                    sample.token_ids, rows, offset, self.decode) if wants_logprobs else None
            out.append({**self._head(".chunk" if self.chat else ""), "choices": [choice]})
        return out

    def usage_chunk(self) -> dict[str, Any]:
        """The last chunk of a stream that asked for ``include_usage``."""
        return {**self._head(".chunk" if self.chat else ""), "choices": [],
                "usage": self.usage()}

    def _chat_logprobs(self, token_ids: Sequence[int], rows: Sequence[Any]
                       ) -> list[dict[str, Any]]:
        k = self.prepared.logprobs or 0
        content = []
        for token, row in zip(token_ids, rows, strict=True):
            chosen = row[token]
            top = sorted(row.values(), key=lambda entry: entry.rank)[:k]
            content.append({**_chat_token(chosen),
                            "top_logprobs": [_chat_token(entry) for entry in top]})
        return content


def _text(entry: Logprob) -> str:
    return entry.decoded_token or ""


def _chat_token(entry: Logprob) -> dict[str, Any]:
    text = _text(entry)
    return {"token": text, "logprob": entry.logprob, "bytes": list(text.encode("utf-8"))}


def _legacy_logprobs(token_ids: Sequence[int], rows: Sequence[Any], offset: int,
                     decode: Callable[[int], str]) -> dict[str, list[Any]]:
    """A completion's ``logprobs`` object for ``token_ids`` and their rows (a None row,
    the first prompt token's, has no log-probability), text starting at ``offset``."""
    result: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                                    "text_offset": []}
    for token, row in zip(token_ids, rows, strict=True):
        chosen = None if row is None else row[token]
        text = decode(token) if chosen is None else _text(chosen)
        result["tokens"].append(text)
        result["token_logprobs"].append(None if chosen is None else chosen.logprob)
        result["top_logprobs"].append(None if row is None else {
            _text(entry): entry.logprob for entry in row.values()})
        result["text_offset"].append(offset)
        offset += len(text)
    return result
