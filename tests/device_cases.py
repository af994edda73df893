"""The inputs the device-path tests run the kernels on, shared by ``test_device_path.py`` (the
strict array module, in CI) and ``test_gpu_kernels.py`` (real CuPy, on a GPU), so that both
check the same cases: rows of every kind the Gaussian charge treats apart, filter states with
free, infinite and rounding-edge charges, tracker states that spill over several filters, a
small seeded DP-GD run, and running-total releases."""

from __future__ import annotations

import contextlib
import math
import warnings
from typing import Any, Callable, ContextManager

import numpy as np

from renyi_stream.stream.noise import InsecureNoiseWarning
from renyi_stream.stream.training.budget import TrainingLedger
from renyi_stream.stream.training.dpgd import GDConfig, TrainResult, noise_multiplier_for, prepare_data, private_gd, training_generators
from renyi_stream.stream.training.stopping import AccuracyStopping

N, D, K = 240, 9, 3  # the DP-GD run's rows, features, classes
OVERFLOW_ROW = 17  # training_run(overflow=True): this user's features are 1e300, their squared norm inf


def contributions(d: int) -> np.ndarray:
    """64 rows of ``d`` values: zero, ordinary, overflowing, underflowing and subnormal."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, d)) * np.exp(rng.uniform(-8, 8, (64, 1)))
    x[0] = 0.0
    x[1] = 1e200  # squares overflow: the rescaled pass
    x[2] = 1e-170  # squares underflow: the subnormal pass
    x[3, 0] = 5e-324
    return x


def filter_inputs() -> tuple[np.ndarray, np.ndarray]:
    """``(used, charge)`` of 200 users against a cap of 1: free rows, an infinite charge, and a
    charge that fits only by rounding."""
    rng = np.random.default_rng(2)
    used = rng.uniform(0.0, 1.0, 200)
    charge = np.abs(rng.standard_normal(200)) * 0.4
    charge[:10] = 0.0  # free rows
    charge[10] = np.inf  # a charge past float64's range
    used[11], charge[11] = 0.5, math.nextafter(0.5, 1.0)  # fits only by rounding
    return used, charge


def tracker_state() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(segment, bound, charge)`` of 100 personal trackers with filter step 0.1."""
    rng = np.random.default_rng(3)
    segment = rng.uniform(0.0, 0.1, 100)
    bound = 0.1 + 0.1 * rng.integers(0, 3, 100)
    charge = np.abs(rng.standard_normal(100)) * 0.05
    charge[:10] = 0.0
    charge[10:20] = 1.0  # spills over several filters
    charge[20:30] = 0.1 - segment[20:30]  # fills the open filter to the hair
    return segment, bound, charge


def charged_ledger(xp: Any, *, validate: bool) -> tuple[TrainingLedger, list[Any]]:
    """A 300-row training ledger on ``xp`` charged five times (both policies, a slice of rows,
    zero norms): ``(ledger, the five charges' scales)``."""
    rng = np.random.default_rng(4)
    ledger = TrainingLedger.fresh(300, budget=2.0, xp=xp)
    scales = []
    for i in range(5):
        norms = np.abs(rng.standard_normal(300 if i < 3 else 100)) * (i + 1)
        norms[:7] = 0.0
        scales.append(ledger.charge(xp.asarray(norms), noise_std=1.3, policy="clip" if i % 2 else "drop",
                                    rows=None if i < 3 else slice(100, 200), validate=validate))
    return ledger, scales


def training_run(model: Any, xp: Any, *, filtering: bool, dtype: Any = np.float64, steps: int = 4,
                 stopping: AccuracyStopping | None = None, chunk_rows: int | None = None,
                 init_params: dict[str, Any] | None = None, ledger: TrainingLedger | None = None,
                 observe: Callable[[], ContextManager[Any]] = contextlib.nullcontext, overflow: bool = False,
                 ) -> tuple[TrainResult, TrainingLedger, Any]:
    """A seeded ``private_gd`` run of ``steps`` steps on ``N`` random rows, on ``xp``:
    ``(result, ledger, what observe() yielded around the run alone)``. ``overflow``: row
    ``OVERFLOW_ROW`` holds finite features whose gradient norm (and later logits) overflow."""
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((N, D)), rng.integers(0, K, N)
    if overflow:
        x[OVERFLOW_ROW] = 1e300
    data = prepare_data(x, y, n_classes=K, xp=xp, dtype=dtype)
    config = GDConfig(clip=0.7, noise_multiplier=noise_multiplier_for(steps=steps, rho=0.5), learning_rate=0.5,
                      steps=steps, filtering=filtering, norm_budget=0.49 * steps * 0.6 if filtering else None,
                      max_steps=steps + 2 if filtering else None)
    ledger = ledger if ledger is not None else TrainingLedger.fresh(N, budget=1.0, xp=xp)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureNoiseWarning)
        noise, queries = training_generators(6)
    with observe() as observed:
        result = private_gd(model, data, config=config, ledger=ledger, rng=noise, query_rng=queries, stopping=stopping,
                            chunk_rows=chunk_rows, normaliser=float(N), init_params=init_params,
                            init_rng=np.random.default_rng(7))
    return result, ledger, observed


def releases(strategy: Any, horizon: int, tail: tuple[int, ...] = (2, 3), seed: int = 12) -> list[np.ndarray]:
    """Random releases of ``strategy`` for windows ``0 .. horizon - 1``."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((strategy.rows_at(t), *tail)) for t in range(horizon)]
