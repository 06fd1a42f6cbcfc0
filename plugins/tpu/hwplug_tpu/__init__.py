"""hwplug-tpu: the Google TPU platform, with kernels written in JAX."""
