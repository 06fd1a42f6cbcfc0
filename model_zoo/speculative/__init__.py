"""Speculative decoding: proposers (:class:`Proposer`; ``ngram`` and ``draft_model`` are
built in, others register through ``hwplug_register_proposers``) and their configuration
(:class:`SpeculativeConfig`). The engine side is
:mod:`hwplug.model_zoo.engine.speculation`."""

from hwplug.model_zoo.speculative.config import SpeculativeConfig
from hwplug.model_zoo.speculative.proposer import Proposal, Proposer, ProposerTarget

__all__ = ["Proposal", "Proposer", "ProposerTarget", "SpeculativeConfig"]
