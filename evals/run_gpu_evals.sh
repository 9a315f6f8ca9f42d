#!/usr/bin/env bash
# Run the evals on one GPU node: the full GSM8K test set per backend and dtype, logit parity,
# and two torchrun ranks over gloo, as many jobs at once as the card's memory holds
# (evals/gpu_queue.py), then pair the runs question by question (python -m dcp_a2a.evals.pair).
#
#   bash evals/run_gpu_evals.sh OUT_DIR [JOB ...]     run the jobs (all, or the ones named)
#   bash evals/run_gpu_evals.sh --jobs OUT_DIR        print the job list and run nothing
#
# Needs, on the node: this checkout installed with the evals extra (pip install -e '.[evals]'),
# the model prepared (python -m dcp_a2a.evals.prepare --model $MODEL; add --dequantise once, so
# that every job loads it in seconds), and GSM8K's train.jsonl and test.jsonl in
# $DCP_A2A_GSM8K_DIR (default ../shared/data/gsm8k next to the checkout). Nothing else may share
# the card: the memory estimates below assume it is free.
#
# Settings (environment): MODEL (qwen2.5-coder-1.5b), DCP_SIZE (4), LIMIT (1319: the full test
# set), BATCH_BF16 (256), BATCH_FP32 (128), and the GiB a job is expected to peak at, GIB_BF16
# (47), GIB_FP32 (51), GIB_TORCHRUN (72), GIB_PARITY (26): measured for the 1.5B model on an
# H100 80GB at those batches (the first batch prefills 256 prompts padded to the longest).
#
# Writes: OUT_DIR/<job>/ for each job (the driver's results.json with per-question records,
# results.md, samples), OUT_DIR/queue/ (<job>.log, <job>.rc, queue.log), then the paired
# reports OUT_DIR/pairs/{float32,bfloat16,floor,torchrun}/ (results.json, results.md) for the
# runs that exist. Exit status 0 when every job and every pairing succeeded.
set -uo pipefail

MODEL=${MODEL:-qwen2.5-coder-1.5b}
DCP_SIZE=${DCP_SIZE:-4}
LIMIT=${LIMIT:-1319}
BATCH_BF16=${BATCH_BF16:-256}
BATCH_FP32=${BATCH_FP32:-128}
GIB_BF16=${GIB_BF16:-47}
GIB_FP32=${GIB_FP32:-51}
GIB_TORCHRUN=${GIB_TORCHRUN:-72}
GIB_PARITY=${GIB_PARITY:-26}
ALL_JOBS="bf16-reference bf16-packed fp32-reference fp32-packed bf16-two_collective bf16-ag_rs parity torchrun"

usage() { sed -n '2,/^set -uo/{/^set -uo/!s/^# \{0,1\}//p}' "$0"; }

jobs_file() {  # one line a job: NAME GiB COMMAND (what gpu_queue runs, in this order)
    local out=$1
    local g="python -m dcp_a2a.evals.gsm8k --model $MODEL --limit $LIMIT --dcp-size $DCP_SIZE"
    local b="$g --batch-size $BATCH_BF16 --dtype bfloat16 --backends"
    local f="$g --batch-size $BATCH_FP32 --dtype float32 --backends"
    echo "bf16-reference $GIB_BF16 $b reference --out $out/bf16-reference"
    echo "bf16-packed $GIB_BF16 $b packed --out $out/bf16-packed"
    echo "fp32-reference $GIB_FP32 $f reference --out $out/fp32-reference"
    echo "fp32-packed $GIB_FP32 $f packed --out $out/fp32-packed"
    echo "bf16-two_collective $GIB_BF16 $b two_collective --out $out/bf16-two_collective"
    echo "bf16-ag_rs $GIB_BF16 $b ag_rs --out $out/bf16-ag_rs"
    echo "parity $GIB_PARITY python -m dcp_a2a.evals.logit_parity --model $MODEL --limit 64" \
        "--dcp-size $DCP_SIZE --dtypes float32,bfloat16 --out $out/parity"
    echo "torchrun $GIB_TORCHRUN torchrun --standalone --nproc-per-node 2 -m dcp_a2a.evals.gsm8k" \
        "--distributed --process-group gloo --model $MODEL --backends packed --dtype bfloat16" \
        "--limit $LIMIT --batch-size $BATCH_BF16 --out $out/torchrun"
}

pair() {  # pair NAME RUN...: the paired report of the runs that exist (two at least)
    local name=$1 runs=() r
    shift
    for r in "$@"; do [ -e "$OUT/$r/results.json" ] && runs+=("$OUT/$r"); done
    [ "${#runs[@]}" -ge 2 ] || return 0
    python -m dcp_a2a.evals.pair "${runs[@]}" --out "$OUT/pairs/$name"
}

case "${1:-}" in
-h|--help) usage; exit 0 ;;
--jobs) [ -n "${2:-}" ] || { usage >&2; exit 2; }; jobs_file "$2"; exit 0 ;;
""|-*) usage >&2; exit 2 ;;
esac
OUT=$1
shift
for name in "$@"; do
    case " $ALL_JOBS " in *" $name "*) ;; *)
        echo "run_gpu_evals.sh: unknown job $name; the jobs: $ALL_JOBS" >&2; exit 2 ;; esac
done
mkdir -p "$OUT/queue" || exit 2
if [ $# -gt 0 ]; then
    for name in "$@"; do jobs_file "$OUT" | awk -v n="$name" '$1 == n'; done >"$OUT/queue/jobs"
else
    jobs_file "$OUT" >"$OUT/queue/jobs"
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
python -m dcp_a2a.evals.gpu_queue "$OUT/queue/jobs" --logs "$OUT/queue"
status=$?
pair float32 fp32-reference fp32-packed || status=1
pair bfloat16 bf16-reference bf16-packed bf16-two_collective bf16-ag_rs || status=1
pair floor fp32-reference bf16-reference bf16-packed bf16-ag_rs || status=1
pair torchrun bf16-reference torchrun bf16-packed || status=1
exit $status
