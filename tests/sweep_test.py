"""Tests of sweeps: every (series, setting) coin in one program, chosen on val loss only.

One sweep of 2 tiny series x 2 learning rates x 2 weight decays runs once in a subprocess (module
fixture) with a persistent compilation cache at XLA optimisation level 0, as the
backtest tests do; the run of one setting alone reuses its compiled programs.
"""

import math
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from absl import logging

from cpbjax import writers
from cpbjax.config import schema as config_lib
from cpbjax.config import sweep_grid
from cpbjax.config_rules import ConfigError
from cpbjax.data import stacking
from cpbjax.modes import backtest, sweep
from cpbjax.training import checkpoint, ledger, optimizer
from tests import helpers

SERIES = ("BTCUSDT-1h", "ETHUSDT-1h")
RATES, DECAYS = (1e-3, 3e-3), (0.0, 0.05)  # x 2 series: 8 coins, one group of 8
# The coin trained again on its own (the config's own are lr 1e-3, decay 1e-2).
ALONE_SERIES, ALONE_SETTING = "ETHUSDT-1h", {"learning_rate": 3e-3, "weight_decay": 0.0}


def sweep_config():
    """helpers.tiny_config's GRU (300 candles, 1 layer of 16), 2 series, 2 x 2 settings."""
    c = helpers.tiny_config()
    c.data.symbols = tuple(s.split("-")[0] for s in SERIES)
    c.ckpt.every_epochs = 1
    c.train.group_size = 8
    c.sweep.learning_rate, c.sweep.weight_decay = RATES, DECAYS
    return config_lib.validate(c)


def run(workdir: str) -> None:
    logging.set_verbosity(logging.INFO)  # the resume test reads what was skipped
    sweep.run_sweep(sweep_config(), workdir)


def run_pooled(workdir: str) -> None:
    logging.set_verbosity(logging.INFO)  # the test reads what was skipped
    config = sweep_config()
    config.sweep.select = "pooled"
    sweep.run_sweep(config, workdir)


def run_alone(workdir: str) -> None:
    """ALONE_SERIES as the only coin of a plain run with ALONE_SETTING's values in
    config.train (same symbols, so its coin key is the sweep coin's)."""
    from cpbjax.modes import driver, plan
    from cpbjax.report.runlog import StageClock

    config = sweep_config()
    config.sweep.learning_rate, config.sweep.weight_decay = (), ()
    config.train.update(ALONE_SETTING)
    preps = [p for p in plan.prepare_all(config)[0] if p.name == ALONE_SERIES]
    entries, _ = driver.train_groups(config, workdir, plan.chunked(config, preps), StageClock())
    writers.write_json(os.path.join(workdir, "alone.json"), entries)


# The pooled sweep's setting trained again alone; its decay is not the config's (0.0), so
# a decay that never reached the pooled step would show.
POOLED_ALONE = {"learning_rate": 3e-3, "weight_decay": 0.05}


def pooled_sweep_config():
    """The sweep with train.share=pooled: one pooled model of both series per setting, 2
    settings (both learning rates at POOLED_ALONE's decay)."""
    c = sweep_config()
    c.train.share, c.train.group_size = "pooled", 0
    c.sweep.weight_decay = (POOLED_ALONE["weight_decay"],)
    return config_lib.validate(c)


def _pooled_settings():
    return [f"lr={r!r},wd={POOLED_ALONE['weight_decay']!r}" for r in RATES]


def run_pooled_share(workdir: str) -> None:
    sweep.run_sweep(pooled_sweep_config(), workdir)


def run_pooled_alone(workdir: str) -> None:
    """A pooled train run of both series with POOLED_ALONE's values in config.train."""
    from cpbjax.modes import driver

    config = pooled_sweep_config()
    config.sweep.learning_rate, config.sweep.weight_decay = (), ()
    config.train.update(POOLED_ALONE)
    driver.train_and_evaluate(config, workdir)


def run_compacted(workdir: str) -> None:
    """The sweep with patience 1, so coins stop at scattered epochs, run twice: whole, and
    with group compaction forced whenever at most half the coins train."""
    from cpbjax.training import compaction

    config = sweep_config()
    config.train.epochs, config.train.patience, config.train.compact_groups = 6, 1, False
    sweep.run_sweep(config, os.path.join(workdir, "whole"))
    compaction.compaction_pays = lambda *args: True
    config.train.compact_groups = True
    sweep.run_sweep(config, os.path.join(workdir, "compacted"))


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """One CPU device and a compilation cache shared by this module's runs."""
    return helpers.cached_env(tmp_path_factory.mktemp("jax-cache"))


@pytest.fixture(scope="module")
def finished(env, tmp_path_factory):
    """(workdir, what it printed) of the sweep."""
    workdir = tmp_path_factory.mktemp("sweep")
    proc = helpers.spawn("sweep_test", "run", workdir, env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return workdir, proc.stdout


@pytest.fixture(scope="module")
def full(finished):
    return finished[0]


def _read(workdir, name="sweep.json") -> dict:
    return writers.read_json(os.path.join(workdir, name))


def _settings():
    """The setting names, written out by hand in grid order."""
    return [f"lr={r!r},wd={w!r}" for r in RATES for w in DECAYS]


def _coins():
    return [f"{s}@{name}" for s in SERIES for name in _settings()]


def test_the_whole_grid_trains_in_one_program(full):
    records = writers.MetricsLog(os.path.join(full, "sweep")).records()
    assert {r["group"] for r in records} == {"group-000"}
    assert all(r["series"] == _coins() and r["coins_computed"] == 8 for r in records)
    compiles = [c["program"] for c in _read(full, "timings.json")["compiles"]]
    assert compiles.count("jit(run_epoch)") == 1


def test_a_sweep_coin_trains_as_that_setting_alone(full, env, tmp_path):
    proc = helpers.spawn("sweep_test", "run_alone", tmp_path, env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    alone = writers.read_json(os.path.join(tmp_path, "alone.json"))[ALONE_SERIES]
    alone_name = "lr={learning_rate!r},wd={weight_decay!r}".format(**ALONE_SETTING)
    cell = _read(full)["series"][ALONE_SERIES]["settings"][alone_name]
    for field in ("status", "best_epoch", "epochs_run", "num_params"):
        assert alone[field] == cell[field], field
    # Another program (and schedule x lr_mult for the peak): equal up to float32 rounding,
    # the tolerance of the backtest's fold-alone test.
    assert alone["best_val_loss"] == pytest.approx(cell["best_val_loss"], rel=1e-5)
    for col in ("close", "high", "low"):
        got, want = alone["test"]["columns"][col], cell["test"]["columns"][col]
        assert got["mae"] == pytest.approx(want["mae"], rel=1e-5)
    p_alone, _ = checkpoint.load_series_model(os.path.join(tmp_path, "models", ALONE_SERIES))
    p_coin, _ = checkpoint.load_series_model(os.path.join(full, "sweep", "models", cell["coin"]))
    np.testing.assert_allclose(_flat(p_alone), _flat(p_coin), **helpers.CROSS_PROGRAM)
    # ... and each other setting of the same series, which starts from the same init,
    # ends elsewhere: each of its per-coin values reached the step.
    for name in _settings():
        if name != alone_name:
            path = os.path.join(full, "sweep", "models", f"{ALONE_SERIES}@{name}")
            other, _ = checkpoint.load_series_model(path)
            assert np.abs(_flat(other) - _flat(p_coin)).max() > 1e-4, name


def _flat(params) -> np.ndarray:
    return np.concatenate([np.ravel(leaf) for leaf in jax.tree.leaves(params)])


def test_series_choice_is_the_argmin_of_val_loss_from_metrics(full):
    out = _read(full)
    records = writers.MetricsLog(os.path.join(full, "sweep")).records()
    best = {}  # coin -> lowest val loss over its epochs (min_delta 0, baseline none)
    for r in records:
        for name, v in zip(r["series"], r["val_loss"], strict=True):
            best[name] = min(best.get(name, math.inf), v)
    for series in SERIES:
        by_setting = {name: best[f"{series}@{name}"] for name in _settings()}
        want = min(by_setting, key=by_setting.get)
        assert out["series"][series]["chosen"] == want
        for name, v in by_setting.items():
            assert out["series"][series]["settings"][name]["best_val_loss"] == pytest.approx(v)


def test_chosen_settings_are_published_as_the_run(full):
    out, results = _read(full), _read(full, "results.json")
    assert set(results["series"]) == set(SERIES)
    for series in SERIES:
        name = out["series"][series]["chosen"]
        cell = out["series"][series]["settings"][name]
        assert results["series"][series]["sweep"]["coin"] == cell["coin"]
        assert results["series"][series]["best_val_loss"] == cell["best_val_loss"]
        params, meta = checkpoint.load_series_model(os.path.join(full, "models", series))
        want, _ = checkpoint.load_series_model(os.path.join(full, "sweep", "models", cell["coin"]))
        np.testing.assert_array_equal(_flat(params), _flat(want))
        assert meta["series"] == series
        for field in ("learning_rate", "weight_decay"):
            assert meta["config"]["train"][field] == cell[field]
            assert meta["config"]["sweep"][field] == []


def test_the_choice_is_printed_and_each_setting_reported(finished):
    workdir, printed = finished
    out = _read(workdir)
    chosen = [out["series"][s]["chosen"] for s in SERIES]
    counts = {name: chosen.count(name) for name in _settings()}
    text = " ".join(printed.split())  # the console wraps long lines
    said = ", ".join(f"{n} by {c}" for n, c in counts.items() if c)
    assert f"Sweep choice (sweep.select=series, by each series' val loss): {said} series." in text
    with open(os.path.join(workdir, "report.md")) as f:
        md = f.read()
    assert "## Sweep" in md
    for name in _settings():
        losses = [out["series"][s]["settings"][name]["best_val_loss"] for s in SERIES]
        row = md.split(f"| {name} | ")[1].split("\n")[0].split(" | ")
        assert float(row[0]) == pytest.approx(float(np.median(losses)), rel=1e-3)
        assert int(row[2]) == counts[name]
    with open(os.path.join(workdir, "report.html")) as f:
        page = f.read()
    assert '<section id="sweep">' in page and 'id="sweep-table"' in page


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


def test_evaluate_mode_rescores_the_published_models(full, env, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(full, workdir)
    cmd = [sys.executable, "launch.py", "--mode=evaluate", f"--workdir={workdir}"]
    proc = subprocess.run(cmd, env=env, cwd=helpers.ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (evaluated,) = [f for f in os.listdir(workdir) if f.startswith("eval-") and f.endswith("json")]
    got, want = _read(workdir, evaluated)["series"], _read(full, "results.json")["series"]
    for series in SERIES:
        close = lambda e: e["test"]["columns"]["close"]["mae"]  # noqa: E731
        assert close(got[series]) == pytest.approx(close(want[series]), rel=1e-6)


def test_rerun_with_another_grid_is_refused(full):
    path = os.path.join(full, "sweep.json")
    with open(path, "rb") as f:
        before = f.read()
    config = sweep_config()
    config.sweep.learning_rate = (1e-3, 1e-2)
    with pytest.raises(ledger.RunMismatch):
        sweep.run_sweep(config, str(full))
    with open(path, "rb") as f:
        assert f.read() == before


def test_rerun_with_pooled_select_resumes_and_only_chooses_again(full, env, tmp_path):
    again = tmp_path / "again"
    shutil.copytree(full, again)
    proc = helpers.spawn("sweep_test", "run_pooled", again, env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "group-000 already finished" in proc.stderr
    a, b = _read(again), _read(full)
    assert a["sweep"] == {**b["sweep"], "select": "pooled"}
    for series in SERIES:  # the same trained coins
        assert a["series"][series]["settings"] == b["series"][series]["settings"]
    # The pooled choice, recomputed by a plain loop from sweep.json's val losses.
    ratios = {name: [] for name in _settings()}
    for series in SERIES:
        cells = b["series"][series]["settings"]
        low = min(cells[n]["best_val_loss"] for n in _settings())
        for name in _settings():
            ratios[name].append(cells[name]["best_val_loss"] / low)
    mean = {name: sum(r) / len(r) for name, r in ratios.items()}
    want = min(mean, key=mean.get)
    assert a["pooled_scores"] == pytest.approx(mean)
    assert {s: a["series"][s]["chosen"] for s in SERIES} == dict.fromkeys(SERIES, want)
    results = _read(again, "results.json")["series"]
    assert {s: results[s]["sweep"]["setting"] for s in SERIES} == dict.fromkeys(SERIES, want)


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


def test_a_pooled_sweep_trains_each_setting_as_one_pooled_model_alone(env, tmp_path):
    proc = helpers.spawn("sweep_test", "run_pooled_share", tmp_path / "sweep", env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = writers.MetricsLog(os.path.join(tmp_path, "sweep", "sweep")).records()
    groups = {r["group"]: r["series"] for r in records}
    # One group per setting in grid order, each holding every series at that setting ...
    assert list(groups.values()) == [[f"{s}@{name}" for s in SERIES] for name in _pooled_settings()]
    compiles = [c["program"] for c in _read(tmp_path / "sweep", "timings.json")["compiles"]]
    assert compiles.count("jit(run_epoch)") == 1  # ... all run by one compiled program.
    models = os.path.join(tmp_path, "sweep", "sweep", "models")
    flat = {}
    for name in _pooled_settings():  # Each setting is ONE model: its coins keep the same params.
        first, second = (
            checkpoint.load_series_model(os.path.join(models, f"{s}@{name}"))[0] for s in SERIES
        )
        np.testing.assert_array_equal(_flat(first), _flat(second))
        flat[name] = _flat(first)
    # The setting equals a pooled run with its values in config.train (another program's
    # schedule x lr_mult: equal up to float32 rounding), and every other setting differs.
    proc = helpers.spawn("sweep_test", "run_pooled_alone", tmp_path / "alone", env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    alone_name = "lr={learning_rate!r},wd={weight_decay!r}".format(**POOLED_ALONE)
    cells = _read(tmp_path / "sweep")["series"]
    alone = _read(tmp_path / "alone", "results.json")["series"]
    for series in SERIES:
        cell = cells[series]["settings"][alone_name]
        assert alone[series]["best_epoch"] == cell["best_epoch"] >= 1
        assert alone[series]["best_val_loss"] == pytest.approx(cell["best_val_loss"], rel=1e-5)
        for col in ("close", "high", "low"):
            got, want = alone[series]["test"]["columns"][col], cell["test"]["columns"][col]
            assert got["mae"] == pytest.approx(want["mae"], rel=1e-5)
    p_alone, _ = checkpoint.load_series_model(os.path.join(tmp_path, "alone", "models", SERIES[0]))
    # Adam's step on a param whose gradient is ~0 follows the gradient's rounding: with the
    # decay's L2 term one of 2281 params ended 2.4e-4 apart (of params ~0.3), so atol 1e-3.
    np.testing.assert_allclose(_flat(p_alone), flat[alone_name], rtol=1e-4, atol=1e-3)
    for name in _pooled_settings():
        if name != alone_name:
            assert np.abs(flat[name] - flat[alone_name]).max() > 1e-4, name


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


def test_coin_names_are_safe_file_names():
    setting = {"learning_rate": 3e-4, "weight_decay": 1e-5}
    name = sweep_grid.coin_name("BTCUSDT-1h", setting)
    assert name == "BTCUSDT-1h@lr=0.0003,wd=1e-05"
    assert os.path.basename(name) == name


def test_a_compacted_sweep_trains_and_chooses_as_the_whole_one(env, tmp_path):
    proc = helpers.spawn("sweep_test", "run_compacted", tmp_path, env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = writers.MetricsLog(os.path.join(tmp_path, "compacted", "sweep")).records()
    assert min(r["coins_computed"] for r in records) < 8  # the program did shrink
    whole, compacted = _read(tmp_path / "whole"), _read(tmp_path / "compacted")
    for series in SERIES:
        a, b = whole["series"][series], compacted["series"][series]
        assert a["chosen"] == b["chosen"]
        for name in _settings():
            for field in ("status", "best_epoch", "epochs_run"):
                assert a["settings"][name][field] == b["settings"][name][field], (name, field)
            # Another program size: equal up to float32 rounding (as the fold-alone test).
            want = a["settings"][name]["best_val_loss"]
            assert b["settings"][name]["best_val_loss"] == pytest.approx(want, rel=1e-5)
