"""One full-batch DP-GD step: this implementation against Opacus, in the same run.

    python benchmarks/bench_dpgd.py                  # CPU: n = 200k, 784 features, 10 classes
    python benchmarks/bench_dpgd.py --device gpu     # GPU: n = 1M, CuPy against Opacus on CUDA

Both sides do the same step on the same synthetic data (float32, features uniform in [0, 1],
random labels): per-example gradients of the cross-entropy, each clipped to ``C``, summed, plus
Gaussian noise ``N(0, sigma^2 C^2)``, divided by ``n``, one SGD update. Models: multinomial
logistic regression (784 -> 10) and a one-hidden-layer ReLU MLP (784 -> 256 -> 10).

* **this implementation**: :func:`renyi_stream.stream.training.dpgd.private_gd` running Algorithm 7 on a
  fresh per-user ledger, so a step also does the individual filter and charges every user
  (the whole production step, ledger included);
* **Opacus** (PyTorch): ``PrivacyEngine.make_private(..., grad_sample_mode="ghost")``, its
  fastest mode for these layers (ghost clipping: per-example norms from activations and
  backprops, a second backward for the clipped sum; every layer here is ``nn.Linear``, so
  ghost clipping applies to all of them and the per-sample hook mode is not needed). Skipped
  with a message when ``torch``/``opacus`` are not installed (``pip install '.[bench]'``).

Each side runs in a process of its own (spawned, so neither inherits the other's BLAS or
OpenMP thread pools), builds its step on the same data (generated from seed 0 in each worker)
and is warmed up with one step. Then the sides take turns (ours, Opacus, ours, ...) so that
load from other processes on a shared machine falls on both alike. A turn is a pause of
``--settle`` seconds (an idle worker's BLAS and OpenMP threads spin for a while after their
last call and would take a core from the step that follows), ``--warm-steps`` untimed steps
(default 1), and one timed step. The untimed step is there because training runs its steps back
to back, and a step right after the other side's is not what training sees: measured on
2 cores, Opacus's MLP step takes 2.1 to 2.6 s right after ours and 1.6 to 2.0 s after one of
its own (ours 0.85 to 0.95 s either way; logistic regression is unaffected on both sides).
``--same-process --warm-steps 0`` is how earlier versions timed both (one process, single
alternating steps); it flattered the ratio for the MLP (2.2x to 3.0x in their runs, against
1.8x to 2.2x here).

``--steps-per-call S`` times S steps per call and reports per step: ours as one ``private_gd``
run of S steps, as training runs them, so that a run's setup and its one read of the curator
counts at the end (a device synchronisation on a GPU) are not charged to every step.

The median of ``--repeats`` timed steps is reported as examples per second, with the ratio
(target: >= 3x Opacus). Ours runs with ``private_gd``'s default slicing (on the CPU, slices of
about 32 MB of ``x``, :func:`renyi_stream.stream.training.dpgd.default_chunk_rows`; ``--chunk-rows``
overrides it). ``--gemm-floor`` adds, per model, the FLOPs of each side's matrix products and
the time of our step's two large products alone, as plain NumPy matmuls of the same shapes
(whole batch and in our slices) and as torch matmuls: the ceiling of any speed-up from the
code around them. On the GPU the step is also
compared with the memory-bandwidth bound: the least any full-batch step must move is one read
of ``x`` (``n * d * 4`` bytes); ``fraction = (bytes / peak bandwidth) / step time``.
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from renyi_stream.stream.noise import InsecureNoiseWarning  # noqa: E402
from renyi_stream.stream.training.budget import TrainingLedger  # noqa: E402
from renyi_stream.stream.training.dpgd import (  # noqa: E402
    GDConfig,
    default_chunk_rows,
    prepare_data,
    private_gd,
    training_generators,
)
from renyi_stream.stream.training.models import make_model  # noqa: E402

CLIP, SIGMA, LR = 1.0, 1.0, 0.1
# Peak memory bandwidth (bytes/s) by device name, used when the driver does not report it.
KNOWN_BANDWIDTH = {"H100 SXM": 3.35e12, "H100 NVL": 3.9e12, "H100 PCIe": 2.0e12, "H100": 3.35e12,
                   "H200": 4.8e12, "A100-SXM4-80GB": 2.04e12, "A100": 1.555e12, "L4": 0.3e12}


Step = tuple[Callable[[], Any], Callable[[], None]]  # (one step, wait for the device)


def time_same_process(sides: list[str], model_name: str, *, n: int, features: int, device: str,
                      chunk_rows: int | None, repeats: int, warm_steps: int,
                      steps_per_call: int = 1) -> dict[str, list[float] | str]:
    """As :func:`time_isolated`, with every side built and timed in this process, no pause."""
    steps: dict[str, Step] = {}
    results: dict[str, list[float] | str] = {}
    for side in sides:
        built = build_step(side, model_name, n, features, device, chunk_rows, steps_per_call)
        if isinstance(built, str):
            results[side] = built
        else:
            steps[side] = built
    results.update(time_interleaved(steps, repeats, warm_steps))
    return results


def time_interleaved(steps: dict[str, Step], repeats: int, warm_steps: int = 0) -> dict[str, list[float]]:
    """Seconds of each timed step of each entry, warmed up once, timed in alternation, each timed
    step after ``warm_steps`` untimed ones."""
    for run, sync in steps.values():
        run()
        sync()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, (run, sync) in steps.items():
            for _ in range(warm_steps):
                run()
            sync()
            start = time.perf_counter()
            run()
            sync()
            times[name].append(time.perf_counter() - start)
    return times


def synthetic_data(n: int, features: int) -> tuple[np.ndarray, np.ndarray]:
    """The benchmark's data: features uniform in [0, 1] (float32), labels uniform in 0..9 (seed 0)."""
    rng = np.random.default_rng(0)
    return rng.random((n, features), dtype=np.float32), rng.integers(0, 10, size=n)


def product_operands(model_name: str, n: int, d: int, hidden: int = 256) -> tuple[np.ndarray, ...]:
    """Random float32 stand-ins (seed 1) for the step's first-layer weights ``(d, width)`` and
    its residuals ``delta`` ``(n, width)`` and ``delta^T``, ``width`` being 10 classes or
    ``hidden`` units."""
    width = 10 if model_name == "logreg" else hidden
    rng = np.random.default_rng(1)
    w = rng.standard_normal((d, width), dtype=np.float32)
    delta = rng.standard_normal((n, width), dtype=np.float32)
    return w, delta, np.ascontiguousarray(delta.T)


def products_floor_step(model_name: str, x: np.ndarray, chunk_rows: int, hidden: int = 256,
                        steps_per_call: int = 1) -> Step:
    """Our step's two large products alone, in our slices (``x W`` and the weighted product with
    ``x``, shapes, layouts and dtype as the step's): the floor a step built on them can reach.
    Timed as a side of its own (``--gemm-floor``), in turns with ours, so that both see the same
    machine: a floor timed minutes apart moved by up to 20% on the shared 2-core machine."""
    n, d = x.shape
    w, delta, delta_t = product_operands(model_name, n, d, hidden)

    def products() -> None:
        for _ in range(steps_per_call):
            for s in range(0, n, chunk_rows):
                rows = slice(s, min(s + chunk_rows, n))
                x[rows] @ w
                if model_name == "logreg":
                    delta_t[:, rows] @ x[rows]
                else:
                    x[rows].T @ delta[rows]

    return products, lambda: None


def build_step(side: str, model_name: str, n: int, features: int, device: str, chunk_rows: int | None,
               steps_per_call: int = 1) -> Step | str:
    """``side``'s step (``"ours"``, ``"opacus"`` or ``"floor"``, see :func:`products_floor_step`)
    on :func:`synthetic_data`, or why it was skipped."""
    x, y = synthetic_data(n, features)
    if side == "floor":
        return products_floor_step(model_name, x, chunk_rows or default_chunk_rows(n, features, np.float32, np),
                                   steps_per_call=steps_per_call)
    if side == "opacus":
        return opacus_step(model_name, x, y, device="cuda" if device == "gpu" else "cpu", steps_per_call=steps_per_call)
    if device == "gpu":
        import cupy as xp  # type: ignore[import-not-found]
    else:
        xp = np
    return ours_step(model_name, x, y, xp=xp, chunk_rows=chunk_rows, steps_per_call=steps_per_call)


def _step_worker(conn: Any, side: str, model_name: str, n: int, features: int, device: str,
                 chunk_rows: int | None, steps_per_call: int = 1) -> None:
    """A worker process: build ``side``'s step, warm it up, then per ``("step", warm)`` message run
    ``warm`` untimed steps and time one more."""
    warnings.simplefilter("ignore", InsecureNoiseWarning)
    try:
        built = build_step(side, model_name, n, features, device, chunk_rows, steps_per_call)
        if isinstance(built, str):
            conn.send(("skipped", built))
            return
        run, sync = built
        run()
        sync()
        conn.send(("ready", None))
        while (message := conn.recv())[0] == "step":
            for _ in range(message[1]):  # untimed: bring this side's working set back into cache
                run()
            sync()
            start = time.perf_counter()
            run()
            sync()
            conn.send(("seconds", time.perf_counter() - start))
    except Exception as exc:  # reported by the parent, which then stops the run
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))


def time_isolated(sides: list[str], model_name: str, *, n: int, features: int, device: str,
                  chunk_rows: int | None, repeats: int, settle: float,
                  warm_steps: int, steps_per_call: int = 1) -> dict[str, list[float] | str]:
    """Seconds of each timed step per side (or why a side was skipped), each side in a spawned
    process of its own, warmed up once, timed in alternation; each turn is a pause of ``settle``
    seconds, ``warm_steps`` untimed steps, then the timed one."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    workers: dict[str, tuple[Any, Any]] = {}
    skipped: dict[str, str] = {}
    try:
        for side in sides:  # built one after the other, so that the builds do not share the cores
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_step_worker, args=(child, side, model_name, n, features, device, chunk_rows,
                                                                      steps_per_call),
                               daemon=True)
            proc.start()
            child.close()
            workers[side] = (parent, proc)
            status, detail = parent.recv()
            if status == "failed":
                raise RuntimeError(f"the {side} worker failed while building its step: {detail}")
            if status == "skipped":
                skipped[side] = detail
        times: dict[str, list[float]] = {side: [] for side in workers if side not in skipped}
        for _ in range(repeats):
            for side in times:
                conn = workers[side][0]
                time.sleep(settle)
                conn.send(("step", warm_steps))
                status, value = conn.recv()
                if status == "failed":
                    raise RuntimeError(f"the {side} worker failed during a step: {value}")
                times[side].append(float(value))
    finally:
        for conn, proc in workers.values():
            try:
                conn.send(("stop", 0))
            except (BrokenPipeError, OSError):  # the worker has already exited (skipped or failed)
                pass
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    return {**times, **skipped}


def ours_step(model_name: str, x: np.ndarray, y: np.ndarray, *, xp: Any, chunk_rows: int | None,
              steps_per_call: int = 1) -> Step:
    """``steps_per_call`` Algorithm 7 steps (ledger charging included) as one ``private_gd`` run,
    on ``xp``: a run's own setup and its one read of the curator counts at the end are paid once
    per call."""
    model = make_model(model_name, hidden=256)
    data = prepare_data(x, y, n_classes=10, xp=xp, dtype=np.float32)
    ledger = TrainingLedger.fresh(data.n, budget=1e6, xp=xp)
    config = GDConfig(clip=CLIP, noise_multiplier=SIGMA, learning_rate=LR, steps=10**6, filtering=True,
                      max_steps=steps_per_call)
    params = model.init_params(data.n_features, 10, np.random.default_rng(0), xp, np.float32)
    grad_rng, query_rng = training_generators(0)

    def step() -> None:
        result = private_gd(model, data, config=config, ledger=ledger, rng=grad_rng, query_rng=query_rng,
                            init_params=params, chunk_rows=chunk_rows, normaliser=data.n)
        params.update(result.params)

    sync = (lambda: xp.cuda.Stream.null.synchronize()) if xp is not np else (lambda: None)
    return step, sync


def opacus_step(model_name: str, x: np.ndarray, y: np.ndarray, *, device: str,
                steps_per_call: int = 1) -> Step | str:
    """``steps_per_call`` Opacus ghost-clipping steps, or why it was skipped."""
    try:
        import torch
        from opacus import PrivacyEngine
    except ImportError as exc:
        return f"skipped: {exc.name} is not installed (pip install '.[bench]')"
    if device == "cuda" and not torch.cuda.is_available():
        return "skipped: this torch build has no CUDA device"
    torch.manual_seed(0)
    d, k = x.shape[1], 10
    net = torch.nn.Linear(d, k) if model_name == "logreg" else torch.nn.Sequential(
        torch.nn.Linear(d, 256), torch.nn.ReLU(), torch.nn.Linear(256, k))
    net = net.to(device)
    xt = torch.from_numpy(x).to(device)
    yt = torch.from_numpy(y.astype(np.int64)).to(device)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xt, yt), batch_size=len(y))
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus warns about secure_mode and full-batch sampling
        engine = PrivacyEngine(accountant="rdp")
        module, optimizer, criterion, _ = engine.make_private(
            module=net, optimizer=optimizer, data_loader=loader, noise_multiplier=SIGMA, max_grad_norm=CLIP,
            grad_sample_mode="ghost", criterion=torch.nn.CrossEntropyLoss(), poisson_sampling=False)

    def step() -> None:
        for _ in range(steps_per_call):
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(module(xt), yt)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "Full backward hook is firing ..." on every step
                loss.backward()
            optimizer.step()

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    return step, sync


def gemm_flops(model_name: str, n: int, d: int, k: int = 10, hidden: int = 256) -> tuple[float, float]:
    """FLOPs of the matrix products of one step: (ours, Opacus ghost clipping).

    Ours: the forward products and, after the clip weights are known, one weighted product per
    layer (plus, for the MLP, ``delta2 W2^T``). Opacus ghost clipping: forward, a first backward
    (per-example norms from activations and backprops, and autograd's parameter gradients), then
    a second backward of the rescaled loss (parameter gradients again)."""
    if model_name == "logreg":
        fwd = wgrad = 2.0 * n * d * k
        return fwd + wgrad, fwd + 2 * wgrad
    fwd = 2.0 * n * (d * hidden + hidden * k)
    wgrad = 2.0 * n * (d * hidden + hidden * k)
    dgrad = 2.0 * n * hidden * k  # delta1 = delta2 W2^T
    return fwd + dgrad + wgrad, fwd + 2 * (dgrad + wgrad)


def gemm_floor(model_name: str, x: np.ndarray, chunk_rows: int, repeats: int, hidden: int = 256) -> dict[str, float]:
    """Median seconds of our step's two large products alone (``x W`` and the weighted
    ``x^T delta``), same shapes and dtype: NumPy whole batch, NumPy in ``chunk_rows`` slices,
    and torch (its own BLAS, MKL in the PyPI wheels) whole batch, in the layouts of ``nn.Linear``."""
    n, d = x.shape
    w, delta, delta_t = product_operands(model_name, n, d, hidden)

    def numpy_whole() -> None:
        x @ w
        if model_name == "logreg":
            delta_t @ x  # (K, n) @ (n, d), the layout our logistic regression uses
        else:
            x.T @ delta

    steps: dict[str, Step] = {"numpy": (numpy_whole, lambda: None),
                              "numpy_sliced": products_floor_step(model_name, x, chunk_rows, hidden)}
    try:
        import torch

        xt, wt, dt = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(delta_t)

        def torch_whole() -> None:  # the layouts of torch's own nn.Linear forward and weight gradient
            xt @ wt
            dt @ xt

        steps["torch"] = (torch_whole, lambda: None)
    except ImportError:
        pass
    return {name: statistics.median(t) for name, t in time_interleaved(steps, repeats).items()}


def gemm_floor_gpu(model_name: str, n: int, d: int, repeats: int, hidden: int = 256) -> dict[str, float]:
    """Median seconds, timed with device events, of our step's two large products alone on the
    GPU in float32 (``x W`` and the weighted ``x^T delta``, shapes and layouts as
    :func:`gemm_floor`): CuPy (cuBLAS, no TF32, as our step runs) and torch on the same device
    (its default float32 precision, also no TF32)."""
    import cupy as cp  # type: ignore[import-not-found]

    floor = _time_gpu_products(cp, model_name, n, d, repeats, 10 if model_name == "logreg" else hidden)
    cp.get_default_memory_pool().free_all_blocks()  # the products' buffers, before the next model
    return floor


def _time_gpu_products(cp: Any, model_name: str, n: int, d: int, repeats: int, width: int) -> dict[str, float]:
    rng = cp.random.default_rng(1)
    x = rng.random((n, d), dtype=cp.float32)
    w = rng.standard_normal((d, width), dtype=cp.float32)
    delta = rng.standard_normal((n, width), dtype=cp.float32)
    delta_t = cp.ascontiguousarray(delta.T)

    def cupy_products() -> None:
        x @ w
        if model_name == "logreg":
            delta_t @ x
        else:
            x.T @ delta

    def timed(run: Callable[[], None]) -> float:
        run()
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        seconds = []
        for _ in range(repeats):
            start.record()
            run()
            stop.record()
            stop.synchronize()
            seconds.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
        return statistics.median(seconds)

    floor = {"cupy": timed(cupy_products)}
    try:
        import torch

        if torch.cuda.is_available():
            xt, wt, dt = (torch.as_tensor(a, device="cuda") for a in (x, w, delta_t))

            def torch_products() -> None:
                xt @ wt
                dt @ xt

            floor["torch"] = timed(torch_products)  # same stream: cupy's events time torch's kernels
    except ImportError:
        pass
    return floor


def peak_bandwidth(xp: Any, override_gbs: float | None) -> tuple[float | None, str]:
    if override_gbs:
        return override_gbs * 1e9, "given"
    props = xp.cuda.runtime.getDeviceProperties(xp.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    clock_khz, bus_bits = props.get("memoryClockRate", 0), props.get("memoryBusWidth", 0)
    if clock_khz and bus_bits:
        return 2.0 * clock_khz * 1e3 * bus_bits / 8.0, f"{name}, from the driver"
    for key, value in KNOWN_BANDWIDTH.items():
        if key in name:
            return value, f"{name}, datasheet"
    return None, f"{name}: unknown; pass --peak-bandwidth-gbs"


def measured_copy_bandwidth(xp: Any, nbytes: int = 2 << 30, repeats: int = 10) -> float:
    """Bytes/s of a device-to-device copy of ``nbytes`` (bytes read plus bytes written), the
    median of ``repeats`` copies timed with device events after one warm-up: the bandwidth this
    device reaches in practice, beside the datasheet's peak."""
    src = xp.ones(nbytes // 4, dtype=xp.float32)  # never zeros: compression could flatter them
    dst = xp.empty_like(src)
    xp.copyto(dst, src)
    start, stop = xp.cuda.Event(), xp.cuda.Event()
    seconds = []
    for _ in range(repeats):
        start.record()
        xp.copyto(dst, src)
        stop.record()
        stop.synchronize()
        seconds.append(xp.cuda.get_elapsed_time(start, stop) / 1e3)
    del src, dst
    xp.get_default_memory_pool().free_all_blocks()
    return 2.0 * nbytes / statistics.median(seconds)


def _count(text: str) -> int:
    """argparse type: an integer >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Time one full-batch DP-GD step against Opacus.")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--n", type=int, default=None, help="examples (default 200000 on cpu, 1000000 on gpu)")
    parser.add_argument("--features", type=int, default=784)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models", default="logreg,mlp")
    parser.add_argument("--chunk-rows", type=int, default=None, help="process the batch in slices (ours)")
    parser.add_argument("--skip-opacus", action="store_true")
    parser.add_argument("--gemm-floor", action="store_true",
                        help="also time our two large matrix products alone (NumPy and torch) and print FLOPs")
    parser.add_argument("--same-process", action="store_true",
                        help="time both sides in this process (default: each in a spawned process of its own)")
    parser.add_argument("--settle", type=float, default=0.5,
                        help="seconds of pause at the start of each turn in the process-isolated mode (default 0.5)")
    parser.add_argument("--warm-steps", type=_count, default=1,
                        help="untimed steps a side runs at the start of each of its turns (default 1)")
    parser.add_argument("--steps-per-call", type=int, default=1,
                        help="steps per timed call, reported per step (ours: one private_gd run of this many "
                             "steps, so a run's setup and its final read of the counts are paid once; default 1)")
    parser.add_argument("--peak-bandwidth-gbs", type=float, default=None, help="GPU peak memory bandwidth, GB/s")
    args = parser.parse_args(argv)
    if args.steps_per_call < 1:
        parser.error(f"--steps-per-call must be an integer >= 1, got {args.steps_per_call}")
    warnings.simplefilter("ignore", InsecureNoiseWarning)  # a seeded benchmark, not a release
    n = args.n or (200_000 if args.device == "cpu" else 1_000_000)
    if args.device == "gpu":
        from renyi_stream.stream.xp import gpu_available

        if not gpu_available():
            try:
                import cupy  # type: ignore[import-not-found]  # noqa: F401
                why = "CuPy is installed but sees no CUDA device"
            except ImportError:
                why = "CuPy is not installed (pip install '.[gpu]')"
            print(f"--device gpu needs CuPy and a CUDA device: {why}", file=sys.stderr)
            return 2
        import cupy as xp  # type: ignore[import-not-found]
    else:
        xp = np
    print(f"# DP-GD step, n={n:,}, d={args.features}, 10 classes, float32, device={args.device}; "
          f"{platform.machine()}, {platform.python_version()}, numpy {np.__version__}")
    chunk_rows = args.chunk_rows or default_chunk_rows(n, args.features, np.float32, xp)
    print(f"# ours: slices of {chunk_rows:,} rows ({'--chunk-rows' if args.chunk_rows else 'default_chunk_rows'}); "
          + ("both sides in this process; each turn: " if args.same_process else
             f"each side in a process of its own; each turn: {args.settle:g} s pause, ")
          + f"{args.warm_steps} untimed call(s), one timed call of {args.steps_per_call} step(s)")
    if args.device == "gpu":
        bw, where = peak_bandwidth(xp, args.peak_bandwidth_gbs)
        copy_bw = measured_copy_bandwidth(xp)
        print(f"# peak memory bandwidth: {'?' if bw is None else f'{bw / 1e9:,.0f} GB/s'} ({where}); "
              f"a device-to-device copy measured {copy_bw / 1e9:,.0f} GB/s (read + write)")
    header = "| model | ours s/step | ours examples/s | Opacus ghost s/step | Opacus examples/s | ratio |"
    if args.device == "gpu":
        header += " ours % of bandwidth bound (peak) | (measured copy) |"
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    sides = ["ours"] if args.skip_opacus else ["ours", "opacus"]
    if args.gemm_floor and args.device == "cpu":
        sides.append("floor")
    runs: list[str] = []
    for model_name in args.models.split(","):
        if args.same_process:
            timed = time_same_process(sides, model_name, n=n, features=args.features, device=args.device,
                                      chunk_rows=args.chunk_rows, repeats=args.repeats, warm_steps=args.warm_steps,
                                      steps_per_call=args.steps_per_call)
        else:
            timed = time_isolated(sides, model_name, n=n, features=args.features, device=args.device,
                                  chunk_rows=args.chunk_rows, repeats=args.repeats, settle=args.settle,
                                  warm_steps=args.warm_steps, steps_per_call=args.steps_per_call)
        timed = {side: [t / args.steps_per_call for t in times] if isinstance(times, list) else times
                 for side, times in timed.items()}  # seconds per step
        floor_runs = timed.pop("floor", None)
        theirs = timed.get("opacus", "skipped (--skip-opacus)")
        ours_runs = timed["ours"]
        assert isinstance(ours_runs, list)
        ours = statistics.median(ours_runs)
        label = "logistic regression" if model_name == "logreg" else "MLP (256 hidden)"
        if isinstance(theirs, str):
            row = f"| {label} | {ours:.4f} | {n / ours:,.0f} | {theirs} | - | - |"
        else:
            opacus = statistics.median(theirs)
            row = f"| {label} | {ours:.4f} | {n / ours:,.0f} | {opacus:.4f} | {n / opacus:,.0f} | {opacus / ours:.2f}x |"
        if args.device == "gpu":
            bound = (n * args.features * 4) / bw if bw else None
            row += f" {100 * bound / ours:.0f}% |" if bound else " ? |"
            row += f" {100 * (n * args.features * 4) / copy_bw / ours:.0f}% |"
        print(row, flush=True)
        runs.append(f"#   {label}, every timed step in order: " + "; ".join(
            f"{side} {', '.join(f'{t:.4f}' for t in times)}" for side, times in timed.items()
            if isinstance(times, list)))
        if isinstance(floor_runs, list):
            turn_ratios = [o / f for o, f in zip(ours_runs, floor_runs)]
            runs.append(f"#   {label}: our two large products alone, in our slices, timed in turns with the step: "
                        f"{', '.join(f'{t:.4f}' for t in floor_runs)} s (median {statistics.median(floor_runs):.4f}); "
                        f"ours / products: {ours / statistics.median(floor_runs):.3f}x of the medians, per turn "
                        f"{', '.join(f'{r:.3f}' for r in turn_ratios)} (median {statistics.median(turn_ratios):.3f}x; "
                        "issue 21's target: 1.15x)")
        gc.collect()
        if args.gemm_floor:
            ours_flops, opacus_flops = gemm_flops(model_name, n, args.features)
            flops = (f"#   {label}: matmul FLOPs ours {ours_flops / 1e9:.1f} G, Opacus ghost {opacus_flops / 1e9:.1f} G "
                     f"({opacus_flops / ours_flops:.2f}x)")
        if args.gemm_floor and args.device == "gpu":
            floor = gemm_floor_gpu(model_name, n, args.features, max(args.repeats, 20))
            products_flops = 2 * 2 * n * args.features * (10 if model_name == "logreg" else 256)
            line = (f"{flops}; our two large matmuls alone on the GPU (CuPy, float32): "
                    f"{floor['cupy'] * 1e3:.2f} ms ({products_flops / floor['cupy'] / 1e12:.1f} TFLOP/s)")
            if "torch" in floor:
                line += f"; the same in torch: {floor['torch'] * 1e3:.2f} ms"
            runs.append(line)
        if args.gemm_floor and args.device == "cpu":
            x, _ = synthetic_data(n, args.features)
            floor = gemm_floor(model_name, x, chunk_rows, args.repeats)
            del x
            line = (f"{flops}; our two large matmuls alone (NumPy): "
                    f"{floor['numpy']:.3f} s whole batch, {floor['numpy_sliced']:.3f} s in slices")
            if "torch" in floor:
                line += f"; the same in torch: {floor['torch']:.3f} s"
            runs.append(line)
    print("\n".join(runs), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
