"""The small ops of a CPU decode step fused in C, built on first use (see :mod:`.ops`)."""
