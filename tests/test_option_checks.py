"""Bad option values are a ConfigError naming the option (issue 29, item 8).

Every case goes in where a user's value enters: an ``LLM`` option (through
:meth:`LLMConfig.create`, the one declaration ``LLM`` and the CLI share), a connector
option (``kv_connector_config``, as the engine passes it to the connector) or a
checkpoint's ``quantization_config``.
"""

from __future__ import annotations

import math

import pytest

from hwplug.connector import KVLayout
from hwplug.errors import ConfigError
from hwplug.model_zoo.connectors.cpu_offload import CPUOffloadConnector
from hwplug.model_zoo.connectors.shared_storage import SharedStorageConnector
from hwplug.model_zoo.llm_config import LLMConfig
from hwplug.model_zoo.quant_methods.formats import fp8_scheme, method_name
from hwplug.model_zoo.quant_methods.int4 import int4_scheme

LAYOUT = KVLayout(backend="TORCH_PAGED", layout="NHD", kv_cache_dtype="float32", block_size=16,
                  num_kv_heads=2, head_size=16, num_layers=2)
CONNECTED = {"kv_connector": "cpu_offload"}


@pytest.mark.parametrize(("options", "named", "choices"), [
    ({**CONNECTED, "kv_connector_config": [("max_bytes", 1)]}, "kv_connector_config", None),
    ({**CONNECTED, "kv_connector_config": "max_bytes=1"}, "kv_connector_config", None),
    ({**CONNECTED, "kv_connector_config": 1}, "kv_connector_config", None),
    ({**CONNECTED, "kv_load_failure_policy": ""}, "kv_load_failure_policy", "fail, recompute"),
    ({"kv_cache_dtype": ""}, "kv_cache_dtype", "fp8_e4m3"),
    ({"calculate_kv_scales": "no"}, "calculate_kv_scales", "True or False"),
])
def test_llm_options_of_a_wrong_type_name_the_option(options, named, choices):
    with pytest.raises(ConfigError, match=named) as caught:
        LLMConfig.create(**options)
    if choices:
        assert choices in str(caught.value)


@pytest.mark.parametrize("timeout", ["soon", -1, 0, math.nan, math.inf, True])
@pytest.mark.parametrize("connector", ["cpu_offload", "shared_storage"])
def test_a_load_timeout_that_is_not_a_positive_number_is_refused(connector, timeout, tmp_path):
    with pytest.raises(ConfigError, match="load_timeout_s"):
        if connector == "cpu_offload":
            CPUOffloadConnector(LAYOUT, load_timeout_s=timeout)
        else:
            SharedStorageConnector(LAYOUT, path=tmp_path, load_timeout_s=timeout)


@pytest.mark.parametrize("path", ["kv\0store", "", 7, b"kv"])
def test_a_shared_storage_path_that_is_not_a_path_is_refused(path):
    with pytest.raises(ConfigError, match="path"):
        SharedStorageConnector(LAYOUT, path=path)


def test_valid_connector_options_still_build(tmp_path):
    connector = SharedStorageConnector(LAYOUT, path=str(tmp_path), load_timeout_s=2)
    assert connector.directory.is_dir()
    CPUOffloadConnector(LAYOUT, load_timeout_s=0.5).close()
    connector.close()


GROUP = {"targets": ["Linear"], "weights": {"type": "float", "num_bits": 8,
                                            "strategy": "channel", "symmetric": True}}


@pytest.mark.parametrize(("config", "named"), [
    ({"quant_method": "fp8", "weight_block_size": ["128", "128"]}, "weight_block_size"),
    ({"quant_method": "fp8", "weight_block_size": "ab"}, "weight_block_size"),
    ({"quant_method": "fp8", "weight_block_size": [128, 0]}, "weight_block_size"),
    ({"quant_method": "compressed-tensors", "config_groups": [GROUP]}, "config_groups"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": [GROUP]}}, "config_groups"),
])
def test_quantization_configs_of_a_wrong_type_name_the_field(config, named):
    with pytest.raises(ConfigError, match=named):
        fp8_scheme(config) if config["quant_method"] == "fp8" else method_name(config)


def test_an_int4_config_with_listed_groups_names_the_field():
    config = {"quant_method": "compressed-tensors", "format": "pack-quantized",
              "config_groups": [GROUP]}
    with pytest.raises(ConfigError, match="config_groups"):
        int4_scheme(config)
