"""GGUF blocks computed directly on CPUs: a C kernel built on first use (see :mod:`.ops`)."""
