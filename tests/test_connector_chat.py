"""Blocks filled while decoding reach the connector like prompt blocks (issue 30, item 6).

A chat's first turn runs in this process (step graphs on, the default: decode steps
replay); the second turn, run in a second process over the same ``shared_storage``
store, loads the first turn's prompt and reply from it, and answers as this process
does with the same blocks in its prefix cache.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import hwplug

pytestmark = pytest.mark.slow  # the real model, two processes

GREEDY = hwplug.SamplingParams(max_tokens=40)
BLOCK = 16
FIRST = [{"role": "user", "content": "Describe the water cycle in a few sentences."}]

SECOND_TURN = """
import json, sys
import hwplug
llm = hwplug.LLM(kv_connector="shared_storage", kv_connector_config={"path": sys.argv[1]})
out = llm.chat(json.loads(sys.argv[2]), hwplug.SamplingParams(max_tokens=40))
print(json.dumps([out.token_ids, llm.engine.scheduler.kv_transfer.num_loaded_blocks]))
"""


def test_the_second_turn_loads_the_first_turns_reply_from_the_connector(tmp_path):
    llm = hwplug.LLM(kv_connector="shared_storage", kv_connector_config={"path": tmp_path})
    try:
        assert llm.runner.graphs is not None
        reply = llm.chat(FIRST, GREEDY)
        second = [*FIRST, {"role": "assistant", "content": reply.text},
                  {"role": "user", "content": "Shorter, please."}]
        turn = reply.prompt_token_ids + reply.token_ids
        prompt = llm.apply_chat_template(second)
        assert prompt[:len(turn)] == turn  # the reply is part of the next turn's prompt
        result = subprocess.run([sys.executable, "-c", SECOND_TURN, str(tmp_path),
                                 json.dumps(second)], capture_output=True, text=True,
                                timeout=300, check=True)
        tokens, loaded = json.loads(result.stdout.strip().splitlines()[-1])
        # every full block of the first turn, the ones its decode steps filled included
        assert loaded >= (len(turn) - 1) // BLOCK > len(reply.prompt_token_ids) // BLOCK
        assert tokens == llm.chat(second, GREEDY).token_ids  # as with its own cached blocks
    finally:
        llm.close()
