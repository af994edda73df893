#!/usr/bin/env bash
# What issue 21 asks of a GPU, in one command, on a machine with a CUDA device, CuPy, torch and
# Opacus (pip install '.[gpu,bench,test]'):
#
#   bash benchmarks/gpu_check.sh [OUTDIR]      # default OUTDIR: gpu-check
#
# 1. the kernels on real CuPy against NumPy (tests/test_gpu_kernels.py) and the models' tests,
#    which add CuPy to their array modules when a device is present;
# 2. the DP-GD step against Opacus on the same GPU, n = 1M, with our two products alone and a
#    measured device-to-device copy beside the datasheet's bandwidth: one step per timed call,
#    then ten (one private_gd run of ten steps, as training runs them).
# Each part's log is written to OUTDIR; the exit status is 1 if any part failed.
set -uo pipefail
out=${1:-gpu-check}
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
status=0
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv \
    | tee "$out/device.txt"
"$py" -c 'import sys, numpy, cupy, torch; print("python", sys.version.split()[0], "numpy", numpy.__version__,
          "cupy", cupy.__version__, "torch", torch.__version__, "cuda", cupy.cuda.runtime.runtimeGetVersion())' \
    | tee -a "$out/device.txt"
"$py" -m pytest -q -n 4 -p no:cacheprovider tests/test_gpu_kernels.py tests/test_training_models.py 2>&1 \
    | tee "$out/gpu_tests.log" || status=1
"$py" benchmarks/bench_dpgd.py --device gpu --gemm-floor 2>&1 | tee "$out/bench_dpgd_gpu.log" || status=1
"$py" benchmarks/bench_dpgd.py --device gpu --gemm-floor --steps-per-call 10 2>&1 \
    | tee "$out/bench_dpgd_gpu_10_steps.log" || status=1
exit $status
