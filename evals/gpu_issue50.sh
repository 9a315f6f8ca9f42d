#!/usr/bin/env bash
# Issue 50's runs of Qwen2.5-Coder-1.5B-Instruct on one GPU machine (docs/evals.md, "Qwen2.5-
# Coder-1.5B-Instruct on one GPU", says how to carry the model, the data and the wheels there).
# From the checkout's root on the GPU machine, in one hold of the machine (each call within the
# 30 s it stays warm after the last):
#
#   bash evals/gpu_issue50.sh start     # first call: wheels + checkout installed; in the
#                                       # background the bit check on CUDA, gpu-check and
#                                       # issue 47's probes (docs/perf_data), one after another
#   bash evals/gpu_issue50.sh join      # every carry call: append the parts carried so far;
#                                       # after the last one the runs below start, queued
#   bash evals/gpu_issue50.sh collect   # wait for the next job to end (at most WAIT_S s) and
#                                       # bring everything so far back as $OUT/res.tgz
#
# The runs go through evals/gpu_queue.py: one process per job, as many at once as the card's
# memory holds (the estimates in jobs_file, GiB; a job out of memory runs again alone), in this
# order: GSM8K bf16 reference and packed, float32 reference and packed, bf16 two_collective and
# ag_rs, decode-step timings (bench_step --legacy, alone), logit parity, 2 torchrun ranks over
# gloo. Every GSM8K run is the full test set (--limit 1319, batch 256, float32 128, N = 4,
# base e, 256 new tokens): nothing is shrunk. The jobs run in their own sessions while the
# machine is held. ISSUE50_JOBS="NAME ..." (given to join) queues only those jobs, in the
# order given (a later session's remainder).
#
# Everything runs from a copy of the checkout made by start (/tmp/snap, installed in place of
# it): every device call rewrites the checkout with the caller's tree, and tests importing
# from a tree being rewritten fail to import (2026-12-06: gpu-check's unit tier, 7 errors).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
    NVSHMEM_DISABLE_NVLS=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
M=qwen2.5-coder-1.5b
OUT=${OUT:?run this on the device machine: \$OUT is its result folder}
RES=/tmp/res
SNAP=/tmp/snap
LIVE=$PWD
WAIT_S=${WAIT_S:-570}
export DCP_A2A_GSM8K_DIR=$SNAP/.gpurun/gsm8k
G="python3 -m dcp_a2a.evals.gsm8k --model $M --limit 1319 --dcp-size 4"
mkdir -p "$RES"

setup() {  # carried wheels (lm-eval, gguf, what they need) once, then the checkout's copy
    if [ -d .whl ] && [ ! -e /tmp/site/.installed ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl && touch /tmp/site/.installed || exit 1
    fi
    export PYTHONPATH=/tmp/site
    if [ ! -e "$SNAP/.installed" ]; then
        rm -rf "$SNAP" && mkdir -p "$SNAP" \
            && tar -c --exclude=./.gpurun/parts --exclude=./.whl --exclude=./.venv . \
                | tar -x -C "$SNAP" \
            && (cd "$SNAP" && python3 -m pip install -q --no-build-isolation --no-deps -e .) \
            && touch "$SNAP/.installed" || exit 1
    fi
    cd "$SNAP" || exit 1
}

bg() {  # bg NAME COMMAND...: a job in its own session (it outlives the call), log in $RES
    local name=$1; shift
    setsid nohup bash -c "$*; echo \$? >$RES/$name.rc" >"$RES/$name.log" 2>&1 </dev/null &
}

jobs_file() {  # one line a job: NAME GiB COMMAND (what gpu_queue runs, in this order)
    # GiB: the first batch prefills 256 (float32: 128) prompts padded to the longest, 1597
    # tokens: three [tokens, 8960] MLP activations, hidden states, the KV cache for 1853
    # positions and the weights -- ~41 GiB in bf16 at batch 256, ~45 GiB in float32 at 128
    # (float32 at 256 would need ~90 GiB), each rank of the torchrun job ~35 GiB
    local b="$G --batch-size 256 --dtype bfloat16 --backends" f="$G --batch-size 128"
    f="$f --dtype float32 --backends"
    # measured on one H100 (2026-12-06, nvidia-smi every 5 s, one job at a time): 45.9 GiB a
    # bf16 run, 49.6 GiB a float32 run
    echo "bf16-reference 47 $b reference --out $RES/g-bfloat16-reference"
    echo "bf16-packed 47 $b packed --out $RES/g-bfloat16-packed"
    echo "fp32-reference 51 $f reference --out $RES/g-float32-reference"
    echo "fp32-packed 51 $f packed --out $RES/g-float32-packed"
    echo "bf16-two_collective 47 $b two_collective --out $RES/g-bfloat16-two_collective"
    echo "bf16-ag_rs 47 $b ag_rs --out $RES/g-bfloat16-ag_rs"
    echo "check 999 python3 -m dcp_a2a.evals.bench_step --model $M --dtype bfloat16" \
        "--batch-size 256 --context 900 --steps 16 --rounds 2 --legacy --profile 2" \
        "--out $RES/bench_bf16"
    echo "parity 26 python3 -m dcp_a2a.evals.logit_parity --model $M --limit 64 --dcp-size 4" \
        "--dtypes float32,bfloat16 --out $RES/logit_parity"
    echo "torchrun 72 torchrun --standalone --nproc-per-node 2 -m dcp_a2a.evals.gsm8k" \
        "--distributed --process-group gloo --model $M --backends packed --dtype bfloat16" \
        "--limit 1319 --batch-size 256 --out $RES/d-bfloat16-packed"
}

case "${1:-}" in
start)
    setup
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
    bg gpumem "nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv -l 5"
    bg checks "python3 -m pytest tests/e2e/test_fast_path.py tests/gpu/test_native_bf16.py -q" \
        "-p no:cacheprovider" \
        ">$RES/bitcheck.log 2>&1; python3 -m dcp_a2a gpu-check --out $RES/gc;" \
        "python3 docs/perf_data/issue47_probe.py $RES/issue47_probe.json;" \
        "python3 docs/perf_data/eager_profile.py $RES/eager_profile.json --calls 1000" ;;
join)
    setup
    python3 -m dcp_a2a.evals.prepare --model $M --join "$LIVE/.gpurun/parts" || exit
    if [ ! -e "$RES/jobs" ]; then
        if [ -n "${ISSUE50_JOBS:-}" ]; then
            for name in $ISSUE50_JOBS; do jobs_file | awk -v n="$name" '$1 == n'; done \
                >"$RES/jobs"
        else
            jobs_file >"$RES/jobs"
        fi
        # the float32 copy (evals/dequantised.py: every job then loads in seconds) is made on
        # the CPU while the checks finish; without it the jobs read the GGUF, as before
        bg queue "python3 -m dcp_a2a.evals.prepare --model $M --dequantise;" \
            "while [ ! -e $RES/checks.rc ]; do sleep 2; done;" \
            "python3 -m dcp_a2a.evals.gpu_queue $RES/jobs --logs $RES/q"
        echo "queue started: $(grep -c . "$RES/jobs") jobs"
    fi ;;
collect)
    setup
    n0=$(ls "$RES"/q/*.rc 2>/dev/null | wc -l); t0=$SECONDS
    while [ ! -e "$RES/queue.rc" ] && [ $((SECONDS - t0)) -lt "$WAIT_S" ] \
        && [ "$(ls "$RES"/q/*.rc 2>/dev/null | wc -l)" = "$n0" ]; do sleep 5; done
    cut -c1-200 "$RES/q/queue.log" 2>/dev/null
    for f in checks bitcheck; do [ -e "$RES/$f.log" ] && tail -n 12 "$RES/$f.log"; done
    tail -n 2 "$RES/gpumem.log"
    # two archives: a file comes back only under 16 MiB, and gpu-check's report is the big one
    tar czf "$OUT/res.tgz" -C "$RES" --exclude=./gc . \
        && { [ ! -d "$RES/gc" ] || tar czf "$OUT/gc.tgz" -C "$RES" gc; } && ls -l "$OUT" ;;
*)
    sed -n '2,/^set -uo/{/^set -uo/!p}' "$0"; exit 2 ;;
esac
