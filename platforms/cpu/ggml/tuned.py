"""The ``ggml_linear`` tuning table's choices for the ggml CPU kernels (:mod:`.ops`): from
which activation rows a type takes the dequantized tiles (:func:`tiled_from`) and with
which integer activations it computes below them (:func:`activations_of`)."""

from __future__ import annotations

import functools
from pathlib import Path

from gguf import GGMLQuantizationType

from hwplug import envs
from hwplug.errors import ConfigError
from hwplug.kernel_registry.reference.ggml import type_name
from hwplug.kernel_registry.tuning import TuningTable, read_layer
from hwplug.platforms.cpu.probe import probe
from hwplug.platforms.device_names import canonical_device_name

#: hwplug's layer of the ``ggml_linear`` tuning table: ``{device: {threads: {type name:
#: activation rows from which it takes the tiles (null: never), "activations": {type name:
#: "int16" | "int8"}}}}``. Its one entry, ``default`` at one thread, serves every CPU and thread
#: count until a table says otherwise; measured on a 2-core AVX2 EPYC in SmolLM2 Q4_1 decode
#: steps (benchmarks/decode_profile.py with a user table; benchmarks/ggml_linear.py, whose
#: back-to-back calls flatter the tiles, misplaces the switch): with the AVX2 build's
#: eight-row tiles (Q4_0, Q4_1, Q8_0) the integer kernel took 79 ms of a batch-32 step,
#: 158 against the tiles' 178 at 64 rows and 268 against 282 at 128, and the tiles never
#: serve them (null), so a row's outputs do not depend on the rows of its step (batch
#: invariance, docs/generation.md "Numerics"); since the VNNI build's 16-row groups
#: (lgroup.h) the integer kernel beats the tiles at 32-512 rows (SmolLM2 Q4_1's shapes,
#: one thread, CPU time: 1.2-1.5x; the AVX2 build, without them, took 1.2-1.4x the tiles'
#: time before its tiles of eight pairs, not measured since). Q5_0 and Q5_1 never take the
#: tiles either (null) since the VNNI build's 16-row groups (lgroup.h): their int16 kernel
#: took 0.35-0.98x the tiles' time at 32-512 rows (that Zen 5, one thread, CPU time, loaded;
#: 576x576 and 1536x8960). The activations of the 32-value types are int16 (max|x| /
#: 32767 steps: errors ~1e-4 of the outputs' rms, and SmolLM2 Q4_1's greedy tokens those of
#: fp32) where that costs at most ~15% over int8 at one row (measured: 0-5%); Q8_0 keeps
#: int16: its int8 dots (VNNI) measured level with int16 (a 2-vCPU AMD EPYC Zen 5, one
#: thread, Qwen2.5-1.5B's shapes: 92-810 against 98-743 µs, memory-bound at ~25 GB/s).
#: IQ4_NL and the super-block types (Q2_K .. Q6_K, IQ4_XS) take int8 only, as llama.cpp
#: does (Q8_0 and Q8_K activations). The super-block types never take the tiles (null):
#: their VNNI build's 16-row groups (kgroup.h) beat the tiles by 2.7-4.8x at 128-512 rows
#: (that Zen 5, quiet, two threads, Qwen2.5-1.5B's 1536x1536, 8960x1536 and 1536x8960, Q4_K
#: and Q6_K: 1.0-24 ms against 2.7-101), and their AVX2 build's tiles were about level with
#: the fp32 tiles at 128 rows (Q4_K 6299 / 8787 µs, Q6_K 5972 / 7780 and 50687 / 37338, one
#: thread, a loaded machine), so prefill stays batch-invariant for them too. IQ4_NL never
#: takes the tiles either (null) since the VNNI build's int8 groups (lgroup.h): 2.1-3.1x the
#: tiles' speed at 32 and 128 rows (2-vCPU Zen 4, two threads, SmolLM2's shapes); before
#: them its integer kernel was level with the tiles at 32 rows, hence 32 then.
TUNING = Path(__file__).with_name("tuning.json")
#: The activations' integer types and their bits, as the C kernel takes them.
ACTIVATIONS = {"int8": 8, "int16": 16}
#: The GGUF types whose C kernel also takes int16 activations.
WIDE_TYPES = frozenset(int(GGMLQuantizationType[name])
                       for name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"))


@functools.cache
def _cpu_name() -> str:
    """This CPU's canonical name (``"epyc-9654"``), from the CPU probe: the tuning tables'
    device key."""
    return canonical_device_name(probe(envs.HWPLUG_PROBE_ROOT).devices[0])


def _config(threads: int) -> dict:
    """The ``ggml_linear`` tuning table's entry on this CPU with ``threads`` threads
    (:data:`TUNING` < ``$HWPLUG_TUNING_DIR/ggml_linear.json``), keyed by the CPU's
    canonical name (else ``default``) and bucketed by thread count. A type the user's
    entry leaves out keeps hwplug's values."""
    device = _cpu_name()
    layer = read_layer(TUNING)
    own = TuningTable("ggml_linear", layer, user_dir=TUNING.parent)  # no user file there
    user = TuningTable("ggml_linear", layer).lookup(device, threads)
    own = own.lookup(device, threads)
    return {**own, **user, "activations": {**own["activations"], **user.get("activations", {})}}


@functools.cache
def tiled_from(threads: int) -> dict[int, int | None]:
    """GGUF type -> activation rows from which ``linear`` takes the tiles, or None where it
    never does, on this CPU with ``threads`` threads (the tuning table, see
    :func:`_config`)."""
    config = _config(threads)
    return {int(GGMLQuantizationType[name]): rows for name, rows in config.items()
            if name != "activations"}


@functools.cache
def activations_of(threads: int) -> dict[int, str]:
    """GGUF type -> the activations' integer type (``"int16"`` or ``"int8"``) with which
    ``linear`` computes below :func:`tiled_from`'s rows (the tuning table, see
    :func:`_config`). Raises :class:`ConfigError` for another value, or ``"int16"`` for a
    type outside :data:`WIDE_TYPES`."""
    chosen = _config(threads)["activations"]
    for name, value in chosen.items():
        if value not in ACTIVATIONS:
            raise ConfigError(f"ggml_linear tuning table: activations {value!r} for {name} is "
                              f"not one of {', '.join(ACTIVATIONS)}")
        if value == "int16" and int(GGMLQuantizationType[name]) not in WIDE_TYPES:
            raise ConfigError(f"ggml_linear tuning table: {name} takes int8 activations only "
                              f"(int16: {', '.join(type_name(t) for t in sorted(WIDE_TYPES))})")
    return {int(GGMLQuantizationType[name]): value for name, value in chosen.items()}
