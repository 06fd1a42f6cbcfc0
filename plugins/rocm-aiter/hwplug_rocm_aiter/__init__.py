"""hwplug-rocm-aiter: the AMD Instinct platform (ROCm); AITER kernels come in a later release."""
