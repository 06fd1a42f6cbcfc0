"""Building blocks for model architectures, written once against hwplug's ops, attention
backends and quant methods (see ``docs/`` for the model-authoring guide)."""

from hwplug.model_zoo.layers.activation import GeluAndMul, SiluAndMul
from hwplug.model_zoo.layers.attention import Attention
from hwplug.model_zoo.layers.embedding import LMHead, VocabEmbedding
from hwplug.model_zoo.layers.linear import FusedLinear, Linear
from hwplug.model_zoo.layers.mla import MLAAttention
from hwplug.model_zoo.layers.moe import FusedMoE
from hwplug.model_zoo.layers.norm import RMSNorm
from hwplug.model_zoo.layers.rotary import RotaryEmbedding, rope_parameters
from hwplug.model_zoo.layers.weights import fused_target, load_named_weights

__all__ = ["Attention", "FusedLinear", "FusedMoE", "GeluAndMul", "LMHead", "Linear",
           "MLAAttention", "RMSNorm", "RotaryEmbedding", "SiluAndMul", "VocabEmbedding",
           "fused_target", "load_named_weights", "rope_parameters"]
