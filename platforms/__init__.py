"""Cheap hardware probes for every known device kind, and the built-in CPU platform."""
