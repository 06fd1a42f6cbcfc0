"""hwplug-cuda: the NVIDIA GPU platform; its kernels come from hwplug-triton, plus cuBLASLt
fp8 ``scaled_mm`` and the TRITON_ATTN and TRITON_MLA backends."""
