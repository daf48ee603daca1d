"""Tests of cpbjax/training/early_stopping.py: early stopping's bar in standard errors of the val gain
(train.min_delta), per series and pooled, against plain loops."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cpbjax import models, sharding
from cpbjax.config import schema as config_lib
from cpbjax.training import early_stopping, epoch_spec
from cpbjax.training.group import GroupTrainer, coin_keys
from tests import helpers, references

Z = 1.0  # train.min_delta: the bar is best - Z standard errors of the gain
EPOCHS = 5


def _loop_se(values_by_position: list[list[float]], lag: int) -> float:
    """The Newey-West standard error of the mean of every value, by a double loop over
    positions: Var(sum) = sum over position pairs (n, m) within `lag` of each other of
    w(|n - m|) * dev_n * dev_m, with dev_n the position's sum minus its count x mean."""
    flat = [v for vs in values_by_position for v in vs]
    mean = sum(flat) / len(flat)
    dev = [sum(vs) - len(vs) * mean for vs in values_by_position]
    var = 0.0
    for n, dn in enumerate(dev):
        for m, dm in enumerate(dev):
            if abs(n - m) <= lag:
                var += (1 - abs(n - m) / (lag + 1)) * dn * dm
    return np.sqrt(max(var, 0.0)) / len(flat)


def test_newey_west_se_matches_a_double_loop_per_coin_and_pooled():
    rng = np.random.default_rng(0)
    k, n, lag = 3, 40, 4
    # Serially correlated differences, as overlapping windows give.
    d_KN = np.cumsum(rng.normal(size=(k, n)), axis=1).astype(np.float32) * 0.1
    mask_KN = np.arange(n)[None, :] < np.array([40, 33, 25])[:, None]  # padded at the end
    zeros = np.zeros_like(d_KN)
    got = early_stopping.gain_se(jnp.asarray(d_KN), jnp.asarray(zeros), jnp.asarray(mask_KN), lag)
    for i in range(k):
        positions = [[float(d_KN[i, j])] for j in range(n) if mask_KN[i, j]]
        assert float(got[i]) == pytest.approx(_loop_se(positions, lag), rel=1e-4)
    take_K = np.array([True, False, True])
    pooled = early_stopping.pooled_gain_se(
        jnp.asarray(d_KN), jnp.asarray(zeros), jnp.asarray(mask_KN), jnp.asarray(take_K), lag
    )
    positions = [
        [float(d_KN[i, j]) for i in range(k) if take_K[i] and mask_KN[i, j]] for j in range(n)
    ]
    assert float(pooled) == pytest.approx(_loop_se(positions, lag), rel=1e-4)
    # Without lags and with independent values it is the textbook std / sqrt(n).
    flat = d_KN[0]
    lag0 = early_stopping.gain_se(
        jnp.asarray(flat[None]), jnp.zeros((1, n)), jnp.ones((1, n), bool), 0
    )
    assert float(lag0[0]) == pytest.approx(np.std(flat) / np.sqrt(n), rel=1e-4)


def test_the_bar_in_standard_errors():
    best = jnp.array([1.0, jnp.inf, 2.0])
    se = jnp.array([0.1, 0.5, jnp.nan])
    bar = early_stopping.bar(2.0, best, se)
    assert float(bar[0]) == pytest.approx(0.8)
    assert float(bar[1]) == np.inf  # before any best, anything finite improves
    assert np.isnan(float(bar[2]))  # a NaN gain never counts as an improvement
    # min_delta 0 (the replaced system's): the bar is the best itself.
    assert np.asarray(early_stopping.bar(0.0, best[:2], se[:2])).tolist() == [1.0, np.inf]


def _trainer(share: str) -> GroupTrainer:
    """tiny_config's 3-series config with the bar at Z standard errors, the MAE loss with the
    persistence scale, and no baseline: on 300 synthetic candles the nets learn from
    scratch, so some epochs clear the bar and some gains fall short of it."""
    c = helpers.tiny_config()
    c.train.loss, c.train.loss_scale = "mae", "persistence"
    c.train.share, c.train.min_delta = share, Z
    c.train.epochs = c.train.patience = EPOCHS
    c = config_lib.validate(c)
    module = models.build(models.make_config(c))
    return GroupTrainer(epoch_spec.make_spec(c, module), 3, sharding.coin_mesh(jax.devices()[:1]))


def _window_losses(trainer, params, k, prep, scale_C):
    """Coin k's per-val-window scaled MAE under params [K, ...], numpy [N], one window at a
    time from numpy-sliced windows."""
    spec = trainer.spec
    x, y = references.anchored_windows(prep, prep.ends["val"], spec.lookback, spec.horizon)
    coin = jax.tree.map(lambda p: p[k], params)
    apply = jax.jit(lambda p, x: trainer.module.apply({"params": p}, x, None, train=False))
    y_hat = np.concatenate([np.asarray(apply(coin, x[i : i + 1])) for i in range(len(x))])
    return np.mean(np.abs(y_hat - y) / scale_C, axis=(1, 2))


def _reference_val_and_se(trainer, preps, scale_KC, before, after, share: str):
    """Per coin, the plain reference of one epoch's val loss (after.params) and the standard
    error of its paired gain over the best so far (before.best_params): per series, or one
    pooled figure for all three coins (the gains paired by window position)."""
    lag = trainer.spec.horizon - 1
    new = [_window_losses(trainer, after.params, k, p, scale_KC[k]) for k, p in enumerate(preps)]
    old = [
        _window_losses(trainer, before.best_params, k, p, scale_KC[k]) for k, p in enumerate(preps)
    ]
    if share == "series":
        se = [_loop_se([[v] for v in new[k] - old[k]], lag) for k in range(3)]
        val = [float(np.mean(v)) for v in new]
    else:
        n = max(len(v) for v in new)
        by_pos = [
            [float(new[k][j] - old[k][j]) for k in range(3) if j < len(new[k])] for j in range(n)
        ]
        se = [_loop_se(by_pos, lag)] * 3
        val = [float(np.mean(np.concatenate(new)))] * 3
    return val, se


@pytest.mark.parametrize("share", ["series", "pooled"])
def test_an_epoch_improves_only_by_more_than_z_standard_errors_of_its_paired_gain(share):
    trainer = _trainer(share)
    preps = list(helpers.tiny_preps())
    arrays = trainer.stack(preps)
    scale_KC = np.asarray(arrays.target_scale)
    state = trainer.init_state(coin_keys(0, range(3)), arrays)
    decisions = []
    for epoch in range(1, EPOCHS + 1):
        before = jax.device_get(state)
        state, metrics = trainer.run_epoch(state, arrays)
        after = jax.device_get(state)
        if not before.active.any():
            break
        val, se = _reference_val_and_se(trainer, preps, scale_KC, before, after, share)
        for k in range(3):
            if not before.active[k]:
                continue
            assert metrics["val_gain_se"][k] == pytest.approx(se[k], rel=2e-3, abs=1e-7)
            improved = val[k] < before.best_val[k] - Z * se[k]
            assert after.best_epoch[k] == (epoch if improved else before.best_epoch[k])
            decisions.append((improved, val[k] < before.best_val[k]))
    # Both kinds of decision were checked: epochs that cleared the bar after the first
    # (which clears inf), and lower val losses that the bar held back.
    print(share, decisions)
    assert any(improved for improved, _ in decisions[3:])
    assert any(lower and not improved for improved, lower in decisions)
