"""hwplug-cuda: the NVIDIA GPU platform, its Triton kernels and the TRITON_ATTN backend."""
