#!/usr/bin/env bash
# One pass of every GPU check hwplug has, for a GPU machine lent for a short time.
#
#   bash benchmarks/device_check.sh OUTDIR [HF_DIR]
#   STEPS="install cuda_graphs generate" bash benchmarks/device_check.sh OUTDIR HF_DIR
#
# Run from the repository root on a machine with an NVIDIA GPU whose python3 already holds
# torch and triton (the tree is installed over them with --no-deps). Wheels of hwplug's
# pure-Python dependencies that machine lacks may sit in .whl/ (installed to /tmp/site; the
# lent H100s lacked gguf and importlib-metadata, whose 10.x needs lazy_importer: carry 8.x).
# HF_DIR holds a model's config.json and tokenizer (e.g. `hwplug convert smollm2 DIR`
# without the weights): the end-to-end comparison builds random bf16 weights of that
# shape there, since speed does not depend on their values. Each step is time-bounded and
# logs to OUTDIR/log.txt (exit statuses and times in OUTDIR/device.txt); a step that fails or times out is reported as such, the others still run.
# STEPS (space-separated step names) runs only those steps; by default every one runs.
set -u
OUT=${1:?usage: device_check.sh OUTDIR [HF_DIR]}
HF_DIR=${2:-}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
step() {  # step NAME SECONDS COMMAND...: run, log, record status (if STEPS selects NAME)
    local name=$1 limit=$2; shift 2
    case " ${STEPS:-$name} " in *" $name "*) ;; *) return 0 ;; esac
    local t0=$SECONDS
    echo "=== $name: $*" >> "$OUT/log.txt"
    timeout "$limit" "$@" >> "$OUT/log.txt" 2>&1
    local rc=$?
    echo "$name: rc=$rc ($((SECONDS - t0)) s)" | tee -a "$OUT/device.txt"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/device.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/device.txt" 2>&1
if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
        .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
step install 120 python3 -m pip install --no-deps --no-index --no-build-isolation \
    -e . -e plugins/triton -e plugins/cuda
step info 30 python3 -m hwplug.cli.main info
step tests 170 python3 -m pytest -q -p no:randomly -p no:cacheprovider -n 8 plugins/triton/tests plugins/cuda/tests
step cuda_graphs 120 python3 -m pytest -q -p no:randomly -p no:cacheprovider \
    plugins/cuda/tests/test_cuda_graphs.py
step conformance 60 python3 -m hwplug.cli.main conformance cuda --json
step bench_kernels 110 python3 plugins/triton/benchmarks/bench_kernels.py --out "$OUT/RESULTS.md"
step bench_moe 60 python3 plugins/triton/benchmarks/bench_moe.py --out "$OUT/RESULTS_moe.md"
step bench_mla 60 python3 plugins/triton/benchmarks/bench_mla.py --out "$OUT/RESULTS_mla.md"
if [ -n "$HF_DIR" ]; then
    python3 - "$HF_DIR" /tmp/hf-random <<'PY'
import shutil, sys, torch, transformers
src, dst = sys.argv[1:]
config = transformers.AutoConfig.from_pretrained(src)
torch.manual_seed(0)
model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
model.save_pretrained(dst)
for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
    shutil.copy(f"{src}/{name}", dst)
PY
    step generate 150 python3 benchmarks/generate_vs_transformers.py --model /tmp/hf-random \
        --dtype bfloat16 --batch-sizes 1 32 --new-tokens 64 --repeats 2 --eager-row
fi
step tune 60 python3 benchmarks/tune_triton.py --out "$OUT/tuning.json"
