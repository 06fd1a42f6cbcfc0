"""What the driver (rank 0) tells the other tensor-parallel ranks, and the model that tells it.

Every rank must make the same model calls in the same order: the layers' collectives
(all-reduce after row-parallel linears, the LM head's all-gather) need all of them. The
driver runs the engine; :class:`DriverModel` wraps its shard so that each ``forward`` and
``compute_logits`` first broadcasts a command over the gloo command group, then runs
locally. The workers loop on :meth:`CommandChannel.receive`:

- ``("start", num_blocks)``: allocate the KV cache, then all ranks exchange their pid and
  settled engine configuration (:meth:`CommandChannel.gather`);
- ``("forward", (input_ids, positions, metadata, model_kwargs))``: run the shard's forward
  on the same step (the last hidden states are dropped: they equal rank 0's);
- ``("logits", hidden_rows)``: compute the LM head's logits for the rows rank 0 computes
  them for (identical on every rank after the all-reduces), and drop them;
- ``("stop", None)``: leave the loop.

Tensors travel on the CPU (pickled, through ``broadcast_object_list``) and are moved to
the receiving rank's device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from hwplug.attention import AttentionMetadata

#: Rank that sends the commands.
DRIVER = 0


def to_device(value: Any, device: torch.device | str) -> Any:
    """``value`` with every tensor in it (also inside tuples, lists, dicts and dataclasses)
    moved to ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{field.name: to_device(getattr(value, field.name),
                                                                   device)
                                             for field in dataclasses.fields(value)
                                             if field.init})  # the rest are caches
    if isinstance(value, (list, tuple)):
        return type(value)(to_device(item, device) for item in value)
    if isinstance(value, dict):
        return {key: to_device(item, device) for key, item in value.items()}
    return value


class CommandChannel:
    """Commands from rank 0 over ``group`` (gloo); ``device`` is this rank's."""

    def __init__(self, group: Any, device: torch.device) -> None:
        self.group, self.device = group, device

    def send(self, kind: str, payload: Any) -> None:
        """Rank 0: broadcast the command ``(kind, payload)``."""
        dist.broadcast_object_list([(kind, to_device(payload, "cpu"))], src=DRIVER,
                                   group=self.group)

    def receive(self) -> tuple[str, Any]:
        """Another rank: wait for rank 0's next command."""
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=DRIVER, group=self.group)
        kind, payload = box[0]
        return kind, to_device(payload, self.device)

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order (every rank calls it)."""
        values: list[Any] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(values, value, group=self.group)
        return values


class CommandRunner(Protocol):
    """What :class:`DriverModel` needs of its group."""

    def run(self, kind: str, payload: Any, local: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Send ``(kind, payload)`` to the workers, then return ``local()``."""


class DriverModel:
    """Rank 0's shard of the model, telling the workers to follow each call.

    Called like the model (``model(input_ids, positions, kv_caches, metadata, **kw)`` and
    ``model.compute_logits(hidden)``); every other attribute (``num_layers``,
    ``is_encoder``, ...) is the shard's.
    """

    def __init__(self, model: nn.Module, group: CommandRunner) -> None:
        self.model, self._group = model, group

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor,
                 kv_caches: list[torch.Tensor], metadata: AttentionMetadata,
                 **model_kwargs: torch.Tensor) -> torch.Tensor:
        return self.forward(input_ids, positions, kv_caches, metadata, **model_kwargs)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], metadata: AttentionMetadata,
                **model_kwargs: torch.Tensor) -> torch.Tensor:
        """Hidden states ``[T, hidden]`` of the step (identical on every rank)."""
        return self._group.run(
            "forward", (input_ids, positions, metadata, model_kwargs),
            lambda: self.model(input_ids, positions, kv_caches, metadata, **model_kwargs))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The full-vocabulary logits of ``hidden``'s rows (gathered from every rank)."""
        return self._group.run("logits", hidden, lambda: self.model.compute_logits(hidden))
