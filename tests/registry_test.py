"""Tests that a data source and a model registered from user code pass validation and train."""

import dataclasses
import os

import flax.linen as nn
import jax.numpy as jnp
import pytest

from cpbjax import models, writers
from cpbjax.config import schema as config_lib
from cpbjax.config_rules import ConfigError
from cpbjax.data import parsing, sources, synthetic
from cpbjax.models import heads, layers, model_config
from cpbjax.modes import driver

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_walk(data_cfg, pairs):
    """A user source: the synthetic generator with its own seed, one Series per pair."""
    loaded = {}
    for symbol, interval in pairs:
        s = synthetic.generate(symbol, interval, data_cfg.synthetic_candles, seed=7)
        parts = [(s.open_time_ms, s.ohlcv)]
        loaded[f"{symbol}-{interval}"] = parsing.build_series(
            symbol, interval, parts, data_cfg, s.notes
        )
    return loaded, {}


@dataclasses.dataclass(frozen=True, kw_only=True)
class MLPConfig(model_config.ModelConfig):
    """config.model fields of the user model: name, decoding, dropout, hidden."""

    hidden: int  # D, the width of the one hidden layer.


class MLP(nn.Module):
    """A user model: the flattened window → one hidden layer → all H candles at once."""

    cfg: MLPConfig

    @nn.compact
    def __call__(self, x_BLF, y_BHC=None, train=False, teacher_forcing=0.0):
        cfg = self.cfg
        model_config.check_inputs(cfg, x_BLF, y_BHC)
        flat = x_BLF.reshape(x_BLF.shape[0], -1).astype(cfg.compute_dtype)  # [B, L * F]
        h_BD = nn.relu(layers.dense(cfg, cfg.hidden)(flat))
        h_BD = nn.Dropout(cfg.dropout)(h_BD, deterministic=not train)
        y_flat = layers.dense(cfg, cfg.horizon * cfg.num_targets)(h_BD)  # [B, H * C]
        return y_flat.reshape(-1, cfg.horizon, cfg.num_targets).astype(jnp.float32)


class MLPWithHead(MLP):
    """The user model with its forecasts through heads.ForecastOutput, but its inputs not
    through layers.PriceScale."""

    @nn.compact
    def __call__(self, x_BLF, y_BHC=None, train=False, teacher_forcing=0.0):
        y_hat_BHC = super().__call__(x_BLF, y_BHC, train, teacher_forcing)
        return heads.ForecastOutput(self.cfg)(y_hat_BHC, x_BLF)


@pytest.fixture
def registered(monkeypatch):
    """Registers source "walk" and model "user_mlp"; the registries are restored afterwards."""
    monkeypatch.setattr(sources, "SOURCES", dict(sources.SOURCES))
    monkeypatch.setattr(models, "REGISTRY", dict(models.REGISTRY))
    sources.register("walk")(load_walk)
    models.register("user_mlp", MLP, MLPConfig)


def _config():
    """The tiny GRU config turned into 2 series of 300 "walk" candles and an "user_mlp" model."""
    c = config_lib.load(os.path.join(ROOT, "configs/gru.py:tiny"))
    c.data.source = "walk"
    c.data.symbols, c.data.intervals = ("BTCUSDT", "ETHUSDT"), ("1h",)
    c.data.max_candles, c.data.min_candles, c.data.synthetic_candles = 300, 200, 360
    c.model.name, c.model.hidden = "user_mlp", 16
    c.model.baseline = "none"  # MLP's forecasts do not go through heads.ForecastOutput
    c.train.epochs, c.train.patience = 2, 2
    c.eval.plots = False
    return c


def test_unregistered_names_are_rejected():
    c = _config()
    with pytest.raises(ConfigError, match="config.data.source='walk'"):
        config_lib.validate(c)
    c.data.source = "synthetic"
    with pytest.raises(ConfigError, match="config.model.name='user_mlp'.*one of"):
        config_lib.validate(c)


def test_registered_names_are_listed_and_validated(registered):
    assert "walk" in config_lib.SOURCES and "user_mlp" in config_lib.MODELS
    c = _config()
    # num_layers is a GRU field, not one of MLPConfig's: the error names it and the fields.
    with pytest.raises(ConfigError, match="model.num_layers=2.*'user_mlp': name, decoding"):
        config_lib.validate(c)
    del c.model["num_layers"]
    config_lib.validate(c)
    with c.model.ignore_type():
        c.model.hidden = 0
    with pytest.raises(ConfigError, match="model.hidden=0.*integer >= 1"):
        config_lib.validate(c)
    del c.model["hidden"]
    with pytest.raises(ConfigError, match="config.model.hidden is missing"):
        config_lib.validate(c)


@pytest.mark.slow
def test_registered_source_and_model_train(registered, tmp_path):
    c = _config()
    del c.model["num_layers"]
    results = driver.train_and_evaluate(config_lib.validate(c), str(tmp_path))
    on_disk = writers.read_json(os.path.join(tmp_path, "results.json"))
    for name in ("BTCUSDT-1h", "ETHUSDT-1h"):
        entry = on_disk["series"][name]
        assert entry["status"] == "trained", entry
        assert entry["epochs_run"] == 2
        assert results["series"][name]["status"] == "trained"


def test_a_model_without_the_output_head_refuses_a_baseline(registered, tmp_path):
    c = _config()
    del c.model["num_layers"]
    c.model.baseline = "vol_band"
    with pytest.raises(ConfigError, match="model.baseline=.vol_band.*ForecastOutput.*.user_mlp."):
        driver.train_and_evaluate(config_lib.validate(c), str(tmp_path))


@pytest.mark.parametrize(
    "head, missing",
    [(False, "heads.ForecastOutput and layers.PriceScale"), (True, "layers.PriceScale")],
)
def test_a_model_without_the_price_scale_refuses_a_window_scale(
    registered, tmp_path, head, missing
):
    if head:
        models.REGISTRY["user_mlp"] = (MLPWithHead, MLPConfig)
    c = _config()
    del c.model["num_layers"]
    c.model.window_scale = "range"
    with pytest.raises(
        ConfigError,
        match=f"model.window_scale=.range. needs.*{missing}; model .user_mlp.",
    ):
        driver.train_and_evaluate(config_lib.validate(c), str(tmp_path))
