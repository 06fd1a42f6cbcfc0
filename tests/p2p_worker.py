"""The two processes of a disaggregated prefill/decode test (``test_p2p.py``).

``run(rank, ...)`` builds an ``LLM`` with the ``p2p`` connector, rank 0 the producer
(prefill, ``max_tokens=1``), rank 1 the consumer (decode), and reports through ``results``.
``FailingProducer`` is a producer whose process dies after sending ``_die_after`` layer
tensors of a transfer: a transport error mid-transfer, as a crashed peer makes one.
``SlowConsumer`` starts each load late: a peer slower than the model's first layers.
"""

from __future__ import annotations

import os
import time
import traceback
from typing import Any

import hwplug
from hwplug.model_zoo.connectors.p2p import P2PConnector

DECODE = hwplug.SamplingParams(max_tokens=6, ignore_eos=True)
#: Run by a slow consumer first, so that its decode steps of two replay step graphs.
WARM = [[2000, 2001, 2002], [3000, 3001, 3002]]


class FailingProducer(P2PConnector):
    """Exits the process in the middle of sending a request's layers."""

    _die_after = 1
    _sent_layers = 0

    def _send_tensor(self, tensor):
        if tensor.dim() == 5:  # a layer's blocks, not a control message
            if self._sent_layers == self._die_after:
                os._exit(0)
            self._sent_layers += 1
        super()._send_tensor(tensor)


class SlowConsumer(P2PConnector):
    """Asks for a request's blocks only after a while."""

    def _start_reading(self, block_hashes):
        time.sleep(0.3)
        super()._start_reading(block_hashes)


def run(rank: int, port: int, model_dir: str, prompts: list[list[int]],
        options: dict[str, Any], results: Any, prefilled: Any) -> None:
    """Rank 0 prefills, then serves until the consumer closes (or its process dies);
    rank 1 decodes twice once rank 0 has prefilled, and closes."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    role = "producer" if rank == 0 else "consumer"
    config = {"role": role, "rank": rank, "world_size": 2, "timeout_s": 60}
    connector = FailingProducer if role == "producer" and options.get("die") else "p2p"
    slow = role == "consumer" and options.get("slow")
    if slow:
        connector = SlowConsumer
    policy = options.get("policy") if role == "consumer" else None
    try:
        llm = hwplug.LLM(model_dir, num_kv_blocks=64, kv_connector=connector,
                         kv_connector_config=config, kv_load_failure_policy=policy,
                         block_size=options.get(f"block_size_{role}"),
                         step_graphs=options.get("step_graphs", True))
    except Exception as exc:
        results.put((role, "error", f"{type(exc).__name__}: {exc}"))
        return
    try:
        if role == "producer":
            llm.generate(prompts, hwplug.SamplingParams(max_tokens=1))
            prefilled.set()
            llm.close()  # serves the consumer until it closes
            results.put((role, "done"))
            return
        if slow:
            llm.generate(WARM, DECODE)
        prefilled.wait(120)
        try:
            outcome = ("tokens", [o.token_ids for o in llm.generate(prompts, DECODE)])
        except Exception as exc:
            outcome = ("error", f"{type(exc).__name__}: {exc}")
        again = [o.token_ids for o in llm.generate(prompts, DECODE)]
        transfer = llm.engine.scheduler.kv_transfer
        results.put((role, *outcome, again, transfer.num_loaded_blocks,
                     transfer.num_failed_blocks))
        llm.close()
    except Exception:
        results.put((role, "crash", traceback.format_exc()))
