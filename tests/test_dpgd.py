"""Private gradient descent, Feldman & Zrnic Algorithms 6 and 7, on the shared per-user ledger.

Each test states one property of the specification: the fast implementation against a textbook
one that materialises every per-example gradient, Algorithm 7 reproducing Algorithm 6 bit for bit
at ``B_norm = k C^2, k_max = k``, nobody ever passing their budget (streaming charges included),
the noise having the promised distribution, and the run refusing what it cannot honour.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import stats

from renyi_stream.stream.ledger import Ledger, Policy
from renyi_stream.stream.noise import InsecureNoiseWarning
from renyi_stream.stream.training.budget import TrainingLedger
from renyi_stream.stream.training.dpgd import (
    GDConfig,
    noise_multiplier_for,
    prepare_data,
    private_gd,
    run_budget_steps,
    training_generators,
)
from renyi_stream.stream.training.models import LogisticRegression, MLP, per_example_gradients_reference
from renyi_stream.stream.training.normaliser import count_noise_std, normaliser_from_count, private_count
from renyi_stream.stream.training.stopping import AccuracyStopping, private_accuracy

pytestmark = pytest.mark.filterwarnings("ignore::renyi_stream.stream.noise.InsecureNoiseWarning")

N, D, K = 120, 6, 3


def _data(seed: int = 0, n: int = N):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, D)) * rng.uniform(0.2, 3.0, size=(n, 1))  # gradient norms of all sizes
    y = rng.integers(0, K, size=n)
    return x, y


def _trajectory(model, data, config, ledger, seed=7, **kw):
    its, weights = [], []

    def keep(rep):
        its.append({k: v.copy() for k, v in rep.params.items()})
        weights.append(np.array(rep.weights))

    grad_rng, query_rng = training_generators(seed)
    result = private_gd(model, data, config=config, ledger=ledger, rng=grad_rng, query_rng=query_rng,
                        init_rng=np.random.default_rng(1), progress=keep, normaliser=data.n, **kw)
    return its, weights, result


def _textbook(model, x, y, *, config, budgets, seed=7):
    """Algorithms 6 and 7 as printed: per-example gradients one by one, clip, sum, noise, step.
    ``budgets``: each user's B_i (squared norm) for Algorithm 7, ignored for Algorithm 6."""
    grad_rng, _ = training_generators(seed)
    params = model.init_params(D, K, np.random.default_rng(1))
    spent = np.zeros(len(x))
    C, sigma = config.clip, config.noise_multiplier
    its = []
    for _ in range(config.total_steps):
        g = per_example_gradients_reference(model, params, x, y, K)
        norms = np.sqrt(sum((v.reshape(len(x), -1) ** 2).sum(axis=1) for v in g.values()))
        if config.filtering:
            bound = np.minimum(C, np.sqrt(np.maximum(budgets - spent, 0.0)))
        else:
            bound = np.full(len(x), C)
        factor = np.minimum(1.0, bound / np.maximum(norms, 1e-300))
        spent += (factor * norms) ** 2
        new = {}
        for k, p in params.items():
            noisy = np.tensordot(factor, g[k], axes=1) + grad_rng.standard_normal(p.shape) * sigma * C
            new[k] = p - config.learning_rate * noisy / len(x)
        params = new
        its.append(params)
    return its


MODELS = [LogisticRegression(), MLP(5)]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
@pytest.mark.parametrize("clip", [0.5, 1.5, 0.1])
def test_algorithm_7_with_b_norm_k_c2_and_k_max_k_reproduces_algorithm_6_bit_for_bit(model, clip):
    x, y = _data()
    data = prepare_data(x, y, n_classes=K)
    k, rho = 12, 0.05
    sigma = noise_multiplier_for(steps=k, rho=rho)
    alg6 = GDConfig(clip=clip, noise_multiplier=sigma, learning_rate=2.0, steps=k)
    alg7 = GDConfig(clip=clip, noise_multiplier=sigma, learning_rate=2.0, steps=k, filtering=True,
                    norm_budget=k * clip * clip, max_steps=k)
    l6, l7 = TrainingLedger.fresh(N, budget=rho), TrainingLedger.fresh(N, budget=rho)
    its6, w6, r6 = _trajectory(model, data, alg6, l6)
    its7, w7, r7 = _trajectory(model, data, alg7, l7)
    assert len(its6) == len(its7) == k
    for a, b in zip(its6, its7):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])
    for a, b in zip(w6, w7):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(l6.used, l7.used)
    assert r7.curator["budget_bound"] == [0] * k  # the filter never bound below C
    assert r6.rho == pytest.approx(rho, rel=1e-7) and r6.rho <= rho


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_algorithm_6_matches_the_textbook_algorithm(model):
    x, y = _data(1)
    data = prepare_data(x, y, n_classes=K)
    config = GDConfig(clip=1.0, noise_multiplier=noise_multiplier_for(steps=6, rho=0.1), learning_rate=1.5, steps=6)
    its, _, _ = _trajectory(model, data, config, TrainingLedger.fresh(N, budget=0.1))
    ref = _textbook(model, x, y, config=config, budgets=None)
    for a, b in zip(its, ref):
        for name in a:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_algorithm_7_matches_the_textbook_algorithm_past_b_norm_over_c2_steps(model):
    x, y = _data(2)
    data = prepare_data(x, y, n_classes=K)
    sigma = 3.0
    config = GDConfig(clip=1.0, noise_multiplier=sigma, learning_rate=1.5, steps=4, filtering=True,
                      norm_budget=4.0, max_steps=15)
    ledger = TrainingLedger.fresh(N, budget=1.0)  # plenty: the run's own B_norm binds
    its, _, result = _trajectory(model, data, config, ledger)
    ref = _textbook(model, x, y, config=config, budgets=np.full(N, 4.0))
    # Not bit-identical: sqrt(B - spent) cancels when a user's budget is nearly gone, so the
    # two orders of float operations differ there in the 8th digit.
    for a, b in zip(its, ref):
        for name in a:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-6, atol=1e-9)
    assert sum(result.curator["exhausted"]) > 0  # some users were filtered out: the test means something
    assert (ledger.used <= config.rho * (1 + 1e-9)).all()


def test_no_user_passes_the_budget_after_streaming_charges_and_a_long_filtered_run():
    x, y = _data(3)
    ids = np.arange(N, dtype=np.int64) * 3 + 11
    kappa = 0.02
    ledger = Ledger(budget=kappa)
    rng = np.random.default_rng(4)
    for day in range(5):  # daily releases: some users spend a lot, some nothing, a few everything
        who = rng.choice(ids, size=N // 2, replace=False)
        ledger.admit(who, rng.uniform(0, 3, size=(who.size, 2)), noise_std=12.0, policy=Policy.CLIP)
    before = ledger.used(ids)
    assert before.max() == pytest.approx(kappa, rel=1e-6) and (before == 0).any()
    view = TrainingLedger.from_ledger(ledger, ids)
    data = prepare_data(x, y, n_classes=K)
    k = 20
    sigma = noise_multiplier_for(steps=k, rho=kappa)
    config = GDConfig(clip=1.0, noise_multiplier=sigma, learning_rate=1.0, steps=k, filtering=True, max_steps=4 * k)
    model = LogisticRegression()
    its, weights, _ = _trajectory(model, data, config, view)
    merged = view.merged_ledger()
    after = merged.used(ids)
    assert (after <= kappa).all()
    # Re-derive each user's training charge from the textbook per-example gradients and the
    # weights the run applied: it must fit in what the user had left before training.
    init = model.init_params(D, K, np.random.default_rng(1))
    charged = np.zeros(N)
    for params, w in zip([init] + its[:-1], weights):
        g = per_example_gradients_reference(model, params, x, y, K)
        sq = sum((v.reshape(N, -1) ** 2).sum(axis=1) for v in g.values())
        charged += w * w * sq / (2 * (sigma * config.clip) ** 2)
    assert (charged <= kappa - before + 1e-12 * kappa).all()
    np.testing.assert_allclose(after - before, charged, rtol=1e-6, atol=1e-12 * kappa)
    # Users the daily releases exhausted contributed nothing to any step.
    exhausted = before >= kappa * (1 - 1e-6)
    assert exhausted.any() and all((w[exhausted] == 0).all() for w in weights)


def test_users_with_less_budget_left_get_a_smaller_run_budget():
    ledger = Ledger(budget=1.0)
    ledger.admit(np.array([1, 2]), np.array([[0.0], [2.0]]), noise_std=2.0)  # user 2 spends 0.5
    view = TrainingLedger.from_ledger(ledger, np.array([1, 2, 3]))
    config = GDConfig(clip=1.0, noise_multiplier=noise_multiplier_for(steps=10, rho=1.0), learning_rate=1.0,
                      steps=10, filtering=True)
    b = run_budget_steps(config, view, reserve=0.0)
    assert b[0] == b[2] == 10.0  # untouched users: the full k C^2 / C^2
    assert b[1] == pytest.approx(5.0, rel=1e-6)  # half the budget gone: half the steps at C


def test_the_noise_is_gaussian_with_std_sigma_c_on_the_summed_gradient():
    x, y = _data(5, n=60)
    data = prepare_data(x, y, n_classes=K)
    model = LogisticRegression()
    config = GDConfig(clip=0.7, noise_multiplier=4.0, learning_rate=1.0, steps=1)
    its, weights, _ = _trajectory(model, data, config, TrainingLedger.fresh(60, budget=10.0), seed=11)
    init = model.init_params(D, K, np.random.default_rng(1))
    g = per_example_gradients_reference(model, init, x, y, K)
    residual = []
    for name, p in its[0].items():
        clipped_sum = np.tensordot(weights[0], g[name], axes=1)
        noise = (init[name] - p) * 60 / config.learning_rate - clipped_sum
        residual.append(noise.ravel())
    z = np.concatenate(residual) / (config.noise_multiplier * config.clip)
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert abs(z.std() - 1.0) < 0.35


def test_every_clipped_gradient_has_norm_at_most_c():
    x, y = _data(6)
    x[:10] *= 100.0  # huge gradients
    data = prepare_data(x, y, n_classes=K)
    model = MLP(4)
    config = GDConfig(clip=0.3, noise_multiplier=2.0, learning_rate=0.5, steps=3)
    its, weights, _ = _trajectory(model, data, config, TrainingLedger.fresh(N, budget=10.0))
    init = model.init_params(D, K, np.random.default_rng(1))
    for params, w in zip([init] + its[:-1], weights):
        g = per_example_gradients_reference(model, params, x, y, K)
        norms = np.sqrt(sum((v.reshape(N, -1) ** 2).sum(axis=1) for v in g.values()))
        assert (w * norms <= 0.3 * (1 + 1e-12)).all()
        assert (w[norms <= 0.3 * (1 - 1e-9)] == 1.0).all()  # small gradients untouched


def test_chunked_and_whole_batch_runs_agree():
    x, y = _data(7)
    data = prepare_data(x, y, n_classes=K)
    config = GDConfig(clip=1.0, noise_multiplier=3.0, learning_rate=1.0, steps=4, filtering=True, max_steps=8)
    whole, _, _ = _trajectory(MLP(5), data, config, TrainingLedger.fresh(N, budget=0.5))
    parts, _, _ = _trajectory(MLP(5), data, config, TrainingLedger.fresh(N, budget=0.5), chunk_rows=33)
    for a, b in zip(whole, parts):
        for name in a:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-10, atol=1e-12)


def test_float32_runs_track_float64():
    x, y = _data(8)
    config = GDConfig(clip=1.0, noise_multiplier=3.0, learning_rate=1.0, steps=5)
    a, _, _ = _trajectory(LogisticRegression(), prepare_data(x, y, n_classes=K), config, TrainingLedger.fresh(N, budget=1.0))
    b, _, _ = _trajectory(LogisticRegression(), prepare_data(x, y, n_classes=K, dtype=np.float32), config,
                          TrainingLedger.fresh(N, budget=1.0))
    assert b[-1]["W"].dtype == np.float32
    np.testing.assert_allclose(a[-1]["W"], b[-1]["W"], rtol=1e-3, atol=1e-4)


def test_the_same_seed_gives_the_same_model_and_a_seed_warns():
    x, y = _data(9)
    data = prepare_data(x, y, n_classes=K)
    config = GDConfig(clip=1.0, noise_multiplier=3.0, learning_rate=1.0, steps=3)
    a, _, _ = _trajectory(LogisticRegression(), data, config, TrainingLedger.fresh(N, budget=1.0), seed=3)
    b, _, _ = _trajectory(LogisticRegression(), data, config, TrainingLedger.fresh(N, budget=1.0), seed=3)
    np.testing.assert_array_equal(a[-1]["W"], b[-1]["W"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InsecureNoiseWarning, match="not private"):
            training_generators(3)
        g1, _ = training_generators(None)
        g2, _ = training_generators(None)
    assert g1.standard_normal() != g2.standard_normal()


def test_the_stopping_rule_queries_at_appendix_a_steps_and_keeps_the_best_iterate():
    x, y = _data(10)
    data = prepare_data(x, y, n_classes=K)
    kappa, k = 0.05, 10
    stopping = AccuracyStopping.with_reserve(first_step=AccuracyStopping.after_budget_steps(k), rho=0.1 * kappa)
    sigma = noise_multiplier_for(steps=k, rho=0.9 * kappa)
    config = GDConfig(clip=1.0, noise_multiplier=sigma, learning_rate=2.0, steps=k, filtering=True)
    ledger = TrainingLedger.fresh(N, budget=kappa)
    its, _, result = _trajectory(LogisticRegression(), data, config, ledger, stopping=stopping)
    assert stopping.query_steps == (10, 15, 20, 25, 30, 35, 40, 45)  # 8 queries, 5 apart, from B_norm / C^2
    assert [s for s, _ in result.accuracy_queries] == list(stopping.query_steps)
    assert result.steps_run == 45 == len(its)
    best_step = max(result.accuracy_queries, key=lambda q: q[1])[0]
    assert result.chosen_step == best_step
    for name in result.params:
        np.testing.assert_array_equal(result.params[name], its[best_step - 1][name])
    assert (ledger.used <= kappa).all()
    assert result.rho == pytest.approx(kappa, rel=1e-6) and result.rho <= kappa


def test_an_accuracy_query_charges_correct_users_only_and_drops_users_without_budget():
    ledger = TrainingLedger.fresh(4, budget=1.0)
    ledger.charge(np.array([0.0, 0.0, 0.0, 10.0]), noise_std=1.0, policy=Policy.CLIP)  # user 3 spends all
    correct = np.array([True, False, True, True])
    value = private_accuracy(correct, ledger, noise_std=1.0, rng=np.random.default_rng(0), normaliser=4)
    noise = np.random.default_rng(0).normal(0.0, 1.0)
    assert value == pytest.approx((2 + noise) / 4)  # user 3 is dropped: no budget left for 1 / (2 s^2)
    assert ledger.used[1] == 0.0  # misclassified: charged nothing (individual accounting)
    assert ledger.used[0] == pytest.approx(0.5) and ledger.used[0] >= 0.5  # 1 / (2 s^2), rounded up
    assert ledger.used[3] <= ledger.cap


def test_a_run_that_would_overspend_the_ledger_is_refused_before_any_charge():
    x, y = _data(11)
    data = prepare_data(x, y, n_classes=K)
    ledger = TrainingLedger.fresh(N, budget=0.01)
    config = GDConfig(clip=1.0, noise_multiplier=1.0, learning_rate=1.0, steps=10)  # 10 / 2 = 5 zCDP
    with pytest.raises(ValueError, match=r"needs 5 zCDP per user .* more than the ledger budget kappa=0.01"):
        private_gd(LogisticRegression(), data, config=config, ledger=ledger, rng=np.random.default_rng(0),
                   normaliser=N)
    assert (ledger.used == 0).all()
    with pytest.raises(ValueError, match="same rows"):
        private_gd(LogisticRegression(), data, config=config, ledger=TrainingLedger.fresh(3, budget=9.0),
                   rng=np.random.default_rng(0), normaliser=N)


@pytest.mark.parametrize("kwargs, message", [
    ({"clip": 0.0}, "clip must be > 0, got clip=0.0"),
    ({"noise_multiplier": -1.0}, "noise_multiplier must be > 0, got noise_multiplier=-1.0"),
    ({"learning_rate": float("nan")}, "learning_rate must be finite"),
    ({"steps": 0}, "steps must be an integer >= 1, got steps=0"),
    ({"norm_budget": 4.0}, "norm_budget is a parameter of Algorithm 7"),
    ({"max_steps": 9}, "max_steps is a parameter of Algorithm 7"),
    ({"filtering": True, "norm_budget": -2.0}, "norm_budget must be > 0, got norm_budget=-2.0"),
])
def test_configuration_errors_name_the_parameter_and_the_value(kwargs, message):
    base = {"clip": 1.0, "noise_multiplier": 1.0, "learning_rate": 1.0, "steps": 3}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        GDConfig(**{**base, **kwargs})


def test_privacy_of_a_configuration_follows_propositions_5_1_and_5_2():
    alg6 = GDConfig(clip=2.0, noise_multiplier=5.0, learning_rate=1.0, steps=30)
    assert alg6.rho == pytest.approx(30 / (2 * 25))  # k / (2 sigma^2)
    alg7 = GDConfig(clip=2.0, noise_multiplier=5.0, learning_rate=1.0, steps=30, filtering=True,
                    norm_budget=200.0, max_steps=1000)
    assert alg7.rho == pytest.approx(200 / (2 * 25 * 4))  # B_norm / (2 sigma^2 C^2), whatever k_max
    assert noise_multiplier_for(steps=30, rho=0.6) == pytest.approx(math.sqrt(30 / 1.2), rel=1e-7)


def test_training_ledger_charges_exactly_as_the_streaming_ledger_does():
    ids = np.array([5, 9, 2, 7])
    ledger = Ledger(budget=0.3)
    view = TrainingLedger.from_ledger(Ledger(budget=0.3), ids)
    rng = np.random.default_rng(12)
    for _ in range(30):
        c = rng.uniform(0, 1.2, size=4)
        expected = ledger.admit(ids, c[:, None], noise_std=1.5, policy=Policy.CLIP)
        scale = view.charge(c, noise_std=1.5, policy=Policy.CLIP)
        np.testing.assert_allclose(scale * c, expected.contributions[:, 0], rtol=1e-15)
        np.testing.assert_array_equal(view.used, ledger.used(ids))
    assert (expected.status == 2).any()  # by the end some users were dropped: the cap was reached
    merged = view.merged_ledger()
    np.testing.assert_array_equal(merged.used(ids), ledger.used(ids))
    np.testing.assert_array_equal(merged.personal_odometer(ids), ledger.personal_odometer(ids))


def test_training_ledger_refuses_repeated_or_mistyped_ids():
    with pytest.raises(ValueError, match="distinct: one training row per user.*got user id 4"):
        TrainingLedger.from_ledger(Ledger(budget=1.0), np.array([1, 4, 4]))
    with pytest.raises(ValueError, match="must be strings for a string ledger"):
        TrainingLedger.from_ledger(Ledger(budget=1.0, id_type="string"), np.array([1, 2]))
    view = TrainingLedger.from_ledger(Ledger(budget=1.0, id_type="string"), ["a", "b"])
    view.charge(np.array([1.0, 0.0]), noise_std=1.0)
    assert view.merged_ledger().used(["a", "b"])[0] > 0


def test_the_update_divides_by_the_normaliser_so_a_row_without_budget_changes_no_iterate():
    """Add/remove-one-user neighbours: the number of rows is private, so it must not enter the
    update. A user with no budget left contributes nothing, and adding their row changes nothing."""
    x, y = _data(13)
    kappa, k = 0.05, 6
    stopping = AccuracyStopping.with_reserve(first_step=k, rho=0.1 * kappa, queries=2, every=2)
    config = GDConfig(clip=1.0, noise_multiplier=noise_multiplier_for(steps=k, rho=0.9 * kappa), learning_rate=2.0,
                      steps=k, filtering=True)
    runs = []
    for rows in (N, N + 1):
        ledger = TrainingLedger.fresh(rows, budget=kappa)
        if rows > N:  # the added user spent everything in earlier releases
            ledger.charge(np.r_[np.zeros(N), 1e6], noise_std=1.0, policy=Policy.CLIP)
        extra_x, extra_y = np.vstack([x, 5.0 * np.ones((1, D))]), np.r_[y, 0]
        data = prepare_data(extra_x[:rows], extra_y[:rows], n_classes=K)
        grad_rng, query_rng = training_generators(7)
        runs.append(private_gd(LogisticRegression(), data, config=config, ledger=ledger, rng=grad_rng,
                               query_rng=query_rng, stopping=stopping, init_rng=np.random.default_rng(1),
                               normaliser=100.0))
    for name in runs[0].params:
        np.testing.assert_allclose(runs[0].final_params[name], runs[1].final_params[name], rtol=1e-12, atol=1e-15)
    assert [s for s, _ in runs[0].accuracy_queries] == [s for s, _ in runs[1].accuracy_queries] == [6, 8]
    np.testing.assert_allclose([a for _, a in runs[0].accuracy_queries], [a for _, a in runs[1].accuracy_queries],
                               rtol=1e-12)


@pytest.mark.parametrize("normaliser", [0.0, -3.0, float("nan")])
def test_a_normaliser_that_is_not_positive_is_refused_naming_it(normaliser):
    x, y = _data(14)
    config = GDConfig(clip=1.0, noise_multiplier=3.0, learning_rate=1.0, steps=2)
    with pytest.raises(ValueError, match="normaliser must be"):
        private_gd(LogisticRegression(), prepare_data(x, y, n_classes=K), config=config,
                   ledger=TrainingLedger.fresh(N, budget=1.0), rng=np.random.default_rng(0), normaliser=normaliser)


def test_the_noisy_count_charges_each_user_once_and_drops_users_without_budget():
    ledger = TrainingLedger.fresh(5, budget=1.0)
    ledger.charge(np.array([0.0, 0.0, 0.0, 0.0, 10.0]), noise_std=1.0, policy=Policy.CLIP)  # user 4 spends all
    std = count_noise_std(0.02)
    assert 1.0 / (2.0 * std**2) <= 0.02 and std == pytest.approx(5.0, rel=1e-7)  # sqrt(1 / (2 rho))
    value = private_count(ledger, noise_std=std, rng=np.random.default_rng(3))
    assert value == pytest.approx(4 + np.random.default_rng(3).normal(0.0, std))  # user 4 is left out
    assert ledger.used[:4] == pytest.approx([1.0 / (2.0 * std**2)] * 4) and ledger.used[4] <= ledger.cap
    assert normaliser_from_count(-7.5) == 1.0 and normaliser_from_count(250.5) == 250.5


# --- one user's overflow never stops the others (issue 28) ---------------------------------------


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_a_users_1e308_feature_drops_them_uncharged_and_the_others_train_as_without_them(model):
    """Their squared norm (and, once the weights move, their logits) overflow at every step: they are
    dropped from each step, charged nothing, counted, and masked out of the sum before it is taken.
    The others' model is the one trained without that user up to rounding, not bit for bit: the
    products sum over one more row (an exact zero), which can change BLAS's blocking and so the
    order of its sums (observed: 3e-16 relative)."""
    x, y = _data(20)
    bad, k = 17, 5
    x[bad, 2] = 1e308
    config = GDConfig(clip=1.0, noise_multiplier=3.0, learning_rate=2.0, steps=k, filtering=True)
    runs = []
    for rows in (np.arange(N), np.delete(np.arange(N), bad)):
        ledger = TrainingLedger.fresh(rows.size, budget=1.0)
        grad_rng, query_rng = training_generators(7)
        result = private_gd(model, prepare_data(x[rows], y[rows], n_classes=K), config=config, ledger=ledger,
                            rng=grad_rng, query_rng=query_rng, init_rng=np.random.default_rng(1), normaliser=100.0)
        runs.append((result, ledger))
    (with_, ledger_with), (without, ledger_without) = runs
    assert with_.curator["not_finite"] == [1] * k and without.curator["not_finite"] == [0] * k
    assert ledger_with.used[bad] == 0.0
    np.testing.assert_allclose(np.delete(ledger_with.used, bad), ledger_without.used, rtol=1e-12)
    for name, value in with_.final_params.items():
        assert np.isfinite(value).all()
        np.testing.assert_allclose(value, without.final_params[name], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_the_run_diverged_is_raised_when_every_users_gradient_is_not_finite(model):
    """An absurd learning rate: the parameters overflow after the first step, and from then on
    nobody's gradient is finite. That is the model diverging for everybody, not one user's data."""
    x, y = _data(21)
    config = GDConfig(clip=1.0, noise_multiplier=2.0, learning_rate=1e308, steps=5)
    ledger = TrainingLedger.fresh(N, budget=10.0)
    with pytest.raises(ValueError, match=r"the run diverged: per-example gradient norms were NaN at 4 step\(s\), "
                                         r"first at step 2, for every user .*; the parameters were not finite "
                                         r"after step 1; lower learning_rate"):
        private_gd(model, prepare_data(x, y, n_classes=K), config=config, ledger=ledger,
                   rng=np.random.default_rng(3), init_rng=np.random.default_rng(1), normaliser=1.0)
    assert (ledger.used <= ledger.cap).all()


def test_prepare_data_requires_declared_classes_and_never_reads_them_off_the_labels():
    x, y = _data(22)
    assert prepare_data(x, y, n_classes=7).onehot_t.shape == (7, N)  # labels 0..2, 7 classes declared
    for bad in (1, 0, 2.0, True, None):
        with pytest.raises(ValueError, match=f"n_classes must be an integer >= 2, got n_classes={bad!r}"):
            prepare_data(x, y, n_classes=bad)
    with pytest.raises(TypeError, match="n_classes"):
        prepare_data(x, y)  # no default from the labels


def test_a_step_where_the_only_users_gradient_overflows_is_counted_not_refused():
    # One user whose finite but huge features overflow the gradient: with them alone in the run,
    # refusing would make whether a model comes out hinge on that user's data (issue 37, item 1).
    x = np.full((1, D), 1e300)
    y = np.zeros(1, dtype=np.int64)
    config = GDConfig(clip=1.0, noise_multiplier=2.0, learning_rate=0.1, steps=3)
    ledger = TrainingLedger.fresh(1, budget=10.0)
    result = private_gd(LogisticRegression(), prepare_data(x, y, n_classes=K), config=config, ledger=ledger,
                        rng=np.random.default_rng(3), init_rng=np.random.default_rng(1), normaliser=1.0)
    assert result.curator["not_finite"] == [1, 1, 1]
    assert ledger.used[0] == 0.0 and all(np.isfinite(p).all() for p in result.final_params.values())
