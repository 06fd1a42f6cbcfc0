"""Speculative decoding's speed: hwplug with and without it, beside llama.cpp's prompt lookup.

Batch 1, greedy, EOS ignored (``--until-eos``: each answer ends at the model's end of
turn, at most ``--new-tokens``, as a user sees it; greedy speculation gives the same
tokens, so every hwplug row still decodes the same count), on the packaged SmolLM2 (or ``--model``), three prompt sets
given as chat-templated token ids: two where copying helps (``code-edit``: rename a
function in a given snippet and print the whole snippet; ``quote-summary``: summarise a
text quoting its key sentences) and ``open-chat`` (open questions, where n-gram lookup
finds little). For each set and engine, the decode speed is ``(new tokens - 1) / (time
from the first streamed token to the last)``, summed over the set's prompts (prefill
left out), after untimed warm-up generations (a set's first prompt each); hwplug's rows
run ``--repeat`` times, interleaved (each row in turn, a fresh engine each time), and keep
each set's median run.

hwplug rows (``--dequantize``: with float32 weights, where a decode step is bound by
reading them): no speculation (the baseline), ``ngram`` (prompt lookup, ``--k`` tokens,
n from 2 to 4) and, with ``--draft-layers N``, ``draft_model`` (the model cut to its first
N layers). Each gives its acceptance rate and mean accepted length (tokens per verify
step), and its speed over the baseline's: the goal (issue 31) is >= 1.5x on the copying
sets and >= 0.95x on open chat, printed as met or not.

llama.cpp rows (llama-cpp-python 0.3.36's ``Llama`` with and without
``draft_model=LlamaPromptLookupDecoding(num_pred_tokens=k)``, the same GGUF and token
ids, EOS biased off, ``--threads``): run in a subprocess of ``--llamacpp-python`` (a Python that has
llama-cpp-python; default: this one), which imports llama_cpp only, never hwplug.
Skipped, with the reason, when that Python lacks it.

    python benchmarks/speculative.py --quick             # a tiny run: one prompt a set
    python benchmarks/speculative.py --new-tokens 128 --llamacpp-python /path/to/python
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

SNIPPET = '''def compute_total(items, tax_rate):
    """Return the total price of items, tax included."""
    subtotal = 0.0
    for item in items:
        subtotal += item["price"] * item["quantity"]
    tax = subtotal * tax_rate
    return subtotal + tax


def describe(items, tax_rate):
    total = compute_total(items, tax_rate)
    lines = [f"{item['name']}: {item['quantity']} x {item['price']}" for item in items]
    lines.append(f"total: {total:.2f}")
    return "\\n".join(lines)
'''
TEXT = ("The city council met on Tuesday to discuss the new bicycle lanes. \"We expect the "
        "lanes to cut traffic accidents by a third,\" said the mayor. Residents raised "
        "concerns about parking. \"Our street loses twelve parking spaces,\" one shop owner "
        "said. The council voted seven to two in favour. Construction begins in May and "
        "will last about four months, according to the city engineer.")
PROMPTS = {
    "code-edit": [
        f"Rename the function compute_total to sum_prices everywhere in this code and print "
        f"the whole code, nothing else:\n\n```python\n{SNIPPET}```",
        f"Add a docstring to describe() in this code and print the whole code:\n\n"
        f"```python\n{SNIPPET}```"],
    "quote-summary": [
        f"Summarise this article, quoting every sentence that is a quotation word for "
        f"word:\n\n{TEXT}",
        f"List the facts of this article, each with the sentence it comes from quoted:\n\n"
        f"{TEXT}"],
    "open-chat": ["What are some good habits for staying healthy?",
                  "Tell me a short story about a dragon who learns to cook."],
}
COPYING = ("code-edit", "quote-summary")
GOALS = {"copying": 1.5, "open-chat": 0.95}


def hwplug_rows(args: argparse.Namespace, sets: dict[str, list[str]]) -> tuple[dict, dict]:
    """Per hwplug row and set: decode tok/s, acceptance rate, mean accepted length; and
    the sets' token ids (for llama.cpp)."""
    import hwplug

    rows = {"hwplug": None, "hwplug ngram": {"method": "ngram",
                                             "num_speculative_tokens": args.k}}
    if args.draft_layers:
        rows["hwplug draft_model"] = {"method": "draft_model", "num_speculative_tokens": args.k,
                                      "num_layers": args.draft_layers}
    sampling = hwplug.SamplingParams(max_tokens=args.new_tokens, ignore_eos=not args.until_eos)
    runs = {name: {key: [] for key in sets} for name in rows}
    token_ids = {}
    for _ in range(args.repeat):  # rows interleaved: a slow spell of the machine hits all
        for name, speculative in rows.items():  # one engine at a time (each its own threads)
            llm = hwplug.LLM(args.model, max_num_seqs=1, max_model_len=args.max_model_len,
                             dequantize=args.dequantize, speculative_config=speculative)
            try:
                token_ids = {key: [llm.apply_chat_template([{"role": "user", "content": p}])
                                   for p in prompts] for key, prompts in sets.items()}
                # warm-up: every step graph recorded (verify steps' too)
                llm.generate([ids[0] for ids in token_ids.values()], sampling)
                for key, ids in token_ids.items():
                    runs[name][key].append(_hwplug_set(llm, ids, sampling))
            finally:
                llm.close()
    return {name: {key: _median_run(found) for key, found in per_set.items()}
            for name, per_set in runs.items()}, token_ids


def _median_run(found: list[dict]) -> dict:
    """The run of median speed among one row's repeats of one set."""
    return sorted(found, key=lambda run: run["tok_s"])[len(found) // 2]


def _hwplug_set(llm, prompts: list[list[int]], sampling) -> dict:
    before = llm.engine.stats()
    tokens, seconds = 0, 0.0
    for ids in prompts:
        first = None
        stream = llm.stream(ids, sampling)
        for _ in stream:
            first = first or time.perf_counter()
        seconds += time.perf_counter() - first
        tokens += len(stream.output.outputs[0].token_ids) - 1
    after = llm.engine.stats()
    proposed = after.spec_proposed_tokens - before.spec_proposed_tokens
    accepted = after.spec_accepted_tokens - before.spec_accepted_tokens
    verified = after.spec_verifications - before.spec_verifications
    return {"tok_s": tokens / seconds, "acceptance": accepted / proposed if proposed else None,
            "mean_len": 1 + accepted / verified if verified else None}


def llamacpp_rows(args: argparse.Namespace, model: str, token_ids: dict) -> dict | str:
    """llama.cpp's rows from a subprocess of ``--llamacpp-python``, or why they are not."""
    job = {"model": model, "token_ids": token_ids, "new_tokens": args.new_tokens,
           "until_eos": args.until_eos,
           "k": args.k, "threads": args.threads, "n_ctx": args.max_model_len}
    try:
        proc = subprocess.run([args.llamacpp_python, __file__, "--llamacpp-worker"],
                              input=json.dumps(job), capture_output=True, text=True,
                              timeout=3600)
    except OSError as exc:
        return f"not run: {exc}"
    if proc.returncode != 0:
        return f"not run: {args.llamacpp_python} failed: {proc.stderr.strip()[-300:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def llamacpp_worker() -> None:
    """The subprocess: llama.cpp with and without prompt lookup over the job's token ids
    (stdin: JSON), one JSON line of results on stdout. Imports llama_cpp only."""
    job = json.loads(sys.stdin.read())
    try:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    except ImportError as exc:
        print(json.dumps(f"not run: llama-cpp-python is not installed here ({exc})"))
        return
    results = {}
    for name, draft in (("llama.cpp", None),
                        ("llama.cpp prompt lookup", LlamaPromptLookupDecoding(
                            num_pred_tokens=job["k"]))):
        llm = Llama(job["model"], n_ctx=job["n_ctx"], n_threads=job["threads"],
                    n_threads_batch=job["threads"], draft_model=draft, verbose=False,
                    logits_all=draft is not None)
        _llamacpp_set(llm, job["token_ids"]["open-chat"][:1], job["new_tokens"],
                      job["until_eos"])  # warm-up
        results[name] = {key: _llamacpp_set(llm, prompts, job["new_tokens"], job["until_eos"])
                         for key, prompts in job["token_ids"].items()}
    print(json.dumps(results))


def _llamacpp_set(llm, prompts: list[list[int]], new_tokens: int, until_eos: bool) -> dict:
    tokens, seconds = 0, 0.0
    for ids in prompts:
        llm.reset()  # no prefix reuse between prompts
        first, count = None, 0
        for _ in llm.create_completion(ids, max_tokens=new_tokens, temperature=0.0,
                                       stream=True,
                                       logit_bias=None if until_eos else {llm.token_eos(): -1e9}):
            first = first or time.perf_counter()
            count += 1
        seconds += time.perf_counter() - first
        tokens += count - 1
    return {"tok_s": tokens / seconds, "acceptance": None, "mean_len": None}


def report(results: dict, llamacpp: dict | str, sets: list[str]) -> None:
    def cell(value, fmt):
        return format("-", fmt[:2]) if value is None else format(value, fmt)

    print(f"{'row':26s}" + "".join(f"{key:>32s}" for key in sets))
    print(f"{'':26s}" + "".join(f"{'tok/s  accept  len  vs base':>32s}" for _ in sets))
    rows = dict(results, **(llamacpp if isinstance(llamacpp, dict) else {}))
    for name, per_set in rows.items():
        base = rows["llama.cpp" if name.startswith("llama.cpp") else "hwplug"]
        print(f"{name:26s}" + "".join(
            f"{per_set[key]['tok_s']:>11.1f} {cell(per_set[key]['acceptance'], '>7.0%')} "
            f"{cell(per_set[key]['mean_len'], '>4.2f')} "
            f"{per_set[key]['tok_s'] / base[key]['tok_s']:>7.2f}x" for key in sets))
    if isinstance(llamacpp, str):
        print(f"llama.cpp: {llamacpp}")
    for name in (n for n in results if n != "hwplug"):
        for key in sets:
            ratio = results[name][key]["tok_s"] / results["hwplug"][key]["tok_s"]
            goal = GOALS["copying" if key in COPYING else key]
            print(f"{name} on {key}: {ratio:.2f}x over hwplug without speculation; goal "
                  f">= {goal}x: {'met' if ratio >= goal else 'NOT met'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="default: the packaged SmolLM2")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=4, help="tokens proposed per step")
    parser.add_argument("--draft-layers", type=int, default=0,
                        help="also a draft_model row: the model cut to N layers (0: none)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of each hwplug row and set, interleaved; the median is kept")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp's threads")
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--until-eos", action="store_true",
                        help="answers end at the model's end of turn (default: EOS ignored)")
    parser.add_argument("--dequantize", action="store_true",
                        help="hwplug rows hold float32 weights (llama.cpp keeps the GGUF's)")
    parser.add_argument("--llamacpp-python", default=sys.executable)
    parser.add_argument("--quick", action="store_true",
                        help="one prompt a set, 16 new tokens: checks the script runs")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--llamacpp-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.llamacpp_worker:
        return llamacpp_worker()
    sets = PROMPTS
    if args.quick:
        sets = {key: prompts[:1] for key, prompts in PROMPTS.items()}
        args.new_tokens, args.repeat = 16, 1
    from hwplug.model_zoo.loaders import resolve_model

    model = str(resolve_model(args.model))
    results, token_ids = hwplug_rows(args, sets)
    llamacpp = llamacpp_rows(args, model, token_ids)
    report(results, llamacpp, list(sets))
    if args.json:
        args.json.write_text(json.dumps({"hwplug": results, "llama.cpp": llamacpp,
                                         "args": {k: v for k, v in vars(args).items()
                                                  if k != "json"}}, indent=1))


if __name__ == "__main__":
    main()
