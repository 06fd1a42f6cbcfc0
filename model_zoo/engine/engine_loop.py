"""``EngineLoop``: one thread owns the engine; any number of callers submit and wait.

The design of vLLM's engine core and nano-vllm's loop: the scheduler, the runner and the
KV cache are touched by the loop's thread only. A caller :meth:`~EngineLoop.submit`\\ s a
checked request and gets a :class:`RequestHandle`; the loop takes every request that
arrived since its last step, runs one step over all of them together (so requests from
several threads are batched), and hands each request's new text and final
:class:`~hwplug.model_zoo.engine.output.Output` to that request's handle alone. A caller
never steps the engine, so two streams, or a stream read while ``generate()`` runs, each
see exactly their own request's text.

:meth:`~EngineLoop.abort` drops a request (a stream closed or abandoned); an error raised
by a step (the model failed) ends every request in flight with that error, and the loop
serves the next ones. The thread starts with the first request, sleeps while there is
nothing to do, and stops on :meth:`~EngineLoop.shutdown` (or with the process: it is a
daemon). :class:`TextStream` is a request's text as an iterator; closing or dropping it
aborts the request.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import weakref
from collections.abc import Callable, Iterator
from collections.abc import Sequence as Seq
from concurrent.futures import Future
from typing import Any

from hwplug.errors import EngineStoppedError, RequestAbortedError
from hwplug.model_zoo.engine.llm_engine import LLMEngine, RequestUpdate
from hwplug.model_zoo.engine.output import Output
from hwplug.model_zoo.sampling import SamplingParams

logger = logging.getLogger(__name__)

_ids = itertools.count()


class RequestHandle:
    """One submitted request's results, filled in by the loop's thread.

    The loop puts each step's :class:`RequestUpdate` for the request (and, at the end, the
    error that ended it, if one did) in the handle's queue. After a step (or an abort)
    has delivered to every handle concerned, it calls each distinct ``listener`` of those
    handles once (on the loop's thread; it must not block): handles sharing one listener
    (an event loop's requests) cost one call per step, however many they are, and the
    listener finds which have news by :attr:`has_updates`, to :meth:`take` them.
    """

    def __init__(self, request_id: str, listener: Callable[[], None] | None = None,
                 loop: EngineLoop | None = None) -> None:
        self.request_id = request_id
        self.output: Output | None = None
        self._events: queue.SimpleQueue[RequestUpdate | BaseException] = queue.SimpleQueue()
        self._listener = listener
        self._loop = loop
        self._closed = False

    def abort(self) -> None:
        """Abort the request unless it has finished (its KV blocks are freed at once, by
        the loop's thread); idempotent."""
        if self._loop is not None:
            abort_unfinished(self._loop, self)

    @property
    def finished(self) -> bool:
        """Whether the final output or an error has been delivered (maybe not yet read)."""
        return self._closed

    @property
    def has_updates(self) -> bool:
        """Whether updates wait to be taken (any thread may ask)."""
        return not self._events.empty()

    def _put(self, update: RequestUpdate | BaseException) -> None:
        if isinstance(update, BaseException) or update.output is not None:
            self._closed = True
        self._events.put(update)

    def take(self) -> list[RequestUpdate | BaseException]:
        """The updates (or the final error) delivered since the last call, without
        waiting; sets :attr:`output` when the final update is among them."""
        items = []
        while True:
            try:
                item = self._events.get_nowait()
            except queue.Empty:
                return items
            if isinstance(item, RequestUpdate) and item.output is not None:
                self.output = item.output
            items.append(item)

    def deltas(self) -> Iterator[str]:
        """The request's text piece by piece, as steps produce it; then :attr:`output` is
        set. Raises the error that ended the request, if one did."""
        while self.output is None:
            item = self._events.get()
            if isinstance(item, BaseException):
                raise item
            if item.delta:
                yield item.delta
            self.output = item.output

    def result(self) -> Output:
        """Wait for the request's :class:`Output` (raises the error that ended it)."""
        for _ in self.deltas():
            pass
        assert self.output is not None
        return self.output


class EngineLoop:
    """Runs ``engine`` on a thread of its own; thread-safe. The engine may be set later,
    by a function :meth:`call` runs on that thread (e.g. the one that builds it)."""

    def __init__(self, engine: LLMEngine | None = None) -> None:
        self.engine = engine
        self._commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._idle = threading.Condition()
        self._pending = 0  # commands submitted and not yet applied by the loop
        self._stopped = False

    def submit(self, prompt_ids: Seq[int], sampling: SamplingParams,
               prompt: str | None = None,
               listener: Callable[[], None] | None = None) -> RequestHandle:
        """Check the request in the caller's thread (typed errors raise here), queue it,
        and return its handle (``listener``: see :class:`RequestHandle`)."""
        self.engine.check_request(prompt_ids, sampling)
        handle = RequestHandle(f"req-{next(_ids)}", listener, self)
        self._send("add", (handle, list(prompt_ids), sampling, prompt))
        return handle

    def call(self, function: Callable[[], Any]) -> Any:
        """Run ``function`` on the loop's thread between two steps and return its result
        (for work on the engine's state, e.g. resetting the prefix cache)."""
        future: Future[Any] = Future()
        self._send("call", (function, future))
        return future.result()

    def abort(self, request_id: str) -> None:
        """Drop the request (its blocks are freed by the loop); a finished one is ignored."""
        if not self._stopped:
            self._send("abort", request_id)

    def wait_until_idle(self, timeout: float | None = None) -> bool:
        """Wait until every command is applied and no request is left; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0 and not self._busy(),
                                       timeout)

    def _busy(self) -> bool:
        return self.engine is not None and self.engine.has_unfinished()

    def shutdown(self) -> None:
        """Stop the thread; requests still in flight fail with :class:`EngineStoppedError`."""
        with self._start_lock:
            if self._stopped:
                return
            self._stopped = True
            thread = self._thread
        if thread is not None:
            self._commands.put(("stop", None))
            thread.join()

    def _send(self, kind: str, payload: Any) -> None:
        with self._start_lock:
            if self._stopped:
                raise EngineStoppedError("the engine loop has been shut down")
            with self._idle:
                self._pending += 1
            self._commands.put((kind, payload))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hwplug-engine",
                                                daemon=True)
                self._thread.start()

    def _run(self) -> None:
        handles: dict[str, RequestHandle] = {}
        while True:
            commands = [self._commands.get()] if not self._busy() else []
            while True:
                try:
                    commands.append(self._commands.get_nowait())
                except queue.Empty:
                    break
            if any(kind == "stop" for kind, _ in commands):
                self._fail_all(handles, EngineStoppedError("the engine loop was shut down"))
                return
            for kind, payload in commands:
                self._apply(kind, payload, handles)
            with self._idle:
                self._pending -= len(commands)
            if self._busy():
                self._step(handles)
            with self._idle:
                self._idle.notify_all()

    def _apply(self, kind: str, payload: Any, handles: dict[str, RequestHandle]) -> None:
        if kind == "call":
            function, future = payload
            try:
                future.set_result(function())
            except Exception as exc:
                future.set_exception(exc)
            return
        if kind == "abort":
            self.engine.abort(payload)
            handle = handles.pop(payload, None)
            if handle is not None:
                _deliver([(handle, RequestAbortedError(f"request {payload} was aborted"))])
            return
        handle, prompt_ids, sampling, prompt = payload
        try:
            self.engine.add_request(handle.request_id, prompt_ids, sampling, prompt)
        except Exception as exc:  # delivered to the one caller it concerns
            self.engine.abort(handle.request_id)
            _deliver([(handle, exc)])
            return
        handles[handle.request_id] = handle

    def _step(self, handles: dict[str, RequestHandle]) -> None:
        try:
            updates = self.engine.step()
        except Exception as exc:  # the step failed as a whole: so does every request in it
            logger.debug("engine step failed; ending %d requests", len(handles), exc_info=True)
            self._fail_all(handles, exc)
            return
        delivered: list[tuple[RequestHandle, RequestUpdate | BaseException]] = []
        for update in updates:
            handle = handles.get(update.request_id)
            if handle is None:
                continue
            delivered.append((handle, update if update.error is None else update.error))
            if update.error is not None or update.output is not None:
                del handles[update.request_id]
        _deliver(delivered)

    def _fail_all(self, handles: dict[str, RequestHandle], error: BaseException) -> None:
        if self.engine is not None:
            self.engine.abort_all()
        _deliver([(handle, error) for handle in handles.values()])
        handles.clear()


def _deliver(items: Seq[tuple[RequestHandle, RequestUpdate | BaseException]]) -> None:
    """Put each update in its handle, then call each distinct listener of those handles
    once (see :class:`RequestHandle`)."""
    listeners: dict[int, Callable[[], None]] = {}
    for handle, update in items:
        handle._put(update)
        if handle._listener is not None:
            listeners.setdefault(id(handle._listener), handle._listener)
    for listener in listeners.values():
        listener()


class TextStream:
    """The text of one request, piece by piece as its tokens are produced.

    Iterating yields the new text after each engine step that advanced the request; when
    the iteration ends, :attr:`output` holds the request's :class:`Output`, and the pieces
    joined equal ``output.text``. Closing the stream (:meth:`close`, leaving a ``with``
    block, or dropping it unread) aborts the request and frees its KV blocks.
    """

    def __init__(self, loop: EngineLoop, handle: RequestHandle) -> None:
        self._handle = handle
        self._abort = weakref.finalize(self, abort_unfinished, loop, handle)

    @property
    def output(self) -> Output | None:
        return self._handle.output

    def __iter__(self) -> Iterator[str]:
        try:
            yield from self._handle.deltas()
        finally:
            self.close()

    def close(self) -> None:
        """Abort the request if it is still running (idempotent)."""
        self._abort()

    def __enter__(self) -> TextStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def abort_unfinished(loop: EngineLoop, handle: RequestHandle) -> None:
    """Abort ``handle``'s request unless it has finished."""
    if not handle.finished:
        loop.abort(handle.request_id)
