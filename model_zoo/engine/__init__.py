"""The generation engine behind :class:`hwplug.LLM` (after nano-vllm's design).

- :mod:`.sequence`: a request's tokens and progress;
- :mod:`.block_manager`: the free list of paged KV-cache blocks;
- :mod:`.scheduler`: continuous batching, chunked prefill, preemption;
- :mod:`.model_runner`: KV caches, step inputs and metadata, forward, sampling;
- :mod:`.logprobs`: the log-probabilities requests ask for;
- :mod:`.output`: incremental detokenizing, stop strings, :class:`Output`;
- :mod:`.llm_engine`: ties them together, one step at a time;
- :mod:`.engine_loop`: the one thread that drives the engine for every caller.
"""

from hwplug.model_zoo.engine.block_manager import BlockManager
from hwplug.model_zoo.engine.engine_loop import EngineLoop, RequestHandle
from hwplug.model_zoo.engine.llm_engine import LLMEngine, RequestUpdate
from hwplug.model_zoo.engine.model_runner import ModelRunner
from hwplug.model_zoo.engine.output import CompletionOutput, Detokenizer, Logprob, Output
from hwplug.model_zoo.engine.scheduler import ScheduledBatch, Scheduler
from hwplug.model_zoo.engine.sequence import FinishReason, Sequence, SequenceStatus

__all__ = ["BlockManager", "CompletionOutput", "Detokenizer", "EngineLoop", "FinishReason",
           "LLMEngine", "Logprob", "ModelRunner", "Output", "RequestHandle", "RequestUpdate",
           "ScheduledBatch", "Scheduler", "Sequence", "SequenceStatus"]
