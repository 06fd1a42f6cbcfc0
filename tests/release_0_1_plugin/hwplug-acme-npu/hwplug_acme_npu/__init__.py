"""hwplug-acme-npu: the hwplug platform plugin for acme-npu devices."""
