"""``hwplug info``: what was resolved, what was skipped and why, and the settings."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from rich.console import Console

from hwplug.cli.llm_flags import add_llm_flags
from hwplug.cli.output import add_json_flag, print_json, table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_json_flag(parser)
    parser.add_argument("--tracebacks", action="store_true",
                        help="show the full traceback of every failed plugin")
    # the sizes whose CPU binding plan to show
    add_llm_flags(parser, ("tensor_parallel_size", "data_parallel_size"),
                  tensor_parallel_size=1, data_parallel_size=1)


def cpu_binding(platform: Any, ranks: int) -> dict[str, Any]:
    """The NUMA nodes and the CPUs ``HWPLUG_CPU_BIND`` gives each of ``ranks`` worker
    ranks (or replicas) on ``platform``; CPU platforms only (accelerator ranks bind none)."""
    from hwplug import envs
    from hwplug.errors import ConfigError
    from hwplug.model_zoo.engine.parallel.binding import binding_plan, describe_plan
    from hwplug.platforms.numa import read_topology

    nodes = read_topology(envs.HWPLUG_PROBE_ROOT)
    if platform.device_type != "cpu":
        plan = [f"none: {platform.device_type} ranks run on a device each"]
    else:
        try:
            plan = describe_plan(binding_plan(envs.HWPLUG_CPU_BIND, nodes, ranks))
        except ConfigError as exc:
            plan = [f"error: {exc}"]
    return {"setting": envs.HWPLUG_CPU_BIND, "ranks": ranks, "plan": plan,
            "nodes": {node.index: describe_plan([node.cpus])[0].removeprefix("rank 0: cpus ")
                      for node in nodes}}


def llm_option_table() -> list[dict[str, Any]]:
    """Every ``LLM`` option as declared: its flag, ``HWPLUG_*`` variable, default and help."""
    from hwplug.model_zoo.llm_config import options

    return [{"option": name, "flag": "--" + name.replace("_", "-") if opt.cli else None,
             "variable": opt.env, "default": default, "help": opt.help}
            for name, (default, opt) in options().items()]


def collect(ranks: int = 1) -> dict[str, Any]:
    """Everything ``hwplug info`` shows, as plain data (the CPU binding of ``ranks``)."""
    from hwplug import discovery, envs, kernels, registries

    resolution = discovery.resolution()
    return {
        "platform": {**resolution.platform.describe(), "reason": resolution.reason,
                     "forced": resolution.forced},
        "candidates": [{"name": c.name, "source": c.source, "status": c.status,
                        "reason": c.reason, "traceback": c.traceback}
                       for c in resolution.candidates[1:]],
        "plugins": [asdict(record) for record in resolution.plugins],
        "hardware_without_plugin": [
            {"vendor": s.vendor, "devices": list(s.devices), "evidence": s.evidence,
             "install": s.install_hint} for s in resolution.sightings],
        "hardware_probes_timed_out": [{"kind": kind, "reason": reason}
                                      for kind, reason in resolution.probe_timeouts.items()],
        "registries": {
            "kv_layouts": registries.kv_layouts.names(),
            "attention_backends": registries.attention_backends.names(),
            "quant_methods": registries.quant_methods.names(),
            "connectors": registries.connectors.names(),
            "models": registries.models.names(),
            "kernels": {op: [v.name for v in kernels.variants(op)] for op in kernels.ops()},
        },
        "settings": envs.effective(),
        "llm_options": llm_option_table(),
        "unknown_settings": list(envs.unknown()),
        "cpu_binding": cpu_binding(resolution.platform, ranks),
        "api_version": discovery.API_VERSION,
    }


def run(args: argparse.Namespace, console: Console) -> int:
    data = collect(args.tensor_parallel_size * args.data_parallel_size)
    if args.json:
        print_json(console, data)
        return 0
    platform = data["platform"]
    console.print(f"[bold]platform[/] {platform['name']} ({platform['device_name']}) — "
                  f"{platform['reason']}")
    console.print(table("platform facts", ("fact", "value"),
                        ((k, v) for k, v in platform.items() if k not in ("name", "reason"))))
    console.print(table("other platform candidates", ("name", "source", "status", "why not"),
                        ((c["name"], c["source"], c["status"], c["reason"])
                         for c in data["candidates"])))
    console.print(table("plugins", ("name", "distribution", "version", "status", "note"),
                        ((p["name"], p["distribution"], p["version"], p["status"], p["reason"])
                         for p in data["plugins"])))
    if data["hardware_without_plugin"]:
        console.print(table("hardware seen without its plugin", ("vendor", "devices", "install"),
                            ((s["vendor"], ", ".join(s["devices"]), s["install"])
                             for s in data["hardware_without_plugin"])))
    if data["hardware_probes_timed_out"]:
        console.print(table("hardware probes that did not answer", ("kind", "why"),
                            ((p["kind"], p["reason"]) for p in data["hardware_probes_timed_out"])))
    regs = data["registries"]
    rows = [(kind, len(names), ", ".join(names)) for kind, names in regs.items()
            if kind != "kernels"]
    rows.append(("kernels", sum(map(len, regs["kernels"].values())),
                 "; ".join(f"{op}: {', '.join(v)}" for op, v in regs["kernels"].items())))
    console.print(table("registries", ("registry", "count", "names"), rows))
    console.print(table("settings", ("variable", "value"), data["settings"].items()))
    console.print(table("LLM options (hwplug generate flags)",
                        ("option", "flag", "variable", "default", "what"),
                        ((o["option"], o["flag"] or "-", o["variable"] or "-", o["default"],
                          o["help"]) for o in data["llm_options"])))
    binding = data["cpu_binding"]
    console.print(table(f"CPU binding of {binding['ranks']} rank(s), HWPLUG_CPU_BIND="
                        f"{binding['setting']}", ("", "cpus"),
                        [*((f"NUMA node {i}", c) for i, c in binding["nodes"].items()),
                         *((head, tail.removeprefix("cpus ")) for head, _, tail in
                           (line.partition(": ") for line in binding["plan"]))]))
    for name in data["unknown_settings"]:
        console.print(f"[yellow]warning:[/] {name} is set but is not a hwplug variable")
    if args.tracebacks:
        for item in (*data["plugins"], *data["candidates"]):
            if item.get("traceback"):
                console.print(f"[bold red]{item['name']}[/]\n{item['traceback']}")
    return 0
