"""The KV connectors hwplug ships (registered by ``hwplug.model_zoo.plugin``).

- ``shared_storage`` (:mod:`.shared_storage`): blocks as safetensors files under a
  directory, shared by every engine (and process) that can read it;
- ``cpu_offload`` (:mod:`.cpu_offload`): a host-memory tier with a byte cap, LRU;
- ``p2p`` (:mod:`.p2p`): disaggregated prefill/decode between two engines over
  torch.distributed point-to-point.

They share :class:`~.layerwise.LayerwiseConnector`: loads run on a thread of their own,
layer by layer, so the model computes layer ``i`` while later layers still load; saves are
copied out right after each layer and stored at the end of the step. Blocks are read and
written through the engine's layout object (``Connector.cache_layout``), and blocks of
another engine's layout are converted through the reference layout
(:func:`hwplug.connector.layout_converter`).
"""
