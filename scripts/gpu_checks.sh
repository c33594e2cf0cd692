#!/usr/bin/env bash
# The engine's checks that need a CUDA GPU, in one run of at most 10 minutes (BUDGET_S, default
# 570 s: each step's limit is cut to what is left), most important first, each under its own
# time limit so that one that hangs leaves time for the rest:
#   1. benchmarks/decode_graphs.py: the V3.1 slice's decode steps op by op and from CUDA graphs,
#      against the bandwidth floor (batch 1, 8 and 64 over 4K contexts; MTP verify steps);
#   2. the Triton kernels against their torch references, on the GPU, with the decode graphs'
#      and the chunked prefix attention's tests (captured graphs replay the eager tokens);
#   3. benchmarks/engine_throughput.py part (c): a 4,096-token prompt cold and with 3,584 tokens
#      cached (chunked prefix attention, and the dense path beside it);
#   4. benchmarks/mtp.py in bf16 on the GPU (needs a trained checkpoint: MTP_CHECKPOINT), with
#      the measured speculation policy;
#   5. benchmarks/kernels.py at DeepSeek-V3.1's widths, against the H200's limits (the fused
#      small kernels against the unfused torch ops they replace);
#   6. the parallel engine with CUDA tensors (ranks share the GPU over gloo), with tensor- and
#      with data-parallel attention;
#   7. benchmarks/kernel_tiles.py (not in the default STEPS: a sweep of its own).
# STEPS names the steps to run (default: 1-6, by the names below). Each writes its log
# to $LOGS (default .data/gpu-checks); the exit status counts the failures.
# Runs with the machine's own python3 and packages (PYTHON overrides): only pytest, torch,
# triton and transformers are needed beyond the repository; SITE_WHEELS names a folder of extra
# wheels to install first (structlog, where the image lacks it).
set -u
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
logs=${LOGS:-.data/gpu-checks}
mtp_checkpoint=${MTP_CHECKPOINT:-.data/trained-tiny}
mkdir -p "$logs"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
failures=0

if [[ -n "${SITE_WHEELS:-}" ]]; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --target /tmp/gpu-site "$SITE_WHEELS"/*.whl
    export PYTHONPATH=/tmp/gpu-site${PYTHONPATH:+:$PYTHONPATH}
fi

steps=${STEPS:-decode-graphs kernel-tests engine-benchmark mtp-benchmark kernel-benchmark parallel-cuda-tests parallel-dp-cuda-tests}
budget=${BUDGET_S:-570}

step() {  # step NAME SECONDS COMMAND...: run, log, report the time and the exit status
    local name=$1 limit=$2
    shift 2
    [[ " $steps " == *" $name "* ]] || return 0
    local left=$((budget - SECONDS))
    if ((left < 20)); then
        echo "=== $name: skipped, ${left} s of the budget left"
        failures=$((failures + 1))
        return 0
    fi
    ((limit > left)) && limit=$left
    local start=$SECONDS
    echo "=== $name (limit ${limit} s)"
    timeout --kill-after=10 "$limit" "$@" >"$logs/$name.log" 2>&1
    local rc=$?
    tail -n 40 "$logs/$name.log"
    echo "=== $name: exit $rc after $((SECONDS - start)) s"
    [[ $rc -eq 0 ]] || failures=$((failures + 1))
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
"$py" -c 'import sys, torch, triton; print(sys.version.split()[0], "torch", torch.__version__,
    "triton", triton.__version__, "cuda", torch.cuda.is_available())'

# The repository's pytest settings need plugins an image may lack (pytest-asyncio): these
# tests are synchronous, so a minimal configuration of their own serves, and conftest files
# above tests/backend (the gateway's fixtures) are not loaded.
ini=$(mktemp --suffix=.ini)
printf '[pytest]\nmarkers =\n    slow: s\n    triton: t\ntimeout = 300\n' >"$ini"
pytest_args=(-c "$ini" --rootdir . --confcutdir tests/backend -p no:cacheprovider -q -rfEs)

step decode-graphs 150 "$py" -m benchmarks.decode_graphs
step kernel-tests 150 "$py" -m pytest "${pytest_args[@]}" tests/backend/kernels \
    tests/backend/test_graph_runner.py tests/backend/test_mla_prefix.py
step engine-benchmark 120 "$py" -m benchmarks.engine_throughput --device cuda --parts c
if [[ -f "$mtp_checkpoint/config.json" ]]; then
    step mtp-benchmark 120 "$py" -m benchmarks.mtp "$mtp_checkpoint" --device cuda \
        --dtype bfloat16 --rounds 5 --threads 0
else
    echo "=== mtp-benchmark: no trained checkpoint at $mtp_checkpoint, skipped"
fi
step kernel-benchmark 120 "$py" benchmarks/kernels.py
step parallel-cuda-tests 90 "$py" -m pytest "${pytest_args[@]}" tests/backend/test_parallel_cuda.py
step parallel-dp-cuda-tests 90 "$py" -m pytest "${pytest_args[@]}" tests/backend/test_parallel_dp_cuda.py
step kernel-tiles 300 "$py" benchmarks/kernel_tiles.py --budget-s 200

echo "=== failures: $failures"
exit "$failures"
