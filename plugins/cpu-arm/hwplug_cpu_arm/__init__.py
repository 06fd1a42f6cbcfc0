"""hwplug-cpu-arm: Arm CPUs (Neoverse, Graviton, Apple silicon)."""
