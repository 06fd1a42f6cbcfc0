"""hwplug-xpu: the Intel GPU (XPU) platform, hwplug-triton's kernels for it, and
intel-extension-for-pytorch's paged attention where installed."""
