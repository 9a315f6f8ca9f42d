#!/usr/bin/env bash
# Issue 50's runs of Qwen2.5-Coder-1.5B-Instruct on one H200 (docs/evals.md, "Qwen2.5-Coder-
# 1.5B-Instruct on one H200: NOT RUN YET", says how to carry the model, the data and the
# wheels there). From the checkout's root on the GPU machine, one step per device call:
#
#   bash evals/gpu_issue50.sh bitcheck      # the speed-up's bit check on CUDA (no model)
#   bash evals/gpu_issue50.sh join          # every carry call: append the parts carried so far
#   bash evals/gpu_issue50.sh check         # decode-step timings, legacy vs today, bf16
#   bash evals/gpu_issue50.sh run fp32      # reference + packed, float32, full test set
#   bash evals/gpu_issue50.sh run bf16      # reference, packed, two_collective, ag_rs, bf16
#   bash evals/gpu_issue50.sh run parity    # logit parity (64 texts, fp32 + bf16) beside
#                                           # 2 torchrun ranks over gloo, packed, bf16
#   bash evals/gpu_issue50.sh wait          # a step's jobs outlasting its call: wait again
#
# `run` starts its jobs in their own process sessions (they outlive the call while the machine
# is held; a call must follow within its 30 s warm time) and waits up to WAIT_S seconds (570).
# When they are done, everything under /tmp/res goes to $OUT/res_<step>.tgz. Every GSM8K run is
# the full test set (--limit 1319, batch 256, N = 4, base e, 256 new tokens): nothing is shrunk.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
    NVSHMEM_DISABLE_NVLS=1
M=qwen2.5-coder-1.5b
OUT=${OUT:?run this on the device machine: \$OUT is its result folder}
RES=/tmp/res
WAIT_S=${WAIT_S:-570}
export DCP_A2A_GSM8K_DIR=$PWD/.gpurun/gsm8k
G="python3 -m dcp_a2a.evals.gsm8k --model $M --limit 1319 --batch-size 256 --dcp-size 4"
mkdir -p "$RES"

setup() {  # carried wheels (lm-eval, gguf, what they need) once, then this checkout
    if [ -d .whl ] && [ ! -e /tmp/site/.installed ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl && touch /tmp/site/.installed || exit 1
    fi
    export PYTHONPATH=/tmp/site
    python3 -c "import dcp_a2a.evals" 2>/dev/null \
        || python3 -m pip install -q --no-build-isolation --no-deps -e . || exit 1
}

start() {  # start NAME COMMAND...: a job in its own session, its log in $RES/NAME.log
    local name=$1; shift
    echo "$name" >>"$RES/jobs"
    setsid nohup bash -c "$*; echo \$? >$RES/$name.rc" >"$RES/$name.log" 2>&1 </dev/null &
}

wait_jobs() {  # until every started job wrote its exit status, or WAIT_S seconds
    local step=$1 t0=$SECONDS left
    while :; do
        left=0
        for j in $(cat "$RES/jobs" 2>/dev/null); do [ -e "$RES/$j.rc" ] || left=$((left + 1)); done
        [ "$left" = 0 ] && break
        if [ $((SECONDS - t0)) -ge "$WAIT_S" ]; then
            echo "$left job(s) still running after ${WAIT_S}s: call 'bash $0 wait' again"
            for j in $(cat "$RES/jobs"); do echo "== $j"; tail -c 300 "$RES/$j.log"; echo; done
            return 1
        fi
        sleep 10
    done
    for j in $(cat "$RES/jobs"); do
        echo "== $j: exit $(cat "$RES/$j.rc")"; tail -n 3 "$RES/$j.log"
    done
    rm -f "$RES/jobs"
    tar czf "$OUT/res_$step.tgz" -C "$RES" . && ls -l "$OUT"
    echo "$step" >"$RES/last_done"
}

step=${1:-}
case "$step" in
join)
    setup
    python3 -m dcp_a2a.evals.prepare --model $M --join .gpurun/parts ;;
bitcheck)  # needs no model: the first call, with the wheels and the data
    setup
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
    python3 -m pytest tests/e2e/test_fast_path.py -q -p no:cacheprovider 2>&1 \
        | tee "$OUT/bitcheck_pytest.log" ;;
check)
    setup
    python3 -m dcp_a2a.evals.bench_step --model $M --dtype bfloat16 --batch-size 256 \
        --context 900 --steps 16 --rounds 2 --legacy --profile 2 --out "$RES/bench_bf16" \
        2>&1 | grep -v "it/s]" | tee "$RES/check_bench.log"
    tar czf "$OUT/res_check.tgz" -C "$RES" check_bench.log bench_bf16 ;;
run)
    setup
    what=${2:?run fp32, bf16 or parity}
    rm -f "$RES/jobs"
    echo "$what" >"$RES/step"
    case "$what" in
    fp32)
        for b in reference packed; do
            start "fp32-$b" "$G --backends $b --dtype float32 --out $RES/g-float32-$b"
        done ;;
    bf16)
        for b in reference packed two_collective ag_rs; do
            start "bf16-$b" "$G --backends $b --dtype bfloat16 --out $RES/g-bfloat16-$b"
        done ;;
    parity)
        start "parity" "python3 -m dcp_a2a.evals.logit_parity --model $M --limit 64" \
            "--dcp-size 4 --dtypes float32,bfloat16 --out $RES/logit_parity"
        start "torchrun" "torchrun --standalone --nproc-per-node 2 -m dcp_a2a.evals.gsm8k" \
            "--distributed --process-group gloo --model $M --backends packed --dtype bfloat16" \
            "--limit 1319 --batch-size 256 --out $RES/d-bfloat16-packed" ;;
    *) echo "run what? fp32, bf16 or parity"; exit 2 ;;
    esac
    wait_jobs "$what" ;;
wait)
    setup
    wait_jobs "$(cat "$RES/step")" ;;
*)
    sed -n '2,21p' "$0"; exit 2 ;;
esac
