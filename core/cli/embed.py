"""``hwplug embed``: sentence embeddings of texts with an encoder model.

Prints, per text, the vector's dimension and first values; with ``--json``, every
text with its whole vector. The vectors are mean-pooled and L2-normalised.
"""

from __future__ import annotations

import argparse

from rich.console import Console

from hwplug.cli.inputs import utf8_text
from hwplug.cli.llm_flags import add_llm_flags, llm_options
from hwplug.cli.output import add_json_flag, print_json, table
from hwplug.cli.startup import model_loaded

DEFAULT_MODEL = "all-minilm-l6-v2"
#: Values shown per vector in the table.
SHOWN_VALUES = 6


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("texts", nargs="+", metavar="TEXT", type=utf8_text,
                        help="texts to embed")
    add_llm_flags(parser, ("model", "dtype", "max_num_seqs", "max_num_batched_tokens"),
                  model=DEFAULT_MODEL)
    add_json_flag(parser)


def run(args: argparse.Namespace, console: Console) -> int:
    from hwplug import LLM

    llm = LLM(**llm_options(args))
    model_loaded()
    vectors = llm.embed(args.texts).tolist()
    if args.json:
        print_json(console, {"model": args.model, "dimension": len(vectors[0]),
                             "embeddings": [{"text": text, "embedding": vector} for text, vector
                                            in zip(args.texts, vectors, strict=True)]})
        return 0
    rows = [(text, len(vector), ", ".join(f"{v:+.4f}" for v in vector[:SHOWN_VALUES]) + ", ...")
            for text, vector in zip(args.texts, vectors, strict=True)]
    console.print(table(f"embeddings ({args.model}, {llm.platform}, {llm.dtype})",
                        ("text", "dimension", "first values"), rows))
    return 0
