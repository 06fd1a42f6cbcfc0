"""``hwplug serve [MODEL]``: serve a model over an OpenAI-compatible HTTP API.

Loads the model with every ``LLM`` option as a flag (:mod:`hwplug.cli.llm_flags`), binds
``--host``:``--port`` (a port in use is a one-line error), records every decode batch
bucket's step graph (``LLM.warm_up``: no first request pays for one), prints where it
listens on stderr, and serves until SIGTERM or Ctrl-C, then finishes the requests in
flight within ``--shutdown-timeout`` seconds and exits with status 0. Needs the ``serve`` extra; the
endpoints are described in docs/serving.md.
"""

from __future__ import annotations

import argparse
import importlib.util

from rich.console import Console

from hwplug.cli.inputs import number, positive_int, utf8_text
from hwplug.cli.llm_flags import add_llm_flags, llm_options
from hwplug.cli.startup import model_loaded
from hwplug.errors import ConfigError
from hwplug.serve import (
    DEFAULT_MAX_QUEUED_REQUESTS,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_SHUTDOWN_TIMEOUT,
)

#: The packages of the ``serve`` extra.
SERVE_PACKAGES = ("fastapi", "uvicorn", "prometheus_client")


_port = number(int, lambda value: 0 <= value <= 65535,
               "must be in [0, 65535] (0: any free port), got {value}")
_seconds = number(float, lambda value: 0 <= value < float("inf"),
                  "must be a finite number >= 0, got {text}")
_count = number(int, lambda value: value >= 0, "must be at least 0, got {value}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("served_model", nargs="?", metavar="MODEL", type=utf8_text,
                        help="the model (as --model; default: smollm2)")
    parser.add_argument("--host", default="127.0.0.1", type=utf8_text,
                        help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", default=8000, type=_port,
                        help="port to listen on; 0: any free port (default: 8000)")
    parser.add_argument("--served-model-name", type=utf8_text, metavar="NAME",
                        help="the model's name in the API (default: MODEL as given)")
    parser.add_argument("--api-key", type=utf8_text, metavar="KEY",
                        help="require 'Authorization: Bearer KEY' (all but /health, /metrics)")
    parser.add_argument("--max-queued-requests", type=_count, metavar="N",
                        default=DEFAULT_MAX_QUEUED_REQUESTS,
                        help="requests that may wait beyond --max-num-seqs; more get 503 "
                             "(default: %(default)s)")
    parser.add_argument("--max-request-bytes", type=positive_int, metavar="N",
                        default=DEFAULT_MAX_REQUEST_BYTES,
                        help="largest request body; larger get 413 (default: %(default)s)")
    parser.add_argument("--shutdown-timeout", type=_seconds, metavar="S",
                        default=DEFAULT_SHUTDOWN_TIMEOUT,
                        help="seconds requests in flight get to finish after SIGTERM "
                             "(default: %(default)s)")
    add_llm_flags(parser)


def run(args: argparse.Namespace, console: Console) -> int:
    missing = [name for name in SERVE_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(f"hwplug serve needs the serve extra ({', '.join(missing)} missing): "
                          'pip install "hwplug[serve]"')
    from hwplug import LLM
    from hwplug.model_zoo.llm_config import LLMConfig
    from hwplug.model_zoo.loaders.resolve import DEFAULT_MODEL
    from hwplug.serve.app import create_app
    from hwplug.serve.server import Server, bind

    options = llm_options(args)
    if args.served_model is not None:
        if options.get("model") not in (None, args.served_model):
            raise ConfigError(f"two models given: {args.served_model!r} and --model "
                              f"{options['model']!r}; give one")
        options["model"] = args.served_model
    name = args.served_model_name or options.get("model") or DEFAULT_MODEL
    LLMConfig.create(**options)  # bad options and a port in use fail before the load
    sock = bind(args.host, args.port)
    llm = None
    try:
        llm = LLM(**options)
        model_loaded()
        if llm.parallelism.is_worker:  # a torchrun rank > 0: it served rank 0
            return 0
        if not llm.is_encoder:  # no first request at a batch size pays for a recording
            llm.warm_up()
        app = create_app(llm, model_name=name, api_key=args.api_key,
                         max_queued_requests=args.max_queued_requests,
                         max_request_bytes=args.max_request_bytes)
        host, port = sock.getsockname()[:2]
        Console(stderr=True).print(f"serving {name} at http://{host}:{port}/v1 (Ctrl-C or "
                                   "SIGTERM to stop)", highlight=False, markup=False,
                                   soft_wrap=True)
        Server(app, shutdown_timeout=args.shutdown_timeout).serve_forever([sock])
    finally:
        sock.close()
        if llm is not None:
            llm.close()
    return 0
