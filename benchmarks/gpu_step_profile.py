"""Where one DP-GD step's time goes on a GPU: the kernels of :mod:`bench_dpgd`'s step, by name.

    python benchmarks/gpu_step_profile.py [--n 1000000] [--models logreg,mlp] [--steps 3]

Builds the same step as ``bench_dpgd.py --device gpu`` (CuPy, float32, Algorithm 7 with the
ledger), warms it up, then records ``--steps`` steps with PyTorch's profiler, which reads every
CUDA kernel of the process through CUPTI, CuPy's included. Prints per step: wall time, GPU busy
time (the sum of kernel and copy times), the number of kernel launches, and the kernels that
took the most time. Wall time well above busy time is host overhead (Python, launches, syncs).
Needs CuPy, torch with CUDA, and a device.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_dpgd import ours_step, synthetic_data  # noqa: E402
from renyi_stream.stream.noise import InsecureNoiseWarning  # noqa: E402


def profile_model(model_name: str, n: int, features: int, steps: int, top: int) -> None:
    import cupy as cp  # type: ignore[import-not-found]
    import torch
    from torch.profiler import ProfilerActivity, profile

    x, y = synthetic_data(n, features)
    run, sync = ours_step(model_name, x, y, xp=cp, chunk_rows=None)
    for _ in range(2):
        run()
    sync()
    walls = []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            start = time.perf_counter()
            run()
            sync()
            walls.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    per_kernel: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    busy = 0.0
    launches = 0
    for event in prof.events():
        device_us = getattr(event, "device_time", None)
        if device_us is None:
            device_us = getattr(event, "cuda_time", 0.0)
        if str(getattr(event, "device_type", "")).endswith("CUDA") and device_us:
            per_kernel[event.name][0] += device_us
            per_kernel[event.name][1] += 1
            busy += device_us
            launches += 1
    print(f"## {model_name}, n={n:,}: wall {', '.join(f'{w * 1e3:.2f}' for w in walls)} ms per step; "
          f"GPU busy {busy / steps / 1e3:.2f} ms per step; {launches / steps:.0f} kernels and copies per step")
    print("| kernel | ms per step | calls per step |")
    print("|---|---|---|")
    for name, (us, calls) in sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"| {name[:90]} | {us / steps / 1e3:.3f} | {calls / steps:g} |")
    del run, sync, x, y
    cp.get_default_memory_pool().free_all_blocks()


def time_alternatives(n: int, hidden: int = 256, k: int = 10) -> None:
    """Device times of the reductions the models use, each beside an equivalent formulation."""
    import cupy as cp  # type: ignore[import-not-found]

    rng = cp.random.default_rng(0)
    h = rng.standard_normal((n, hidden), dtype=cp.float32)
    d_t = rng.standard_normal((k, n), dtype=cp.float32)
    ones = cp.ones(n, dtype=cp.float32)
    cases = {
        "einsum ij,ij->i (n, hidden)": lambda: cp.einsum("ij,ij->i", h, h),
        "(h * h).sum(axis=1)": lambda: (h * h).sum(axis=1),
        "h.sum(axis=0) (n, hidden)": lambda: h.sum(axis=0),
        "ones @ h": lambda: ones @ h,
        "einsum ij,ij->j (K, n)": lambda: cp.einsum("ij,ij->j", d_t, d_t),
        "(d * d).sum(axis=0) (K, n)": lambda: (d_t * d_t).sum(axis=0),
        "h *= (h > 0)": lambda: h.__imul__(h > 0),
        "maximum(h, 0, out=h)": lambda: cp.maximum(h, 0, out=h),
        "h += b (hidden,)": lambda: h.__iadd__(ones[:hidden]),
    }
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    print("| operation | ms |")
    print("|---|---|")
    for name, run in cases.items():
        run()
        times = []
        for _ in range(10):
            start.record()
            run()
            stop.record()
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop))
        times.sort()
        print(f"| {name} | {times[len(times) // 2]:.3f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--features", type=int, default=784)
    parser.add_argument("--models", default="logreg,mlp")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--alternatives", action="store_true", help="also time the reductions' alternatives")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", InsecureNoiseWarning)
    for model_name in args.models.split(","):
        profile_model(model_name, args.n, args.features, args.steps, args.top)
    if args.alternatives:
        time_alternatives(args.n)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
