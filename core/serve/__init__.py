"""``hwplug serve``: an OpenAI-compatible HTTP server over one :class:`~hwplug.LLM`.

Needs the ``serve`` extra (``pip install "hwplug[serve]"``: FastAPI, uvicorn,
prometheus-client). :func:`~hwplug.serve.app.create_app` builds the app of a loaded
model; :class:`~hwplug.serve.server.Server` runs it under uvicorn with a graceful
shutdown; ``hwplug serve`` (:mod:`hwplug.cli.serve`) does both from the command line.
See docs/serving.md.
"""
