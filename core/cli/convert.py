"""``hwplug convert MODEL OUT``: a model as a Hugging Face directory of float safetensors.

For converter authors and other engines: a GGUF (dequantised) or float Hugging Face
directory written to the new directory ``OUT`` in ``--dtype`` (float32 or bfloat16), with
its config, generation config and tokenizer (see
:func:`hwplug.model_zoo.loaders.export.export_hf`).
"""

from __future__ import annotations

import argparse

from rich.console import Console


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="an alias (smollm2), a .gguf file or a Hugging Face "
                                      "directory")
    parser.add_argument("out", help="the directory to write (new or empty)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="the weights' dtype (default: float32)")


def run(args: argparse.Namespace, console: Console) -> int:
    from hwplug.model_zoo.loaders.export import export_hf

    out = export_hf(args.model, args.out, args.dtype)
    console.print(f"wrote {args.model} as {args.dtype} safetensors to {out}", highlight=False)
    return 0
