"""Tests of the accuracy levers: train.loss and loss_scale, model.baseline, model.quantiles.

References are independent: numpy loops for the losses, baselines.py (float64 numpy) for
the volatility band, and a separate forward pass for the untrained val loss.
"""

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from cpbjax import baselines, evaluate, forecast, intervals, losses, models, sharding, step
from cpbjax import config as config_lib
from cpbjax.config_rules import ConfigError
from cpbjax.data import sources, stacking, windows
from cpbjax.group import GroupTrainer, coin_keys
from cpbjax.models import common

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEVELS = (0.1, 0.5, 0.9)


def make_config(name="gru", loss="mae", **model):
    """A tiny config with the levers on: 2 series of 300 candles, a 1-layer width-16 model."""
    c = config_lib.load(os.path.join(ROOT, f"configs/{name}.py:tiny"))
    c.data.symbols, c.data.intervals = ("BTCUSDT", "ETHUSDT"), ("1h",)
    c.data.max_candles, c.data.min_candles, c.data.synthetic_candles = 300, 200, 360
    if name == "gru":
        c.model.hidden, c.model.num_layers = 16, 1
    c.model.baseline = "vol_band"
    c.train.loss, c.train.loss_scale = loss, "persistence"
    c.train.epochs = c.train.patience = 2
    c.model.update(model)
    return config_lib.validate(c)


@functools.cache
def preps():
    data = make_config().data
    series, skipped = sources.load_all(data)
    assert not skipped
    return tuple(windows.prepare_series(s, data) for s in series)


# -- losses against numpy loops ----------------------------------------------------------


def _loop_loss(kind, y_hat, y, scale, levels):
    b, h, c = y.shape
    out = np.zeros(b)
    for i in range(b):
        total = 0.0
        for j in range(h):
            for k in range(c):
                if kind == "pinball":
                    for q, level in enumerate(levels):
                        r = (y_hat[i, j, k, q] - y[i, j, k]) / scale[k]
                        total += max(-r * level, r * (1 - level))
                    continue
                r = (y_hat[i, j, k] - y[i, j, k]) / scale[k]
                total += {
                    "mse": r * r,
                    "mae": abs(r),
                    "huber": 0.5 * r * r if abs(r) <= 1 else abs(r) - 0.5,
                }[kind]
        out[i] = total / (h * c)
    return out


@pytest.mark.parametrize("kind", losses.LOSSES)
@pytest.mark.parametrize("scaled", [False, True])
def test_window_loss_matches_a_loop(kind, scaled):
    rng = np.random.default_rng(0)
    y = rng.normal(size=(5, 3, 4)).astype(np.float32)
    shape = (5, 3, 4, len(LEVELS)) if kind == "pinball" else (5, 3, 4)
    y_hat = (rng.normal(size=shape) * 2).astype(np.float32)
    scale = np.array([0.5, 2.0, 1.5, 0.25], np.float32) if scaled else np.ones(4, np.float32)
    got = losses.window_loss(kind, y_hat, y, jnp.asarray(scale) if scaled else None, LEVELS)
    want = _loop_loss(kind, y_hat, y, scale, LEVELS)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)


def test_persistence_scale_is_the_persistence_mae_of_each_column():
    prep, horizon = preps()[0], make_config().data.horizon
    got = stacking.persistence_scale(prep, horizon)
    errs = [[], [], [], []]
    for t in prep.ends["train"]:
        for h in range(1, horizon + 1):
            for c in range(4):
                errs[c].append(abs(prep.targets[t + h, c] - prep.targets[t, 3]))
    np.testing.assert_allclose(got, [np.mean(e) for e in errs], rtol=1e-5)


# -- the baseline inside the model --------------------------------------------------------


def _init_params(cfg, prep, band):
    module = models.build(models.make_config(cfg))
    spec = step.make_spec(cfg, module, cfg.data.max_candles)
    params = step.init_coin(spec, jax.random.PRNGKey(3), jnp.asarray(band))[0]
    return module, params


@pytest.mark.parametrize(
    "name, window_scale, ensemble",
    [("gru", "none", 1), ("transformer", "range", 1), ("transformer", "range", 3)],
)
def test_an_untrained_model_is_the_fitted_volatility_band_exactly(name, window_scale, ensemble):
    cfg = make_config(name, window_scale=window_scale, ensemble=ensemble)
    prep, lookback, horizon = preps()[0], cfg.data.lookback, cfg.data.horizon
    band = stacking.band_factors(prep, lookback, horizon)
    module, params = _init_params(cfg, prep, band)
    ends_N = prep.ends["val"]
    x, _ = stacking.gather(
        prep.inputs, prep.targets, prep.anchor, prep.price_mask, ends_N, lookback, horizon
    )
    y_hat = np.asarray(module.apply({"params": params}, x, None, train=False), np.float64)
    # The float64 numpy baseline, fitted on the train windows only.
    fit = baselines.fit_vol_band(prep.ohlc, prep.ends["train"], lookback, horizon)
    high, low = baselines.vol_band_predict(fit, prep.ohlc, ends_N, lookback)
    close_N1 = prep.ohlc[ends_N, 3][:, None]
    np.testing.assert_array_equal(y_hat[..., [0, 3]], 0.0)  # persistence: the last close
    np.testing.assert_allclose(y_hat[..., 1], np.log(high / close_N1), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(y_hat[..., 2], np.log(low / close_N1), rtol=1e-4, atol=1e-7)


def _window(rng, cfg, batch=6):
    """Windows [B, L, F] in last_close space: every column about 0.01, high >= low."""
    x = rng.normal(size=(batch, cfg.lookback, cfg.num_features)) * 0.01
    x[..., 1] = np.maximum(x[..., 1], x[..., 2]) + 0.002
    return x


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
    """Windows whose price moves are 3x larger get forecasts 3x larger, every level, with
    window_scale=range (prices in range units in, the median times the range out), and not
    without it. The non-price column (rsi) stays as it is; bb_upper, a price, is column 5."""
    run = make_config(name, loss="pinball", quantiles=LEVELS, window_scale=window_scale)
    run.data.features = ("open", "high", "low", "close", "rsi", "bb_upper")
    cfg = models.make_config(run)
    assert cfg.price_columns == (0, 1, 2, 3, 5)
    module, rng = models.build(cfg), np.random.default_rng(4)
    x = _window(rng, cfg)
    x[..., 4] = rng.normal(size=x.shape[:2])
    params = _moved_params(module, x)
    x3 = x.copy()
    x3[..., cfg.price_columns] *= 3.0
    y, y3 = (
        np.asarray(
            module.apply({"params": params}, jnp.asarray(v, jnp.float32), return_quantiles=True),
            np.float64,
        )
        for v in (x, x3)
    )
    assert np.abs(y).max() > 1e-3
    equivariant = np.allclose(y3, 3.0 * y, rtol=1e-3, atol=1e-6)
    assert equivariant == (window_scale == "range")


def test_persistence_baseline_forecasts_the_last_close_for_every_column():
    cfg = make_config(baseline="persistence")
    prep = preps()[0]
    module, params = _init_params(cfg, prep, np.zeros((cfg.data.horizon, 2), np.float32))
    x = jnp.asarray(np.random.default_rng(1).normal(size=(6, cfg.data.lookback, 4)), jnp.float32)
    np.testing.assert_array_equal(module.apply({"params": params}, x, None), 0.0)


def test_quantiles_never_cross_and_the_median_is_the_point_forecast():
    cfg = models.make_config(make_config(loss="pinball", quantiles=LEVELS, baseline="none"))
    cfg = dataclasses.replace(cfg, quantiles=(0.05, 0.25, 0.5, 0.75, 0.95))
    out = common.ForecastOutput(cfg)
    rng = np.random.default_rng(2)
    raw = jnp.asarray(rng.normal(size=(7, cfg.horizon, 4 * 5)) * 5, jnp.float32)
    x = jnp.asarray(rng.normal(size=(7, cfg.lookback, 4)), jnp.float32)
    x = x.at[..., 1].set(jnp.abs(x[..., 1]) + 0.01).at[..., 2].set(-jnp.abs(x[..., 2]))
    params = out.init(jax.random.PRNGKey(0), raw, x)
    q = np.asarray(out.apply(params, raw, x, quantiles=True))
    assert q.shape == (7, cfg.horizon, 4, 5)
    assert (np.diff(q, axis=-1) > 0).all()
    np.testing.assert_array_equal(out.apply(params, raw, x), q[..., 2])
    # Untrained (raw 0), the levels sit 0.5 * sqrt(h) * sigma * normal quantiles apart.
    q0 = np.asarray(out.apply(params, jnp.zeros_like(raw), x, quantiles=True))
    sigma = np.asarray(common.window_range(x))
    z = np.array([-1.6449, -0.6745, 0, 0.6745, 1.6449])
    want = 0.5 * np.sqrt(np.arange(1, cfg.horizon + 1))[None, :, None] * sigma[:, None, None] * z
    np.testing.assert_allclose(q0[:, :, 3], want, rtol=1e-3, atol=1e-6)


# -- intervals against loops -----------------------------------------------------------------


def test_band_quantile_factors_minimise_the_pinball_loss():
    prep, lookback, horizon = preps()[0], 30, 10
    ends = prep.ends["train"]
    k = intervals.fit_band_quantiles(prep.ohlc, ends, lookback, horizon, LEVELS)
    sigma = baselines.ewma_range(prep.ohlc, ends, lookback)
    ratios = baselines.future_log_ratios(prep.ohlc, ends, horizon)
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
    got = intervals._column(actual, pred, {"band": band, "scaled_band": other}, LEVELS)
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


def test_forecasts_of_a_quantile_model_carry_every_level():
    cfg = make_config(loss="pinball", quantiles=LEVELS)
    prep = preps()[0]
    module, params = _init_params(cfg, prep, stacking.band_factors(prep, 30, 10))
    fc = forecast.split_forecast(module, params, prep, "test", evaluate.EvalSpec(30, 10))
    assert fc.quantiles_NHCJ.shape == (*fc.prices_NHC.shape, 3)
    np.testing.assert_array_equal(fc.quantiles_NHCJ[..., 1], fc.prices_NHC)
    record = forecast.forecast_record(prep, fc, evaluate.EvalSpec(30, 10), LEVELS)
    np.testing.assert_array_equal(record["quantile_levels"], LEVELS)
    scores = evaluate.evaluate_split(prep, fc, "test", evaluate.EvalSpec(30, 10), LEVELS)
    assert set(scores["intervals"]["columns"]) == {"open", "high", "low", "close"}
    entry = forecast.next_candles(module, params, prep, 30, 10)
    first = entry["forecast"][0]
    assert list(first["quantiles"]) == ["0.1", "0.5", "0.9"]
    assert first["quantiles"]["0.1"]["close"] < first["quantiles"]["0.9"]["close"]


# -- training starts from the baseline -------------------------------------------------------


def test_the_untrained_val_loss_is_the_one_to_beat():
    cfg = make_config()
    cfg.train.learning_rate = 5.0  # so large that some coin's first epoch is worse
    module = models.build(models.make_config(cfg))
    trainer = GroupTrainer(cfg, module, 2, sharding.coin_mesh(jax.devices()[:1]))
    arrays = trainer.stack(list(preps()))
    state = trainer.init_state(coin_keys(0, [0, 1]), arrays)
    for i, prep in enumerate(preps()):
        params = jax.tree.map(lambda a, i=i: a[i], state.params)
        ends_N = prep.ends["val"]
        x, y = stacking.gather(
            prep.inputs, prep.targets, prep.anchor, prep.price_mask, ends_N, 30, 10
        )
        y_hat = module.apply({"params": params}, x, None)
        scale = stacking.persistence_scale(prep, 10)
        want = np.mean(_loop_loss("mae", np.asarray(y_hat), np.asarray(y), scale, ()))
        np.testing.assert_allclose(float(state.best_val[i]), want, rtol=1e-5)
        band = stacking.band_factors(prep, 30, 10)
        np.testing.assert_array_equal(params["output"]["band_high"], band[:, 0])
    assert (np.asarray(state.best_epoch) == 0).all()
    # A coin whose epoch did not beat the baseline keeps it as its best model.
    untrained_val = np.asarray(state.best_val)
    state, metrics = trainer.run_epoch(state, arrays)
    kept = np.asarray(state.best_epoch) == 0
    assert kept.any()
    np.testing.assert_array_equal(
        np.asarray(metrics["val_loss"])[kept] >= untrained_val[kept], True
    )
    for leaf_best, leaf_init in zip(
        jax.tree.leaves(state.best_params),
        jax.tree.leaves(trainer.init_state(coin_keys(0, [0, 1]), arrays).params),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(leaf_best)[kept], np.asarray(leaf_init)[kept])


# -- config rules -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, field",
    [
        ({"train.loss": "pinball"}, "train.loss"),
        ({"model.quantiles": (0.1, 0.9), "train.loss": "pinball"}, "model.quantiles"),
        ({"model.quantiles": (0.9, 0.5, 0.1), "train.loss": "pinball"}, "model.quantiles"),
        ({"model.quantiles": LEVELS}, "train.loss"),
        ({"model.decoding": "autoregressive"}, "model.baseline"),
        ({"data.normalization": "zscore"}, "data.normalization"),
        ({"train.loss": "l1"}, "train.loss"),
        ({"model.baseline": "ewma"}, "model.baseline"),
        ({"model.window_scale": "zscore"}, "model.window_scale"),
        (
            {
                "model.window_scale": "range",
                "model.baseline": "none",
                "data.normalization": "zscore",
            },
            "data.normalization",
        ),
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
    c = make_config()
    for key, value in change.items():
        group, name = key.split(".")
        c[group][name] = value
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        config_lib.validate(c)


def test_a_model_saved_before_the_levers_existed_builds_as_before():
    c = make_config(baseline="none")
    saved = c.to_dict()
    del saved["model"]["baseline"], saved["model"]["quantiles"], saved["model"]["window_scale"]
    cfg = models.make_config(ml_collections.ConfigDict(saved))
    assert (cfg.baseline, cfg.quantiles, cfg.window_scale) == ("none", (), "none")
