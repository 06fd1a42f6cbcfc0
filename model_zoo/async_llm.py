"""``AsyncLLM``: an :class:`~hwplug.LLM`'s engine driven from an asyncio event loop.

Requests from any number of coroutines (an HTTP server's connections) go to the ``LLM``'s
one engine thread, which batches them with everything else running (continuous
batching: a request joins the running batch at the next step). Each request is an
:class:`AsyncRequest` of one or more prompts: ``async for index, update in
request.updates()`` yields each engine step's
:class:`~hwplug.model_zoo.engine.llm_engine.RequestUpdate` for each prompt, a prompt's
last one holding its :class:`~hwplug.model_zoo.engine.output.Output`. The engine thread wakes
the event loop through ``call_soon_threadsafe`` once per step that gave any of its requests
an update, however many requests it advanced (a :class:`_Waker` per event loop, shared
by the loop's requests); the loop then wakes each coroutine whose request has news, so
no thread blocks on a request and 64 streams cost one cross-thread call per step, not 64.
:meth:`AsyncRequest.abort` (a client that went away) drops the request and frees its KV
blocks at the engine's next turn; leaving ``updates()`` early does the same.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import AsyncIterator
from collections.abc import Sequence as Seq

from hwplug.errors import ConfigError
from hwplug.model_zoo.engine.engine_loop import RequestHandle
from hwplug.model_zoo.engine.llm_engine import EngineStats, RequestUpdate
from hwplug.model_zoo.engine.output import Output
from hwplug.model_zoo.llm import LLM
from hwplug.model_zoo.sampling import SamplingParams

__all__ = ["AsyncLLM", "AsyncRequest"]

logger = logging.getLogger(__name__)


class _Waker:
    """The listener an event loop's requests share: called on the engine's thread after a
    step that delivered to any of them, it schedules one :meth:`_wake` on the loop (none
    while one is pending), which sets the event of each request with updates to take."""

    def __init__(self, event_loop: asyncio.AbstractEventLoop) -> None:
        self._event_loop = weakref.ref(event_loop)  # AsyncLLM's dict of wakers keys on it
        self._requests: weakref.WeakSet[AsyncRequest] = weakref.WeakSet()  # unread: dropped
        self._scheduled = False

    def add(self, request: AsyncRequest) -> None:
        self._requests.add(request)

    def discard(self, request: AsyncRequest) -> None:
        self._requests.discard(request)

    def __call__(self) -> None:  # on the engine's thread
        if self._scheduled:  # the pending wake will see this step's updates too
            return
        self._scheduled = True
        event_loop = self._event_loop()
        try:
            if event_loop is not None:
                event_loop.call_soon_threadsafe(self._wake)
                return
        except RuntimeError:  # the event loop has closed
            pass
        logger.debug("an update for requests whose event loop has closed: nobody reads it")

    def _wake(self) -> None:  # on the event loop
        self._scheduled = False  # before looking: a later step schedules a new wake
        for request in list(self._requests):
            if request.has_updates:
                request._event.set()


class AsyncRequest:
    """Prompts started together on the engine (each its own engine request, with
    ``sampling.n`` completions), read from the event loop that started them (woken by
    that loop's ``waker``)."""

    def __init__(self, llm: LLM, prompt_ids: Seq[Seq[int]], sampling: SamplingParams,
                 prompts: Seq[str | None], waker: _Waker) -> None:
        self._event = asyncio.Event()
        self._waker = waker
        #: When the request was submitted (``time.monotonic()``).
        self.arrival = time.monotonic()
        self.prompt_ids = [list(ids) for ids in prompt_ids]
        self.sampling = sampling
        self._handles: list[RequestHandle] = []
        waker.add(self)
        try:
            for ids, prompt in zip(self.prompt_ids, prompts, strict=True):
                self._handles.append(llm.submit(ids, sampling, prompt, waker))
        except BaseException:
            self.abort()
            raise

    @property
    def has_updates(self) -> bool:
        """Whether any prompt has updates delivered and not yet read."""
        return any(handle.has_updates for handle in self._handles)

    @property
    def outputs(self) -> list[Output | None]:
        """Each prompt's output (None until its last update was read)."""
        return [handle.output for handle in self._handles]

    async def updates(self) -> AsyncIterator[tuple[int, RequestUpdate]]:
        """``(prompt index, update)`` for each engine step's update, as the engine makes
        them; a prompt's last update holds its :class:`Output`. Raises the error that
        ended a prompt's request (e.g. :class:`~hwplug.errors.RequestAbortedError` after
        :meth:`abort`). Leaving the iteration before the end aborts what still runs."""
        pending = set(range(len(self._handles)))
        try:
            while pending:
                for index in sorted(pending):
                    for item in self._handles[index].take():
                        if isinstance(item, BaseException):
                            raise item
                        yield index, item
                        if item.output is not None:
                            pending.discard(index)
                if pending:
                    await self._event.wait()
                    self._event.clear()
        finally:
            self.abort()
            self._waker.discard(self)

    async def result(self) -> list[Output]:
        """Wait for every prompt's :class:`Output`, in order."""
        async for _ in self.updates():
            pass
        return [output for output in self.outputs if output is not None]

    def abort(self) -> None:
        """Drop the prompts still running; their KV blocks are freed by the engine's
        thread before its next step. Idempotent."""
        for handle in self._handles:
            handle.abort()


class AsyncLLM:
    """The asynchronous front of ``llm`` (a decoder; data parallelism is not served)."""

    def __init__(self, llm: LLM) -> None:
        if llm.parallelism.data_parallel_size > 1:
            raise ConfigError("AsyncLLM drives one engine: data_parallel_size must be 1, got "
                              f"{llm.parallelism.data_parallel_size}")
        self.llm = llm
        self._wakers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Waker] = (
            weakref.WeakKeyDictionary())

    def submit(self, prompt_ids: Seq[Seq[int]], sampling: SamplingParams,
               prompts: Seq[str | None] | None = None) -> AsyncRequest:
        """Check and start one request per prompt of token ids (``prompts``: their texts,
        for the outputs), from the event loop's thread. A prompt the engine cannot run
        raises a typed error here
        (:meth:`~hwplug.model_zoo.engine.llm_engine.LLMEngine.check_request`) and none
        runs."""
        texts = [None] * len(prompt_ids) if prompts is None else list(prompts)
        event_loop = asyncio.get_running_loop()
        waker = self._wakers.get(event_loop)
        if waker is None:
            waker = self._wakers[event_loop] = _Waker(event_loop)
        return AsyncRequest(self.llm, prompt_ids, sampling, texts, waker)

    def stats(self) -> EngineStats:
        """The engine's load now (see :meth:`LLMEngine.stats`)."""
        return self.llm.engine.stats()
