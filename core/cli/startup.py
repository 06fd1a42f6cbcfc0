"""Starting a model in the ``hwplug`` program: the garbage collector paused while it loads.

Loading a model (importing torch and transformers, reading the checkpoint, building the
layers) allocates millions of objects and frees almost none: the cyclic garbage collector
runs hundreds of times meanwhile (about 0.4 s of CPU at 1.5B parameters) and finds
nothing. :func:`pause_gc` (called by :func:`hwplug.cli.main.main` when it runs a model as
the program) turns it off; :func:`model_loaded` (called by each command once its ``LLM`` is
built) moves every object then alive into the permanent generation (``gc.freeze``: later
collections never walk the model and the modules again) and turns it back on. Called in
a process that did not pause it (a test calling ``main(argv)``), :func:`model_loaded` does
nothing.
"""

from __future__ import annotations

import gc
import logging

logger = logging.getLogger(__name__)

_paused = False


def pause_gc() -> None:
    """Turn the cyclic garbage collector off until :func:`model_loaded` (if it was on)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def model_loaded() -> None:
    """Freeze the objects alive now and turn the collector back on, where
    :func:`pause_gc` turned it off; else nothing."""
    global _paused
    if not _paused:
        return
    gc.freeze()
    gc.enable()
    _paused = False
    if logger.isEnabledFor(logging.DEBUG):  # the count walks every frozen object
        logger.debug("gc resumed after the load, %d objects frozen", gc.get_freeze_count())
