"""hwplug-xpu: the Intel GPU (XPU) platform."""
