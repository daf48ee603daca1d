"""Tests of the accuracy levers: train.loss and loss_scale, model.baseline, intervals.

References are independent: numpy loops for the losses, baselines.py (float64 numpy) for
the volatility band, and a separate forward pass for the untrained val loss.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cpbjax import band, models, sharding
from cpbjax.config import schema as config_lib
from cpbjax.config_rules import ConfigError
from cpbjax.data import stacking
from cpbjax.score import intervals
from cpbjax.training import epoch_spec, losses
from cpbjax.training.group import GroupTrainer, coin_keys
from tests import references
from tests.helpers import levers_config, levers_init_params, levers_preps, random_window

LEVELS = (0.1, 0.5, 0.9)


def _forward(module):
    """module.apply(params, x) as one compiled program: op by op, a transformer's forward
    pass compiles each of its hundreds of ops on its own, which costs seconds."""
    return jax.jit(lambda params, x: module.apply({"params": params}, x, None, train=False))


# -- losses against numpy loops ----------------------------------------------------------


def _loop_loss(kind, y_hat, y, scale):
    b, h, c = y.shape
    out = np.zeros(b)
    for i in range(b):
        total = 0.0
        for j in range(h):
            for k in range(c):
                r = (y_hat[i, j, k] - y[i, j, k]) / scale[k]
                total += {
                    "mse": r * r,
                    "mae": abs(r),
                }[kind]
        out[i] = total / (h * c)
    return out


@pytest.mark.parametrize("kind", losses.LOSSES)
@pytest.mark.parametrize("scaled", [False, True])
def test_window_loss_matches_a_loop(kind, scaled):
    rng = np.random.default_rng(0)
    y = rng.normal(size=(5, 3, 4)).astype(np.float32)
    y_hat = (rng.normal(size=(5, 3, 4)) * 2).astype(np.float32)
    scale = np.array([0.5, 2.0, 1.5, 0.25], np.float32) if scaled else np.ones(4, np.float32)
    got = losses.window_loss(kind, y_hat, y, jnp.asarray(scale) if scaled else None)
    want = _loop_loss(kind, y_hat, y, scale)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)


def test_persistence_scale_is_the_persistence_mae_of_each_column():
    prep, horizon = levers_preps()[0], levers_config().data.horizon
    got = stacking.persistence_scale(prep, horizon)
    errs = [[], [], [], []]
    for t in prep.ends["train"]:
        for h in range(1, horizon + 1):
            for c in range(4):
                errs[c].append(abs(prep.targets[t + h, c] - prep.targets[t, 3]))
    np.testing.assert_allclose(got, [np.mean(e) for e in errs], rtol=1e-5)


def test_persistence_scale_keeps_the_bits_of_the_plain_expression():
    horizon = levers_config().data.horizon
    for prep in levers_preps():
        got = stacking.persistence_scale(prep, horizon)
        assert got.tobytes() == references.reference_persistence_scale(prep, horizon).tobytes()


# -- the baseline inside the model --------------------------------------------------------


@pytest.mark.parametrize(
    "name, window_scale, ensemble",
    [("gru", "none", 1), ("transformer", "range", 1), ("transformer", "range", 3)],
)
def test_an_untrained_model_is_the_fitted_volatility_band_exactly(name, window_scale, ensemble):
    cfg = levers_config(name, window_scale=window_scale, ensemble=ensemble)
    prep, lookback, horizon = levers_preps()[0], cfg.data.lookback, cfg.data.horizon
    band_H2 = stacking.band_factors(prep, lookback, horizon)
    module, params = levers_init_params(cfg, prep, band_H2)
    ends_N = prep.ends["val"]
    x, _ = stacking.gather(stacking.window_source(prep), ends_N, lookback, horizon)
    y_hat = np.asarray(_forward(module)(params, x), np.float64)
    # The float64 numpy baseline, fitted on the train windows only.
    fit = band.fit_vol_band(prep.ohlc, prep.ends["train"], lookback, horizon)
    high, low = band.vol_band_predict(fit, prep.ohlc, ends_N, lookback)
    close_N1 = prep.ohlc[ends_N, 3][:, None]
    np.testing.assert_array_equal(y_hat[..., [0, 3]], 0.0)  # persistence: the last close
    np.testing.assert_allclose(y_hat[..., 1], np.log(high / close_N1), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(y_hat[..., 2], np.log(low / close_N1), rtol=1e-4, atol=1e-7)


def _moved_params(module, x):
    """Params of a trained-looking model: every one moved from its init, the zero-init
    head included, so the head's correction is there and not only the band."""
    params = module.init(jax.random.PRNGKey(0), jnp.asarray(x, jnp.float32))["params"]
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
    moved = [p + 0.3 * jax.random.normal(k, p.shape) for p, k in zip(leaves, keys, strict=True)]
    return jax.tree.unflatten(tree, moved)


@pytest.mark.parametrize("name", ["gru", "lstm", "transformer"])
@pytest.mark.parametrize("window_scale", ["range", "none"])
def test_window_scale_range_makes_forecasts_scale_equivariant(name, window_scale):
    """Windows whose price moves are 3x larger get forecasts 3x larger with
    window_scale=range (prices in range units in, the output times the range out), and not
    without it. The non-price column (rsi) stays as it is; bb_upper, a price, is column 5."""
    run = levers_config(name, window_scale=window_scale)
    run.data.features = ("open", "high", "low", "close", "rsi", "bb_upper")
    cfg = models.make_config(run)
    assert cfg.price_columns == (0, 1, 2, 3, 5)
    module, rng = models.build(cfg), np.random.default_rng(4)
    x = random_window(rng, cfg)
    x[..., 4] = rng.normal(size=x.shape[:2])
    params = _moved_params(module, x)
    x3 = x.copy()
    x3[..., cfg.price_columns] *= 3.0
    forward = _forward(module)
    y, y3 = (np.asarray(forward(params, jnp.asarray(v, jnp.float32)), np.float64) for v in (x, x3))
    assert np.abs(y).max() > 1e-3
    equivariant = np.allclose(y3, 3.0 * y, rtol=1e-3, atol=1e-6)
    assert equivariant == (window_scale == "range")


# -- intervals against loops -----------------------------------------------------------------


def test_band_quantile_factors_minimise_the_pinball_loss():
    prep, lookback, horizon = levers_preps()[0], 30, 10
    ends = prep.ends["train"]
    k = intervals.fit_band_quantiles(prep.ohlc, ends, lookback, horizon, LEVELS)
    sigma = band.ewma_range(prep.ohlc, ends, lookback)
    ratios = band.future_log_ratios(prep.ohlc, ends, horizon)
    for h, c, j in [(0, 1, 0), (4, 3, 1), (9, 2, 2)]:

        def loss(kk, h=h, c=c, j=j):
            r = kk * sigma - ratios[:, h, c]
            return np.sum(np.maximum(-r * LEVELS[j], r * (1 - LEVELS[j])))

        best = loss(k[h, c, j])
        for delta in (1e-3, -1e-3, 0.05, -0.05):
            assert best <= loss(k[h, c, j] + delta) + 1e-12


def test_interval_scores_match_a_loop():
    rng = np.random.default_rng(4)
    actual = rng.normal(size=(40, 3))
    pred = np.sort(rng.normal(size=(40, 3, 3)), axis=-1)
    band = np.sort(rng.normal(size=(40, 3, 3)), axis=-1)
    other = np.sort(rng.normal(size=(40, 3, 3)), axis=-1)
    losses = {
        name: intervals._band_loss(actual, b, LEVELS)
        for name, b in (("band", band), ("scaled_band", other))
    }
    got = intervals._column(actual, pred, losses, LEVELS)
    inside = [[pred[n, h, 0] <= actual[n, h] <= pred[n, h, 2] for h in range(3)] for n in range(40)]
    assert got["coverage"] == pytest.approx(np.mean(inside))

    def loop_pinball(p):
        total = 0.0
        for n in range(40):
            for h in range(3):
                for j, q in enumerate(LEVELS):
                    r = p[n, h, j] - actual[n, h]
                    total += max(-r * q, r * (1 - q))
        return total / (40 * 3 * 3)

    assert got["pinball"] == pytest.approx(loop_pinball(pred))
    assert got["skill_vs_band"] == pytest.approx(1 - loop_pinball(pred) / loop_pinball(band))
    assert got["scaled_band_pinball"] == pytest.approx(loop_pinball(other))
    assert got["skill_vs_scaled_band"] == pytest.approx(
        1 - loop_pinball(pred) / loop_pinball(other)
    )
    assert got["width"] == pytest.approx(np.mean(pred[..., 2] - pred[..., 0]))


# -- training starts from the baseline -------------------------------------------------------


def test_the_untrained_val_loss_is_the_one_to_beat():
    cfg = levers_config()
    cfg.train.learning_rate = 5.0  # so large that some coin's first epoch is worse
    module = models.build(models.make_config(cfg))
    trainer = GroupTrainer(
        epoch_spec.make_spec(cfg, module), 2, sharding.coin_mesh(jax.devices()[:1])
    )
    arrays = trainer.stack(list(levers_preps()))
    state = trainer.init_state(coin_keys(0, [0, 1]), arrays)
    assert np.isinf(np.asarray(state.best_val)).all()  # the first epoch sets the bar
    init_params = jax.device_get(state.params)
    untrained_val = []
    for i, prep in enumerate(levers_preps()):
        params = jax.tree.map(lambda a, i=i: a[i], init_params)
        ends_N = prep.ends["val"]
        x, y = stacking.gather(stacking.window_source(prep), ends_N, 30, 10)
        y_hat = _forward(module)(params, x)
        scale = stacking.persistence_scale(prep, 10)
        untrained_val.append(np.mean(_loop_loss("mae", np.asarray(y_hat), np.asarray(y), scale)))
        band = stacking.band_factors(prep, 30, 10)
        np.testing.assert_array_equal(params["output"]["band_high"], band[:, 0])
    untrained_val = np.array(untrained_val)
    # A coin whose epoch did not beat the baseline keeps it as its best model, its
    # untrained val loss as the best.
    state, metrics = trainer.run_epoch(state, arrays)
    kept = np.asarray(state.best_epoch) == 0
    assert kept.any()
    np.testing.assert_allclose(np.asarray(state.best_val)[kept], untrained_val[kept], rtol=1e-5)
    np.testing.assert_array_equal(
        np.asarray(metrics["val_loss"])[kept] >= untrained_val[kept], True
    )
    for leaf_best, leaf_init in zip(
        jax.tree.leaves(state.best_params), jax.tree.leaves(init_params), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(leaf_best)[kept], np.asarray(leaf_init)[kept])


# -- config rules -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, field",
    [
        ({"train.loss": "pinball"}, "train.loss"),
        ({"model.decoding": "autoregressive"}, "model.baseline"),
        ({"train.loss": "l1"}, "train.loss"),
        ({"model.baseline": "ewma"}, "model.baseline"),
        ({"model.window_scale": "zscore"}, "model.window_scale"),
        (
            {
                "model.window_scale": "range",
                "model.baseline": "none",
                "model.decoding": "autoregressive",
            },
            "model.window_scale",
        ),
    ],
)
def test_bad_lever_settings_name_the_field(change, field):
    c = levers_config()
    for key, value in change.items():
        group, name = key.split(".")
        c[group][name] = value
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        config_lib.validate(c)


def test_a_model_saved_before_the_levers_existed_builds_as_before():
    c = levers_config(baseline="none")
    saved = c.to_dict()
    del saved["model"]["baseline"], saved["model"]["window_scale"]
    saved["train"]["min_delta"] = 0.0  # then the margin was 0, in the loss's units
    cfg = models.make_config(config_lib.upgrade(saved))
    assert (cfg.baseline, cfg.window_scale) == ("none", "none")
