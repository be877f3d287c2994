#!/usr/bin/env bash
# Every GPU measurement of the course in one go, for the first machine with a CUDA GPU.
#
#   bash benchmarks/run_gpu.sh                # results under $OUT if set, else benchmarks/results/
#                                             # (dry runs: $OUT, else $TMPDIR/run_gpu_dry)
#   bash benchmarks/run_gpu.sh some/folder    # results there
#   DRY_RUN=1 bash benchmarks/run_gpu.sh      # force the dry runs (what happens anyway without CUDA)
#
# Needs only python with torch and triton (no Jupyter, no pytest; torch 2.11 + Triton 3.6 is enough):
# the imports are checked first. On a CUDA machine it runs, each under a time limit (limits add up to
# 470 s, under the 8 minutes a first GPU run gets), most valuable first:
#   1. benchmarks/gemm_gpu.py --quick     every GEMM variant and configuration checked, then timed at 8192^3
#   2. benchmarks/attention_gpu.py        d=128, L=4k-16k, MHA and GQA, forward and forward+backward vs SDPA
#   3. benchmarks/lesson_kernels_gpu.py   the lessons' kernels (03, 05, 06) checked on the GPU
#   4. benchmarks/compile_facts.py        registers/spills/shared memory/features with this machine's Triton
# Every script rewrites its dated JSON after each check, configuration and case (benchmarks/_record.py),
# so a step's time limit, an error or a SIGTERM to this script keeps everything that finished.
# Without CUDA it detects that and runs every script's dry run (interpreter, tiny sizes), prints each
# GPU step's plan (cases, timed runs, compiles) and the compile facts of the sm_90 GEMMs. The exit
# status is 1 when any step failed. COURSE_COMMIT names the commit where the tree has no .git.
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
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit,power.max_limit --format=csv 2>/dev/null | tee -a "$LOG"
fi

FAILED=()
CHILD=""
on_term() {  # SIGTERM/SIGINT: stop the running step (it saves what finished), say so, exit
    echo "=== interrupted: stopping the running step; finished results are in $DEST" | tee -a "$LOG"
    [ -n "$CHILD" ] && kill -TERM "$CHILD" 2>/dev/null && wait "$CHILD" 2>/dev/null
    exit 143
}
trap on_term TERM INT
step() {  # step NAME SECONDS COMMAND...: run with a time limit, log it, remember a failure
    local name=$1 limit=$2; shift 2
    local start=$SECONDS
    echo "=== $name ($MODE, limit ${limit}s): $*" | tee -a "$LOG"
    timeout --signal=TERM --kill-after=10 "$limit" "$@" > >(tee -a "$LOG") 2>&1 &
    CHILD=$!
    wait "$CHILD"
    local rc=$?
    CHILD=""
    echo "=== $name: exit $rc after $((SECONDS - start)) s" | tee -a "$LOG"
    [ "$rc" = 0 ] || FAILED+=("$name (exit $rc)")
}

"$PY" -c "import torch, triton, numpy; print('imports ok: torch', torch.__version__, '| triton', triton.__version__)" 2>&1 | tee -a "$LOG"
if [ "${PIPESTATUS[0]}" != 0 ]; then
    echo "FAILED: python cannot import torch, triton and numpy; install them (pip install torch triton)" | tee -a "$LOG"
    exit 1
fi
ATTN=(--head-dims 128 --seqs 4096 8192 16384 --groups 1 4 --backward-max-seq 16384)
if [ "$MODE" = gpu ]; then
    step "gemm" 170 "$PY" benchmarks/gemm_gpu.py --quick --output-dir "$DEST"
    step "attention" 200 "$PY" benchmarks/attention_gpu.py "${ATTN[@]}" \
        --output "$DEST/attention_gpu_$(date -u +%Y-%m-%d_%H%M%S).json"
    step "lesson kernels" 70 "$PY" benchmarks/lesson_kernels_gpu.py --output-dir "$DEST"
    step "compile facts" 30 "$PY" benchmarks/compile_facts.py --quick --output-dir "$DEST"
else
    echo "=== plan of the GPU run (limits 170 + 200 + 70 + 30 = 470 s)" | tee -a "$LOG"
    "$PY" benchmarks/gemm_gpu.py --plan --quick | tee -a "$LOG"
    "$PY" benchmarks/attention_gpu.py --plan "${ATTN[@]}" | tee -a "$LOG"
    step "gemm" 300 "$PY" benchmarks/gemm_gpu.py --dry-run --output-dir "$DEST"
    step "attention" 300 "$PY" benchmarks/attention_gpu.py --dry-run --output "$DEST/attention_gpu_dryrun_$(date -u +%Y-%m-%d_%H%M%S).json"
    step "lesson kernels" 300 "$PY" benchmarks/lesson_kernels_gpu.py --dry-run --output-dir "$DEST"
    if [ "${SKIP_COMPILE:-0}" != 1 ]; then
        step "compile facts" 600 "$PY" benchmarks/compile_facts.py --quick --processes 2 --output-dir "$DEST"
    fi
fi

echo "log: $LOG" | tee -a "$LOG"
if [ ${#FAILED[@]} -gt 0 ]; then
    printf 'FAILED: %s\n' "${FAILED[@]}" | tee -a "$LOG"
    exit 1
fi
echo "all steps passed ($MODE)" | tee -a "$LOG"
