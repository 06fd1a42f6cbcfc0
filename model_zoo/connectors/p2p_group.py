"""The process group a ``p2p`` connector talks over: its options checked, then joined.

:func:`join_group` checks ``rank``, ``world_size``, ``peer_rank``, ``init_method`` and
``timeout_s`` (a :class:`~hwplug.errors.ConfigError` naming the option) before anything
waits, joins torch.distributed's default group over gloo unless one exists, and checks
the group it is in: a pair needs two ranks, so a world of one is refused at once rather
than left waiting for a peer that cannot exist. A rendezvous that fails (a peer that never
comes within ``timeout_s``, an address that cannot be bound) is a
:class:`~hwplug.connector.KVTransferError` naming the rendezvous.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import torch.distributed as dist

from hwplug import checks
from hwplug.connector import KVTransferError
from hwplug.errors import ConfigError

__all__ = ["INIT_METHODS", "P2PGroup", "join_group"]

logger = logging.getLogger(__name__)

#: torch.distributed rendezvous schemes a p2p connector joins through.
INIT_METHODS = ("env", "tcp", "file")
_OPTION = "kv_connector_config"


@dataclass(frozen=True)
class P2PGroup:
    """This side's place in the group: its ``rank``, its ``peer``'s, and whether the
    connector created the default group (and so destroys it)."""

    rank: int
    peer: int
    owns_group: bool


def _check_init_method(value: Any) -> str:
    """``env://``, ``tcp://HOST:PORT`` (a port in 1..65535) or ``file://PATH``."""
    value = checks.text()(f"{_OPTION} init_method", value)
    parts = urlsplit(value)
    if parts.scheme not in INIT_METHODS:
        raise ConfigError(f"{_OPTION} init_method must start with one of "
                          f"{', '.join(m + '://' for m in INIT_METHODS)}, got {value!r}")
    if parts.scheme == "tcp":
        try:
            port = parts.port
        except ValueError:
            port = None
        if not parts.hostname or not port:
            raise ConfigError(f"{_OPTION} init_method must be tcp://HOST:PORT with a port in "
                              f"1..65535, got {value!r}")
    if parts.scheme == "env":
        master_port = os.environ.get("MASTER_PORT")
        if master_port is not None and not (master_port.isdigit()
                                            and 0 < int(master_port) < 65536):
            raise ConfigError(f"{_OPTION} init_method env:// needs MASTER_PORT in 1..65535, "
                              f"got {master_port!r}")
    return value


def join_group(rank: Any, world_size: Any, peer_rank: Any, init_method: Any,
               timeout_s: Any) -> P2PGroup:
    """Check the options, join (or reuse) the default group, and find the peer."""
    rank = checks.integer(0, none="from the environment")(f"{_OPTION} rank", rank)
    world_size = checks.integer(2, none="from the environment")(f"{_OPTION} world_size",
                                                                world_size)
    peer_rank = checks.integer(0, none="the other of two ranks")(f"{_OPTION} peer_rank",
                                                                  peer_rank)
    timeout_s = checks.real(0, threading.TIMEOUT_MAX, low_open=True)(f"{_OPTION} timeout_s",
                                                                     timeout_s)
    init_method = _check_init_method(init_method)
    for name, value in (("rank", rank), ("peer_rank", peer_rank)):
        if value is not None and world_size is not None and value >= world_size:
            raise ConfigError(f"{_OPTION} {name} {value} is outside world_size {world_size}")
    if peer_rank is not None and peer_rank == rank:
        raise ConfigError(f"{_OPTION} peer_rank {peer_rank} is this connector's own rank")
    owns = not dist.is_initialized()
    if owns:
        try:
            dist.init_process_group("gloo", init_method=init_method,
                                    rank=-1 if rank is None else rank,  # -1: from env://
                                    world_size=-1 if world_size is None else world_size,
                                    timeout=timedelta(seconds=timeout_s))
        except (RuntimeError, ValueError) as exc:  # torch's: timed out, address in use, ...
            raise KVTransferError(f"p2p: could not join {init_method} as rank {rank} of "
                                  f"{world_size} within {timeout_s:g} s (timeout_s): "
                                  f"{exc}") from exc
    me, size = dist.get_rank(), dist.get_world_size()
    peer = (1 - me if size == 2 else None) if peer_rank is None else peer_rank
    problem = (f"the group has {size} rank, a p2p pair needs two" if size < 2
               else "peer_rank is needed in a group of more than two ranks" if peer is None
               else f"peer_rank {peer} is this rank or outside the group of {size}"
               if peer == me or peer >= size else None)
    if problem is not None:
        if owns:
            dist.destroy_process_group()
        raise ConfigError(f"{_OPTION}: {problem} (this is rank {me})")
    logger.info("p2p: rank %d of %d, peer %d", me, size, peer)
    return P2PGroup(me, peer, owns)
