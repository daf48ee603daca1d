"""Sweep tests that train nothing: the choice on val loss, the grid and its per-coin arrays,
and the config checks that refuse a bad sweep."""

import math
import os
import subprocess
import sys

import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from cpbjax.config import schema as config_lib
from cpbjax.config import sweep_grid
from cpbjax.config_rules import ConfigError
from cpbjax.data import stacking
from cpbjax.modes import backtest, sweep
from cpbjax.training import optimizer
from tests import helpers
from tests.helpers import sweep_config

# -- selection ----------------------------------------------------------------------------


def _cell(val, test_mae):
    return {"best_val_loss": val, "test": {"columns": {"close": {"mae": test_mae}}}}


def test_choice_reads_val_loss_never_test():
    # Test scores that would pick the other setting everywhere.
    tab = {
        "A": {"lr=0.001": _cell(1.0, 9.0), "lr=0.003": _cell(2.0, 1.0)},
        "B": {"lr=0.001": _cell(4.0, 1.0), "lr=0.003": _cell(3.0, 9.0)},
        "C": {"lr=0.001": _cell(math.nan, 1.0), "lr=0.003": _cell(None, 1.0)},
    }
    assert sweep.choose(tab, "series") == {"A": "lr=0.001", "B": "lr=0.003", "C": None}
    # Mean relative val loss: lr=0.001 (1 + 4/3) / 2 = 1.167 beats lr=0.003 (2 + 1) / 2.
    scores = sweep.pooled_scores(tab)
    assert scores == pytest.approx({"lr=0.001": (1 + 4 / 3) / 2, "lr=0.003": 1.5})
    assert sweep.choose(tab, "pooled") == {"A": "lr=0.001", "B": "lr=0.001", "C": None}


def test_ties_go_to_the_first_setting_in_grid_order():
    tab = {"A": {"lr=0.003": _cell(1.0, 0), "lr=0.001": _cell(1.0, 0)}}
    assert sweep.choose(tab, "series") == {"A": "lr=0.003"}
    assert sweep.choose(tab, "pooled") == {"A": "lr=0.003"}


def test_by_setting_counts_choices_and_ties():
    tab = {
        "A": {"lr=0.001": _cell(1.0, 0), "lr=0.003": _cell(1.0, 0)},  # a tie (a kept baseline)
        "B": {"lr=0.001": _cell(3.0, 0), "lr=0.003": _cell(2.0, 0)},
        "C": {"lr=0.001": _cell(None, 0), "lr=0.003": _cell(math.inf, 0)},
    }
    chosen = sweep.choose(tab, "series")
    got = sweep.by_setting(tab, chosen)
    assert got["lr=0.001"] == {
        "median_val_loss": 2.0,
        "relative_val_loss": pytest.approx((1.0 + 1.5) / 2),
        "chosen_by": 1,
        "lowest_on": 1,
    }
    assert got["lr=0.003"]["chosen_by"] == 1 and got["lr=0.003"]["lowest_on"] == 2
    assert got["lr=0.003"]["median_val_loss"] == 1.5
    assert [s for s, row in tab.items() if len(sweep.lowest(row)) > 1] == ["A"]


# -- the grid and its per-coin arrays -------------------------------------------------------


def test_grid_names_and_per_coin_hparams():
    c = sweep_config()
    c.sweep.weight_decay = (0.0, 0.1)
    config_lib.validate(c)
    names = [sweep_grid.setting_name(s) for s in sweep_grid.settings(c)]
    assert names == [
        "lr=0.001,wd=0.0",
        "lr=0.001,wd=0.1",
        "lr=0.003,wd=0.0",
        "lr=0.003,wd=0.1",
    ]
    preps = list(helpers.tiny_preps())[:2]
    coins = sweep_grid.expand(preps, c)
    assert [p.name for p in coins[:4]] == [f"{preps[0].name}@{n}" for n in names]
    assert {sweep_grid.series_of(p.name) for p in coins} == {p.name for p in preps}
    host = stacking.stack_group(coins[:4] + coins[4:5], 6, c.data, 300)
    lr_base = c.train.learning_rate
    np.testing.assert_allclose(host.hparams["lr_mult"], [1, 1, 3, 3, 1, 0], rtol=1e-6)
    assert lr_base * host.hparams["lr_mult"][2] == pytest.approx(3e-3)
    np.testing.assert_array_equal(host.hparams["weight_decay"], np.float32([0, 0.1, 0, 0.1, 0, 0]))
    plain = stacking.stack_group(preps, 2, c.data, 300)
    assert plain.hparams == {}  # no sweep: the arrays gain no leaf


def test_coin_names_are_safe_file_names():
    setting = {"learning_rate": 3e-4, "weight_decay": 1e-5}
    name = sweep_grid.coin_name("BTCUSDT-1h", setting)
    assert name == "BTCUSDT-1h@lr=0.0003,wd=1e-05"
    assert os.path.basename(name) == name


def _one_update(train_cfg, per_coin_decay, decay=None):
    params = {"w": jnp.array([1.0, -2.0, 0.5])}
    grads = {"w": jnp.array([0.3, 0.1, -0.2])}
    tx = optimizer.make_optimizer(train_cfg, per_coin_decay)
    extra = {} if decay is None else {"weight_decay": decay}
    state = optimizer.with_learning_rate(tx.init(params), 0.1, **extra)
    updates, _ = tx.update(grads, state, params)
    return np.asarray(optax.apply_updates(params, updates)["w"])


@pytest.mark.parametrize("name", ["adam", "adamw"])
@pytest.mark.parametrize("decay", [0.0, 0.25])
def test_a_per_coin_weight_decay_updates_as_the_constant_one(name, decay):
    constant = ml_collections.ConfigDict(
        {"optimizer": name, "weight_decay": decay, "grad_clip": 1.0}
    )
    swept = ml_collections.ConfigDict({"optimizer": name, "weight_decay": 0.9, "grad_clip": 1.0})
    np.testing.assert_array_equal(
        _one_update(swept, True, jnp.float32(decay)), _one_update(constant, False)
    )


# -- config validation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("learning_rate", (1e-3, -1e-3), "config.sweep.learning_rate=-0.001 is not allowed"),
        ("learning_rate", (1e-3, 1e-3), "sweep.learning_rate.*distinct"),
        ("weight_decay", (2.0,), "sweep.weight_decay"),
        ("select", "best", "sweep.select='best'.*series, pooled"),
    ],
)
def test_bad_sweep_values_are_refused_by_name(field, value, match):
    c = sweep_config()
    c.sweep[field] = value
    with pytest.raises(ConfigError, match=match):
        config_lib.validate(c)


@pytest.mark.parametrize(
    "field,match",
    [
        ("dropout", "sweep.dropout cannot be swept: it is compiled into the program"),
        ("loss", "sweep.loss cannot be swept: it is compiled into the program"),
        ("hidden", "sweep.hidden cannot be swept: it changes the shapes"),
        ("epochs", "sweep.epochs cannot be swept: it is not a per-coin hyperparameter"),
    ],
)
def test_fields_that_cannot_be_per_coin_arrays_are_refused(field, match):
    c = sweep_config()
    with c.sweep.unlocked():
        c.sweep[field] = (1, 2)
    with pytest.raises(ConfigError, match=match):
        config_lib.validate(c)


def test_a_backtest_refuses_a_sweep_instead_of_ignoring_it(tmp_path):
    with pytest.raises(ConfigError, match="sweep.learning_rate.*does not cross"):
        backtest.run_backtest(sweep_config(), str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_a_backtest_refuses_a_fine_tuning_start(tmp_path):
    # Its folds' months may be the start's training months: scored on its own windows.
    config = helpers.tiny_config()
    config.train.init_from = str(tmp_path / "base")
    with pytest.raises(ConfigError, match="train.init_from=.*folds would score"):
        backtest.run_backtest(config, str(tmp_path / "bt"))
    assert os.listdir(tmp_path) == []


def test_launch_exits_2_naming_a_bad_sweep_value(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "launch.py",
            "--config=configs/gru.py:tiny",
            "--config.sweep.learning_rate=(0.001,-0.5)",
            f"--workdir={tmp_path}",
        ],
        env=helpers.subprocess_env(),
        cwd=helpers.ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "config.sweep.learning_rate=-0.5 is not allowed" in proc.stderr
    assert "Traceback" not in proc.stderr
