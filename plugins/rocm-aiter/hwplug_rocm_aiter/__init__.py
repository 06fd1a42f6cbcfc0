"""hwplug-rocm-aiter: the AMD GPU platform (ROCm), hwplug-triton's kernels over ROCm's paged
KV layout, and AMD's AITER paged attention where installed."""
