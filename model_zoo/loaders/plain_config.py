"""``PlainConfig``: a converted model's config, read without importing transformers.

A GGUF conversion (see :mod:`.gguf_file`) writes the architecture config's every field to
:data:`PLAIN_CONFIG_NAME` when a :class:`PlainConfig` of those fields reads as the class does
(:func:`write_plain_config`). A cached load then builds the model from that file alone:
importing transformers takes about 0.5 s (its ``__init__`` indexes every model module), an
architecture's config class about 1.3 s more (its validators import torch._dynamo), and a
second-run cold start pays neither.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

from hwplug.errors import ModelError

logger = logging.getLogger(__name__)

PLAIN_CONFIG_NAME = "hwplug_config.json"
#: Fields a plain config need not reproduce: one transformers drops on a plain config and
#: hwplug does not read (a generation setting), and the writer's version.
PLAIN_CONFIG_UNCOMPARED = frozenset({"use_cache", "transformers_version"})


class PlainConfig:
    """A model config as plain attributes: every field of ``fields`` (a JSON object, as
    ``PretrainedConfig.to_json_string(use_diff=False)`` writes it), ``model_type`` and
    ``architectures`` among them. Reading a field it lacks raises ``AttributeError``."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.__dict__.update(copy.deepcopy(fields))

    def to_dict(self) -> dict[str, Any]:
        """Every field, as a new dict."""
        return copy.deepcopy(self.__dict__)

    def __repr__(self) -> str:
        return f"PlainConfig({json.dumps(self.__dict__, sort_keys=True, default=str)})"


def read_plain_config(path: Path) -> PlainConfig:
    """The :class:`PlainConfig` stored in ``path``. Raises :class:`ModelError` naming the
    file when it cannot be read or is not a JSON object."""
    try:
        fields = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load the config from {path}: {exc}") from exc
    if not isinstance(fields, dict):
        raise ModelError(f"cannot load the config from {path}: not a JSON object")
    return PlainConfig(fields)


def write_plain_config(config: Any, directory: Path) -> bool:
    """Write the fields of ``config`` (a transformers ``PretrainedConfig``) to
    ``directory``/:data:`PLAIN_CONFIG_NAME` if a :class:`PlainConfig` of them reads every
    field and every alias the class maps (``attribute_map``) as ``config`` does (as JSON
    values: a dtype as its name, mapping keys as strings; bar
    :data:`PLAIN_CONFIG_UNCOMPARED`); return whether it did."""
    fields = json.loads(config.to_json_string(use_diff=False))
    plain = PlainConfig(fields)
    names = (set(fields) | set(config.attribute_map)) - PLAIN_CONFIG_UNCOMPARED
    differ = sorted(name for name in names
                    if _as_json(getattr(plain, name, None)) != _as_json(getattr(config, name, None)))
    if differ:
        logger.debug("%s keeps its config class: a plain config differs in %s",
                     directory, ", ".join(differ))
        return False
    (directory / PLAIN_CONFIG_NAME).write_text(json.dumps(fields, indent=1, sort_keys=True))
    return True


def _as_json(value: Any) -> Any:
    """``value`` as JSON reads it back (a torch dtype as its name, e.g. ``"bfloat16"``)."""
    return json.loads(json.dumps(value, default=lambda v: str(v).removeprefix("torch.")))
