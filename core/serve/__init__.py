"""``hwplug serve``: an OpenAI-compatible HTTP server over one :class:`~hwplug.LLM`.

Needs the ``serve`` extra (``pip install "hwplug[serve]"``: FastAPI, uvicorn,
prometheus-client). :func:`~hwplug.serve.app.create_app` builds the app of a loaded
model; :class:`~hwplug.serve.server.Server` runs it under uvicorn with a graceful
shutdown; ``hwplug serve`` (:mod:`hwplug.cli.serve`) does both from the command line.
See docs/serving.md.
"""

#: Prompts that may wait beyond the engine's ``max_num_seqs`` before requests get 503.
DEFAULT_MAX_QUEUED_REQUESTS = 256
#: The largest request body (bytes) before requests get 413.
DEFAULT_MAX_REQUEST_BYTES = 4 * 2**20
#: Seconds requests in flight get to finish after a shutdown begins.
DEFAULT_SHUTDOWN_TIMEOUT = 30.0

__all__ = ["DEFAULT_MAX_QUEUED_REQUESTS", "DEFAULT_MAX_REQUEST_BYTES", "DEFAULT_SHUTDOWN_TIMEOUT"]
