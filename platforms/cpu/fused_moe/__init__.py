"""One-C-call mixture-of-experts kernels of the CPU platform (see :mod:`.ops`)."""
