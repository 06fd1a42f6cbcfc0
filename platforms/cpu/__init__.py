"""The built-in CPU platform, all in one place: its probe (``probe``), the ``Platform``
(``platform``), the kernel variants it adds over the references (``kernels``, ``onednn``)
and the plugin module registering them (``plugin``). Importing this package imports
nothing heavy; ``kernels`` and ``onednn`` import torch."""
