"""Faults a ``shared_storage`` store meets, made on its block files as a real one would be.

Each function takes one block file: :func:`corrupt` zeroes tensor bytes (the header still
parses), :func:`truncate` cuts the file short, :func:`another_blocks_kv` puts another
block's file (valid layout and checksums) under this block's name, and :func:`swap`
exchanges two files. :class:`Forgetful` is a store that loses a block between the lookup
and the load (another process cleaned it up). :class:`Engine` runs prompts on an ``LLM``
over such a store, in this process or (``python kv_faults.py``) in a child process
driven by JSON lines on its stdin.
"""

from __future__ import annotations

from pathlib import Path

from hwplug.model_zoo.connectors.shared_storage import SharedStorageConnector


def corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-100:-90] = bytes(10)  # tensor bytes: the header still parses
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:200])


def swap(first: Path, second: Path) -> None:
    data = first.read_bytes()
    first.write_bytes(second.read_bytes())
    second.write_bytes(data)


def another_blocks_kv(path: Path) -> None:
    """Put another block's file of the same store under this block's name."""
    other = next(p for p in sorted(path.parents[1].rglob("*.safetensors")) if p != path)
    path.write_bytes(other.read_bytes())


class Forgetful(SharedStorageConnector):
    """Loses the second block of a load while ``_forget_next`` is true; ``_once``: only
    of the next load."""

    _forget_next = True
    _once = False

    def _start_reading(self, block_hashes):
        if self._forget_next and len(block_hashes) > 1:
            self._block_path(block_hashes[1]).unlink(missing_ok=True)
            self._forget_next = not self._once
        super()._start_reading(block_hashes)


class Engine:
    """An ``LLM`` of ``model_dir`` over a ``shared_storage`` store at ``store``, by
    ``policy``, answering commands: ``{"op": "run", "prompt": [ids]}`` (the prefix cache
    is emptied first, so the store is asked) -> ``{"tokens": [ids]}`` or ``{"error":
    "Type: message"}``, with the blocks it ``loaded`` and those that ``failed``; ``{"op": "forget_next"}``: the next load loses its second block."""

    def __init__(self, model_dir: str, store: str, policy: str) -> None:
        import hwplug

        class ForgetOnce(Forgetful):
            _forget_next, _once = False, True

        self.params = hwplug.SamplingParams(max_tokens=4, ignore_eos=True)
        self.llm = hwplug.LLM(model_dir, num_kv_blocks=64, kv_connector=ForgetOnce,
                              kv_connector_config={"path": store},
                              kv_load_failure_policy=policy)

    def handle(self, command: dict) -> dict:
        if command["op"] == "forget_next":
            self.llm.connector._forget_next = True
            return {}
        self.llm.reset_prefix_cache()
        transfer = self.llm.engine.scheduler.kv_transfer
        before = transfer.num_loaded_blocks, transfer.num_failed_blocks
        try:
            answer = {"tokens": self.llm.generate([command["prompt"]],
                                                  self.params)[0].token_ids}
        except Exception as exc:  # reported to the test, which decides
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        return {**answer, "loaded": transfer.num_loaded_blocks - before[0],
                "failed": transfer.num_failed_blocks - before[1]}


if __name__ == "__main__":
    import json
    import sys

    engine = Engine(*sys.argv[1:4])
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        print(json.dumps(engine.handle(json.loads(line))), flush=True)
