#!/usr/bin/env bash
# Every GPU measurement of the course in one go, for the first machine with a CUDA GPU.
#
#   bash benchmarks/run_gpu.sh                # results under $OUT if set, else benchmarks/results/
#                                             # (dry runs: $OUT, else $TMPDIR/run_gpu_dry)
#   bash benchmarks/run_gpu.sh some/folder    # results there
#   DRY_RUN=1 bash benchmarks/run_gpu.sh      # force the dry runs (what happens anyway without CUDA)
#
# Needs only python with torch and triton (no Jupyter, no pytest). On a CUDA machine it runs, each
# under a time limit (the limits add up to 470 s; about 5 minutes expected on an H100/H200), in quick mode:
#   1. benchmarks/lesson_kernels_gpu.py   the lessons' kernels (03, 05, 06) checked on the GPU
#   2. benchmarks/gemm_gpu.py --quick     every GEMM variant and configuration checked, then timed at 4096^3
#   3. benchmarks/attention_gpu.py        FlashAttention forward/backward vs SDPA, short sweep
#   4. benchmarks/compile_facts.py        registers/spills/shared memory/features with this machine's Triton
# Without CUDA it detects that and runs every script's dry run (interpreter, tiny sizes), and the
# compile facts of the sm_90 GEMMs. Every script writes a dated JSON with provenance (GPU, driver,
# torch/triton versions, course commit, date). The exit status is 1 when any step failed.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python}"
if [ "${DRY_RUN:-0}" = "1" ] || ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    MODE=dry   # dry runs never land in benchmarks/results/, where lessons look for recorded GPU runs
    DEST="${1:-${OUT:-${TMPDIR:-/tmp}/run_gpu_dry}}"
else
    MODE=gpu
    DEST="${1:-${OUT:-benchmarks/results}}"
fi
mkdir -p "$DEST"
LOG="$DEST/run_gpu_$(date -u +%Y-%m-%d_%H%M%S).log"
if [ "$MODE" = dry ]; then
    echo "no CUDA device (or DRY_RUN=1): dry runs only, under the Triton interpreter; results in $DEST" | tee -a "$LOG"
else
    "$PY" -c "import torch, triton; print('GPU', torch.cuda.get_device_name(0), '| torch', torch.__version__, '| triton', triton.__version__)" | tee -a "$LOG"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | tee -a "$LOG"
fi

FAILED=()
step() {  # step NAME SECONDS COMMAND...: run with a time limit, log it, remember a failure
    local name=$1 limit=$2; shift 2
    local start=$SECONDS
    echo "=== $name ($MODE, limit ${limit}s): $*" | tee -a "$LOG"
    timeout --signal=TERM --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    echo "=== $name: exit $rc after $((SECONDS - start)) s" | tee -a "$LOG"
    [ "$rc" = 0 ] || FAILED+=("$name (exit $rc)")
}

if [ "$MODE" = gpu ]; then
    step "lesson kernels" 100 "$PY" benchmarks/lesson_kernels_gpu.py --output-dir "$DEST"
    step "gemm" 180 "$PY" benchmarks/gemm_gpu.py --quick --output-dir "$DEST"
    step "attention" 140 "$PY" benchmarks/attention_gpu.py --seqs 1024 4096 --backward-max-seq 1024 \
        --output "$DEST/attention_gpu_$(date -u +%Y-%m-%d_%H%M%S).json"
    step "compile facts" 50 "$PY" benchmarks/compile_facts.py --quick --output-dir "$DEST"
else
    step "lesson kernels" 120 "$PY" benchmarks/lesson_kernels_gpu.py --dry-run --output-dir "$DEST"
    step "gemm" 120 "$PY" benchmarks/gemm_gpu.py --dry-run --output-dir "$DEST"
    step "attention" 120 "$PY" benchmarks/attention_gpu.py --dry-run
    step "compile facts" 240 "$PY" benchmarks/compile_facts.py --quick --processes 2 --output-dir "$DEST"
fi

echo "log: $LOG" | tee -a "$LOG"
if [ ${#FAILED[@]} -gt 0 ]; then
    printf 'FAILED: %s\n' "${FAILED[@]}" | tee -a "$LOG"
    exit 1
fi
echo "all steps passed ($MODE)" | tee -a "$LOG"
