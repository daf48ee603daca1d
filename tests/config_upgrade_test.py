"""config.upgrade: a config saved by an earlier cpbjax, read into today's schema."""

import json
import os

import pytest

from cpbjax.config import schema as config_lib
from cpbjax.config_rules import ConfigError
from tests import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The config.json that `launch.py --config configs/gru.py:tiny --config.train.epochs=1`
# wrote at commit 2c4dd27, the release before the knobs of issue #41 were retired.
PREVIOUS_TINY = os.path.join(ROOT, "tests", "data", "config_gru_tiny_2c4dd27.json")


def _saved() -> dict:
    with open(PREVIOUS_TINY) as f:
        return json.load(f)


def test_the_previous_release_config_loads_as_todays_tiny_config():
    saved = _saved()
    upgraded = config_lib.validate(config_lib.upgrade(saved))
    today = config_lib.load(os.path.join(ROOT, "configs/gru.py:tiny"))
    today.train.epochs = 1  # as the saved run was launched
    # Added since, with the value that reproduces the saved run (config_history.ADDED).
    today.eval.column_fallback = False
    got, want = helpers.flat(upgraded.to_dict()), helpers.flat(today.to_dict())
    assert got == want  # every field that still exists, and no retired one
    retired = set(helpers.flat(saved)) - set(want)
    assert retired == helpers.RETIRED_SINCE_2C4DD27


@pytest.mark.parametrize("path", ["configs/gru.py", "configs/transformer.py:tiny"])
def test_a_config_saved_today_upgrades_to_itself(path):
    # Without train.min_delta_mode, as a config saved before it existed: the margin is
    # in standard errors (today's), not the loss's units (then).
    today = config_lib.load(os.path.join(ROOT, path))
    saved = json.loads(json.dumps(today.to_dict()))  # as config.json holds it
    assert config_lib.upgrade(saved).to_dict() == today.to_dict()


@pytest.mark.parametrize(
    "field, value",
    [
        ("model.quantiles", [0.1, 0.5, 0.9]),
        ("model.series_embedding", 4),
        ("recurrent_gradient", "fused"),
        ("train.min_delta_mode", "rel"),
        ("eval.interval_vol_days", 3.0),
        ("eval.interval_vol_weight", 0.5),
        ("train.loss", "huber"),
        ("train.loss", "pinball"),
        ("model.baseline", "persistence"),
        ("data.normalization", "zscore"),
        ("data.normalization", "candle_minmax"),
        ("train.reduce_on_plateau", True),
        ("model.aux_targets", ["realized_vol"]),
    ],
)
def test_a_retired_option_set_in_a_saved_config_is_refused_by_name(field, value):
    saved, (*groups, leaf) = _saved(), field.split(".")
    group = saved
    for part in groups:
        group = group[part]
    group[leaf] = value
    with pytest.raises(ConfigError, match=rf"config\.{field}=.* was retired, so "):
        config_lib.upgrade(saved)


def test_a_retired_field_that_only_a_retired_option_read_is_dropped_while_that_is_off():
    # train.plateau_* were read only with train.reduce_on_plateau=True, model.aux_weight
    # only with model.aux_targets.
    saved = _saved()
    saved["train"]["plateau_factor"], saved["train"]["plateau_patience"] = 0.3, 2
    saved["model"]["aux_weight"] = 0.5
    upgraded = config_lib.upgrade(saved)
    assert "plateau_factor" not in upgraded.train and "plateau_patience" not in upgraded.train
    assert "aux_weight" not in upgraded.model
    saved["train"]["reduce_on_plateau"] = True
    with pytest.raises(ConfigError, match=r"config\.train\.reduce_on_plateau=True"):
        config_lib.upgrade(saved)
    saved["train"]["reduce_on_plateau"] = False
    saved["model"]["aux_targets"] = ["realized_vol"]
    with pytest.raises(ConfigError, match=r"config\.model\.aux_targets=\("):
        config_lib.upgrade(saved)


def test_fields_added_since_take_the_value_of_the_earlier_behaviour():
    # A config from before the levers, the pooled model, intervals and the band refit,
    # with the margin in the loss's units (train.min_delta_mode did not exist).
    saved = _saved()
    for field in ("baseline", "window_scale", "ensemble", "quantiles"):
        del saved["model"][field]
    for field in ("loss", "loss_scale", "share", "pooled_chunk", "min_delta_mode"):
        del saved["train"][field]
    for field in ("interval_levels", "refit_band", "interval_vol_days", "interval_vol_weight"):
        del saved["eval"][field]
    del saved["backtest"], saved["sweep"], saved["serve"], saved["recurrent_gradient"]
    saved["train"]["min_delta"] = 0.0
    c = config_lib.validate(config_lib.upgrade(saved))
    assert (c.model.baseline, c.model.window_scale, c.model.ensemble) == ("none", "none", 1)
    assert (c.train.loss, c.train.loss_scale, c.train.share) == ("mse", "none", "series")
    # No interval; the band refit is off, and without a band (baseline none) the field
    # takes its default, which refits nothing.
    assert c.eval.interval_levels == () and c.model.baseline == "none"
    assert c.eval.refit_band == config_lib.base_config().eval.refit_band
    saved["model"]["baseline"] = "vol_band"  # with a band the old run had no refit
    assert config_lib.validate(config_lib.upgrade(saved)).eval.refit_band is False
    # nor a per-column fallback to the band
    assert config_lib.validate(config_lib.upgrade(saved)).eval.column_fallback is False
    saved["model"]["baseline"] = "none"
    assert c.train.min_delta == 0.0 and c.sweep.learning_rate == ()
    # A margin in the loss's units has no counterpart now.
    saved["train"]["min_delta"] = 0.005
    with pytest.raises(ConfigError, match=r"config\.train\.min_delta_mode='abs'"):
        config_lib.upgrade(saved)
