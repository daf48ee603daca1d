"""Tests of --mode ablate: the settings' masks, separate models per setting, the verdict
against a hand computation from the per-setting results, the exit-2 line, and one tiny
end-to-end run (configs/mlp.py:covariates, 2 series, 1 epoch) in a subprocess."""

import importlib.util
import os
import statistics

import numpy as np
import pytest

from cpbjax import writers
from cpbjax.columns import COLUMNS
from cpbjax.config import schema as config_lib
from cpbjax.modes import ablate
from cpbjax.score import metrics, saved
from cpbjax.training import checkpoint
from tests import helpers

# configs/mlp.py:covariates' covariates, in its order.
COVARIATES = ("vol_signal", "flow", "noise", "price_transform")
SETTINGS = [
    "all",
    "none",
    "without-vol_signal",
    "without-flow",
    "without-noise",
    "without-price_transform",
]
SERIES = ("BTCUSDT-1h", "ETHUSDT-1h")
OVERRIDES = (
    "--config.data.symbols=('BTCUSDT','ETHUSDT')",
    "--config.data.intervals=('1h',)",
    "--config.train.epochs=1",
    "--config.eval.plots=False",
    "--config.eval.save_forecasts=True",
)


def _config(share="pooled"):
    """configs/mlp.py:covariates with the end-to-end run's overrides, train.share=`share`."""
    spec = importlib.util.spec_from_file_location(
        "mlp", os.path.join(helpers.ROOT, "configs/mlp.py")
    )
    mlp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mlp)
    c = mlp.get_config("covariates")
    c.data.symbols, c.data.intervals = ("BTCUSDT", "ETHUSDT"), ("1h",)
    c.train.epochs, c.train.share = 1, share
    return config_lib.validate(c)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """(workdir, stdout) of the tiny end-to-end ablate run."""
    workdir = tmp_path_factory.mktemp("ablate") / "run"
    env = helpers.subprocess_env()
    proc = helpers.run_launch(
        "--config=configs/mlp.py:covariates",
        "--mode=ablate",
        f"--workdir={workdir}",
        *OVERRIDES,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return str(workdir), proc.stdout


def _model(workdir, series, setting):
    path = os.path.join(workdir, "ablate", "models", f"{series}@{setting}")
    return checkpoint.load_series_model(path)[0]


def _covariate_rows(params) -> np.ndarray:
    """hidden_0's kernel rows [K, D] of the covariates: the MLP's network inputs end with
    the last candle's non-price columns (the K covariates last) and the log range."""
    kernel = np.asarray(params["hidden_0"]["kernel"])
    k = len(COVARIATES)
    return kernel[-1 - k : -1]


def test_the_settings_are_all_none_and_each_one_left_out():
    assert list(ablate.settings(COVARIATES)) == SETTINGS
    assert ablate.settings(COVARIATES)["without-noise"] == ("vol_signal", "flow", "price_transform")
    assert ablate.settings(("funding",)) == {"all": ("funding",), "none": ()}
    assert ablate.without("funding", ("funding",)) == "none"


def test_a_left_out_covariate_is_exactly_zero_in_its_coin_and_nothing_else_moves():
    config = _config()
    plan, names = ablate.plan_for(config, None)
    assert names == list(SERIES)
    coins = {c.name: c for c in plan.coins}
    assert sorted(coins) == sorted(f"{s}@{t}" for s in SERIES for t in SETTINGS)
    # One pooled group per setting: no two settings are in one model.
    assert [sorted({n.split("@")[1] for n in g}) for g in plan.group_names()] == [
        [t] for t in SETTINGS
    ]
    _check_masks(coins)


def test_per_series_ablation_has_every_setting_as_its_own_masked_coin():
    plan, names = ablate.plan_for(_config(share="series"), None)
    assert names == list(SERIES) and plan.pool_ends is None
    coins = {c.name: c for c in plan.coins}
    assert list(coins) == [f"{s}@{t}" for s in SERIES for t in SETTINGS]  # a series adjacent
    _check_masks(coins)


def _check_masks(coins: dict) -> None:
    """Each coin's covariate columns: its series' where kept, exactly 0 where left out;
    its features untouched."""
    for series in SERIES:
        full_TF = coins[f"{series}@all"].inputs
        first = full_TF.shape[1] - len(COVARIATES)
        assert (full_TF[:, first:] != 0).any(axis=0).all()
        for setting, kept in ablate.settings(COVARIATES).items():
            got_TF = coins[f"{series}@{setting}"].inputs
            for k, name in enumerate(COVARIATES):
                want = full_TF[:, first + k] if name in kept else 0.0
                np.testing.assert_array_equal(got_TF[:, first + k], want)
            np.testing.assert_array_equal(got_TF[:, :first], full_TF[:, :first])


def test_launch_without_covariates_exits_2_with_one_line(tmp_path):
    proc = helpers.run_launch(
        "--config=configs/mlp.py:tiny",
        "--mode=ablate",
        f"--workdir={tmp_path / 'run'}",
        jax_platforms="cpu",
    )
    last = helpers.exit_2_line(proc)
    assert last.startswith("error: --mode ablate needs data.covariates")
    assert not os.path.exists(tmp_path / "run")


def test_a_left_out_covariate_never_moves_its_first_layer_weights(finished):
    workdir, _ = finished
    entries = _entries(workdir)
    for series in SERIES:
        none_KD = _covariate_rows(_model(workdir, series, "none"))
        for k, name in enumerate(COVARIATES):
            left_out_KD = _covariate_rows(_model(workdir, series, f"without-{name}"))
            # Every setting starts from the same params: the rows of a covariate left out
            # are still the initial ones, which the "none" model also kept.
            np.testing.assert_array_equal(left_out_KD[k], none_KD[k])
            # A setting that reads it and kept a trained epoch (not its untrained
            # baseline: best_epoch None) moved them.
            readers = [
                t
                for t, kept in ablate.settings(COVARIATES).items()
                if name in kept and entries[series][t]["best_epoch"] is not None
            ]
            assert readers, (series, name)
            for t in readers:
                assert not np.array_equal(
                    _covariate_rows(_model(workdir, series, t))[k], none_KD[k]
                )


def test_settings_are_separate_models_each_pooled_over_the_series(finished):
    workdir, _ = finished
    entries = _entries(workdir)
    kernels = {t: [_model(workdir, s, t)["hidden_1"]["kernel"] for s in SERIES] for t in SETTINGS}
    for a, b in kernels.values():
        np.testing.assert_array_equal(a, b)  # one pooled model over both series
    # Settings that kept a trained epoch (not the untrained baseline they all start from)
    # trained params of their own.
    trained = [t for t in SETTINGS if entries[SERIES[0]][t]["best_epoch"] is not None]
    assert len(trained) >= 2, trained
    for i, s in enumerate(trained):
        for t in trained[i + 1 :]:
            assert not np.array_equal(kernels[s][0], kernels[t][0]), (s, t)


def _entries(workdir):
    return writers.read_json(os.path.join(workdir, "ablate.json"))["series"]


def test_the_window_losses_are_the_scored_forecasts(finished):
    workdir, _ = finished
    entries = _entries(workdir)
    for series in SERIES:
        for setting in SETTINGS:
            coin = f"{series}@{setting}"
            mae = saved.load_window_mae(os.path.join(workdir, "ablate"), coin)
            with np.load(os.path.join(workdir, "ablate", "forecasts", f"{coin}.npz")) as f:
                err = np.abs(f["predicted"] - f["actual"]).mean(axis=1)
            np.testing.assert_allclose(mae["test"], err, rtol=1e-12)
            for split in ("val", "test"):
                for c, col in enumerate(COLUMNS):
                    want = entries[series][setting][split]["columns"][col]["mae"]
                    assert mae[split][:, c].mean() == pytest.approx(want, rel=1e-9)


def _hand_gain(workdir, a, b, split, column):
    """(median points, significant count, worse count, {series: (points, p)}) by hand."""
    entries, run_dir = _entries(workdir), os.path.join(workdir, "ablate")
    per = {}
    for series in SERIES:
        skill_a = entries[series][a][split]["columns"][column]["skill"]
        skill_b = entries[series][b][split]["columns"][column]["skill"]
        loss_a = saved.load_window_mae(run_dir, f"{series}@{a}")[split][:, COLUMNS.index(column)]
        loss_b = saved.load_window_mae(run_dir, f"{series}@{b}")[split][:, COLUMNS.index(column)]
        p = metrics.diebold_mariano(loss_a, loss_b, 9)["p_value_better"]  # horizon 10
        per[series] = (100 * (skill_a - skill_b), p)
    ps = [p for _, p in per.values()]
    median = statistics.median(v for v, _ in per.values())
    return median, sum(p < 0.05 for p in ps), sum(p > 0.95 for p in ps), per


def test_results_ablate_section_matches_a_hand_computation(finished):
    workdir, _ = finished
    results = writers.read_json(os.path.join(workdir, "results.json"))
    got = results["ablate"]
    assert got["covariates"] == list(COVARIATES)
    assert sorted(results["series"]) == list(SERIES)
    entries = _entries(workdir)
    for setting in SETTINGS:
        for split in ("val", "test"):
            skills = [entries[s][setting][split]["columns"]["high"]["skill"] for s in SERIES]
            cell = got["by_setting"][setting][split]["high"]
            assert cell["vs_naive"] == pytest.approx(statistics.median(skills))
    compared = {**{n: (f"without-{n}", got["all_over_without"][n]) for n in COVARIATES}}
    compared["none"] = ("none", got["all_over_none"])
    for setting, gain in compared.values():
        for split in ("val", "test"):
            for column in ("high", "low", "close"):
                median, sig, worse, per = _hand_gain(workdir, "all", setting, split, column)
                cell = gain[split][column]
                assert cell["median_points"] == pytest.approx(median, abs=1e-9)
                assert (cell["significant_on"], cell["worse_on"]) == (sig, worse)
                for series, (points, p) in per.items():
                    assert cell["per_series"][series]["points"] == pytest.approx(points, abs=1e-9)
                    assert cell["per_series"][series]["p_value"] == pytest.approx(p)


def test_the_sentences_end_the_output_and_fill_the_report(finished):
    workdir, stdout = finished
    sentences = writers.read_json(os.path.join(workdir, "results.json"))["ablate"]["sentences"]
    assert stdout.strip().splitlines()[-len(sentences) :] == sentences
    assert any(s.startswith("vol_signal (val): high ") for s in sentences)
    assert any(s.startswith("all covariates (test): ") for s in sentences)
    with open(os.path.join(workdir, "report.md")) as f:
        md = f.read()
    with open(os.path.join(workdir, "report.html")) as f:
        page = f.read()
    assert "## Ablation" in md and sentences[1] in md
    assert 'id="ablate"' in page
