"""The CLI flags of ``LLM``'s options, generated from their one declaration
(:class:`hwplug.model_zoo.llm_config.LLMConfig`): ``--max-num-seqs N``, ``--dtype DT``,
``--step-graphs`` / ``--no-step-graphs``... A flag not given leaves the option to its
``HWPLUG_*`` variable or default, so :func:`llm_options` returns only the given ones.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from typing import Any

from hwplug import checks
from hwplug.errors import ConfigError


def _declared() -> dict[str, Any]:
    from hwplug.model_zoo.llm_config import options

    return options()


def _typed(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` with its :class:`ConfigError` turned into argparse's own error."""
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except (ConfigError, OSError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = getattr(parse, "__name__", "value").lstrip("_")
    return convert


def add_llm_flags(parser: argparse.ArgumentParser, names: Iterable[str] | None = None,
                  **defaults: Any) -> None:
    """A flag for each CLI option of ``LLM`` (only ``names`` when given); ``defaults``
    replace an option's default for this command (``hwplug embed``'s model)."""
    wanted = set(names) if names is not None else None
    for name, (default, opt) in _declared().items():
        if not opt.cli or (wanted is not None and name not in wanted):
            continue
        flag = "--" + name.replace("_", "-")
        shown = defaults.get(name, default)
        help_text = opt.help + ("" if shown is None else f" (default: {shown})") + (
            f"; also {opt.env}" if opt.env else "")
        if opt.check is checks.boolean:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction,
                                default=argparse.SUPPRESS, help=help_text)
        else:
            parser.add_argument(flag, type=_typed(opt.parse or str), choices=opt.choices,
                                metavar=None if opt.choices else opt.metavar,
                                default=argparse.SUPPRESS, help=help_text)
    for name, value in defaults.items():
        parser.set_defaults(**{name: value})


def declared_default(name: str) -> Any:
    """The default of ``LLM`` option ``name``, as declared."""
    return _declared()[name][0]


def llm_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``LLM`` options the command line gave (flags left out are not in it)."""
    return {name: getattr(args, name) for name in _declared() if hasattr(args, name)}
