"""The dense network of the window and its context (model.name=mlp, cpbjax/models/mlp.py):
its inputs against a plain loop, an untrained model is its band, it trains, and it is
refused where it cannot run."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cpbjax import models
from cpbjax.config import schema as config_lib
from cpbjax.config_rules import ConfigError
from cpbjax.data import sources, stacking
from cpbjax.data import windows as windows_lib
from cpbjax.models import mlp
from cpbjax.score import baselines, evaluate
from tests.helpers import ROOT, levers_init_params

L, H, B = 30, 10, 5
FEATURES = ("open", "high", "low", "close", "hour_sin", "return_1d", "interval")


def run_config(**model):
    c = config_lib.load(f"{ROOT}/configs/mlp.py:tiny")
    c.data.features = FEATURES
    c.model.update(model)
    return config_lib.validate(c)


def windows(seed=0):
    """[B, L, F] windows as the pipeline gives them: log prices less the last close, then
    non-price columns; and [B, H, 4] targets."""
    rng = np.random.default_rng(seed)
    close = np.cumsum(rng.normal(0, 0.01, (B, L)), axis=1)
    close -= close[:, -1:]
    open_ = np.concatenate([close[:, :1], close[:, :-1]], axis=1)
    high = np.maximum(open_, close) + np.abs(rng.normal(0, 0.004, (B, L)))
    low = np.minimum(open_, close) - np.abs(rng.normal(0, 0.004, (B, L)))
    others = rng.normal(size=(B, L, len(FEATURES) - 4))
    x = np.concatenate([np.stack([open_, high, low, close], -1), others], -1)
    return jnp.float32(x), jnp.float32(rng.normal(0, 0.01, (B, H, 4)))


def loop_sigma(x_LF):
    w = [0.9 ** (L - 1 - i) for i in range(L)]
    return sum(wi * (x_LF[i, 1] - x_LF[i, 2]) for i, wi in enumerate(w)) / sum(w)


def test_inputs_are_each_candle_against_the_close_before_it_then_the_last_context():
    cfg = models.make_config(run_config())
    x, _ = windows()
    sigma = np.array([loop_sigma(np.asarray(x[b], np.float64)) for b in range(B)])
    scaled = np.asarray(x).copy()
    scaled[..., :4] /= sigma[:, None, None]
    got = np.asarray(mlp.network_inputs(cfg, x, jnp.float32(scaled)))
    assert got.shape == (B, L * 4 + 3 + 1)
    for b in range(B):
        want = []
        for i in range(L):
            before = scaled[b, i - 1, 3] if i else scaled[b, 0, 3]
            want += [scaled[b, i, j] - before for j in range(4)]
        want += list(scaled[b, -1, 4:]) + [math.log(sigma[b] / 0.01)]
        np.testing.assert_allclose(got[b], want, rtol=2e-5, atol=1e-5)


def test_an_untrained_network_forecasts_its_band():
    cfg = models.make_config(run_config())
    module = models.build(cfg)
    x, y = windows(1)
    params = module.init(jax.random.key(0), x, y)["params"]
    y_hat = np.asarray(module.apply({"params": params}, x))
    for b in range(B):
        sigma = loop_sigma(np.asarray(x[b], np.float64))
        for h in range(H):
            band = 0.5 * math.sqrt(h + 1) * sigma  # ForecastOutput's starting factors
            np.testing.assert_allclose(y_hat[b, h], [0, band, -band, 0], atol=1e-6)


def test_every_parameter_learns_and_the_loss_falls():
    module = models.build(models.make_config(run_config(dropout=0.1)))
    x, y = windows(2)
    params = module.init(jax.random.key(0), x, y)["params"]
    rngs = {"dropout": jax.random.key(1), "teacher": jax.random.key(2)}

    def loss(p):
        y_hat = module.apply({"params": p}, x, y, train=True, rngs=rngs)
        return jnp.mean(jnp.abs(y_hat - y))

    first, grads = jax.value_and_grad(loss)(params)
    assert float(jnp.abs(grads["head"]["kernel"]).max()) > 0  # the head starts at zero
    tx = optax.adam(1e-2)

    @jax.jit
    def step(p, opt):
        updates, opt = tx.update(jax.grad(loss)(p), opt)
        return optax.apply_updates(p, updates), opt

    opt = tx.init(params)
    for _ in range(50):
        params, opt = step(params, opt)
    assert float(loss(params)) < 0.9 * float(first)
    for path, g in jax.tree_util.tree_leaves_with_path(jax.grad(loss)(params)):
        assert float(jnp.abs(g).max()) > 0, jax.tree_util.keystr(path)


def test_autoregressive_decoding_is_refused_naming_the_field():
    c = config_lib.load(f"{ROOT}/configs/mlp.py:tiny")
    c.model.decoding, c.model.baseline, c.model.window_scale = "autoregressive", "none", "none"
    with pytest.raises(ConfigError, match="model.decoding"):
        config_lib.validate(c)


def test_a_variant_the_model_lacks_is_named():
    with pytest.raises(ConfigError, match="'replaced' is not allowed: expected '', 'demo', 'tiny'"):
        config_lib.load(f"{ROOT}/configs/mlp.py:replaced")


def test_a_column_the_network_does_not_correct_forecasts_its_baseline():
    """model.corrected_columns=(high, low): open and close are the last close exactly, with
    a head that is not zero; high and low move off the band."""
    cfg = models.make_config(run_config(corrected_columns=("high", "low")))
    module = models.build(cfg)
    x, y = windows(3)
    params = module.init(jax.random.key(0), x, y)["params"]
    params = {
        **params,
        "head": {**params["head"], "bias": jnp.full_like(params["head"]["bias"], 0.5)},
    }
    y_hat = np.asarray(module.apply({"params": params}, x))
    np.testing.assert_array_equal(y_hat[..., [0, 3]], 0.0)
    for b in range(B):
        sigma = loop_sigma(np.asarray(x[b], np.float64))
        band = 0.5 * np.sqrt(np.arange(1, H + 1)) * sigma
        assert np.abs(y_hat[b, :, 1] - band).min() > 0.4 * sigma  # 0.5 of range added


@pytest.mark.parametrize("columns", [(), ("close", "close"), ("volume",)])
def test_corrected_columns_are_distinct_target_names(columns):
    c = config_lib.load(f"{ROOT}/configs/mlp.py:tiny")
    c.model.corrected_columns = columns
    with pytest.raises(ConfigError, match="model.corrected_columns"):
        config_lib.validate(c)


def _scored_test_forecast(cfg, prep, params, column_fallback):
    """The test forecast record evaluate_model scores with `cfg` (its band refit on)."""
    module = models.build(models.make_config(cfg))
    spec = dataclasses.replace(evaluate.make_spec(cfg), column_fallback=column_fallback)
    return evaluate.evaluate_model(module, params, prep, spec).record


def _moved(params, seed):
    """params with every leaf moved at random, the band factors too: a trained network."""
    keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(params))))
    return jax.tree.map(lambda p: p + 0.05 * jax.random.normal(next(keys), p.shape), params)


def test_the_default_forecasts_the_band_on_high_and_corrects_low_as_before():
    """configs/mlp.py leaves high out of model.corrected_columns (experiments/global_model,
    issue #54): whatever the trained network and band factors, the scored high is the
    volatility band's own forecast (baselines.py's float64 fit on train+val); low is the
    forecast of the old default's columns ("high", "low"), whose high is not the band."""
    c = config_lib.load(f"{ROOT}/configs/mlp.py:tiny")
    c.data.symbols, c.data.intervals = ("BTCUSDT",), ("1h",)
    cfg = config_lib.validate(c)
    assert tuple(cfg.model.corrected_columns) == ("low",)
    lookback, horizon = cfg.data.lookback, cfg.data.horizon
    prep = windows_lib.prepare_series(sources.load_all(cfg.data)[0][0], cfg.data)
    _, params = levers_init_params(cfg, prep, stacking.band_factors(prep, lookback, horizon))
    trained = _moved(params, 0)
    ends_N = prep.ends["test"]
    band_NH2 = baselines.fitted_predictions(prep, "test", ends_N, evaluate.make_spec(cfg))[1]
    record = _scored_test_forecast(cfg, prep, trained, column_fallback=True)
    np.testing.assert_array_equal(record["last_open_time_ms"], prep.open_time_ms[ends_N])
    np.testing.assert_allclose(record["predicted"][..., 1], band_NH2[..., 0], rtol=2e-6)
    c.model.corrected_columns = ("high", "low")
    old = config_lib.validate(c)
    new = _scored_test_forecast(cfg, prep, trained, column_fallback=False)
    before = _scored_test_forecast(old, prep, trained, column_fallback=False)
    np.testing.assert_array_equal(new["predicted"][..., 2], before["predicted"][..., 2])
    assert np.abs(new["predicted"][..., 2] / band_NH2[..., 1] - 1).max() > 1e-3  # corrected
    assert np.abs(before["predicted"][..., 1] / band_NH2[..., 0] - 1).max() > 1e-3
