"""What the hardening checks cost: probes under a time limit, and the memory estimate.

Side by side in one process, best of ``--repeat``:

- every installed platform probe called directly vs through discovery's time limit
  (``within_time_limit``: a thread per probe), per discovery;
- building the model (``build_model``: the memory estimate on the meta device, then the
  model and its weights) vs the memory estimate alone, for ``--model``.

    python benchmarks/hardening_overhead.py
    python benchmarks/hardening_overhead.py --model all-minilm-l6-v2
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from hwplug import current_platform, envs
from hwplug.discovery import PLATFORM_GROUP, entry_points
from hwplug.discovery.ranking import call_activate
from hwplug.discovery.watchdog import within_time_limit


def best_seconds(fn: Callable[[], object], repeat: int) -> float:
    """The fastest of ``repeat`` calls of ``fn``, in seconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def probes(repeat: int) -> None:
    eps = entry_points(PLATFORM_GROUP)
    activates = [(ep.name, ep.load()) for ep in eps]  # imported once, as discovery would
    root = envs.HWPLUG_PROBE_ROOT

    def direct() -> None:
        for _, activate in activates:
            call_activate(activate, root)

    def limited() -> None:
        for name, activate in activates:
            within_time_limit(lambda a=activate: call_activate(a, root), f"probe {name}", name)

    plain, threaded = best_seconds(direct, repeat), best_seconds(limited, repeat)
    print(f"{len(activates)} probes per discovery: direct {plain * 1e3:.2f} ms, under the "
          f"time limit {threaded * 1e3:.2f} ms (x{threaded / plain:.2f}, "
          f"+{(threaded - plain) / len(activates) * 1e6:.0f} us per probe)")


def memory_estimate(model: str | None, repeat: int) -> None:
    from hwplug import current_platform
    from hwplug.model_zoo.context import build_model, create_context
    from hwplug.model_zoo.loaders import load_checkpoint
    from hwplug.model_zoo.loaders.memory import estimate_memory
    from hwplug.model_zoo.registry import get_model_class

    platform = current_platform()
    checkpoint = load_checkpoint(model)
    model_cls = get_model_class(checkpoint.config.architectures[0])
    ctx = create_context(model_cls, checkpoint.config, platform)
    estimate = estimate_memory(model_cls, checkpoint.config, ctx)
    alone = best_seconds(lambda: estimate_memory(model_cls, checkpoint.config, ctx), repeat)
    build = best_seconds(lambda: build_model(checkpoint), repeat)
    print(f"{checkpoint.source.name}: needs about {estimate.describe()}")
    print(f"build_model {build * 1e3:.1f} ms, of which the memory estimate {alone * 1e3:.1f} ms "
          f"({alone / build:.1%})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="path or alias (default: the default model)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"CPU: {current_platform().facts.device_name}")
    probes(args.repeat * 20)
    memory_estimate(args.model, args.repeat)


if __name__ == "__main__":
    main()
