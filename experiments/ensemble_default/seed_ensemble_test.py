"""experiments/ensemble_default/seed_ensemble.py: members scored as their runs were, and their geometric mean."""

import itertools
import os

import numpy as np
import pytest

import cpbjax
from cpbjax.config import schema as config_lib
from cpbjax.data import synthetic
from cpbjax.score import forecast
from experiments import ablation
from experiments.ensemble_default import seed_ensemble
from tests import fake_data

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(workdirs, mirror): the tiny GRU trained at seeds 0 and 1 on two series."""
    root = tmp_path_factory.mktemp("ensemble")
    mirror = str(root / "mirror")
    synthetic.write_vision_mirror(
        mirror, ("BTCUSDT", "ETHUSDT"), ("1h",), fake_data.last_complete_months(2)
    )
    workdirs = []
    for seed in (0, 1):
        c = config_lib.load(os.path.join(ROOT, "configs/gru.py:tiny"))
        c.data.source, c.data.base_url, c.data.months = "binance", mirror, 2
        c.data.symbols, c.data.intervals = ("BTCUSDT", "ETHUSDT"), ("1h",)
        c.train.epochs, c.eval.plots, c.seed = 2, False, seed
        c.train.min_delta = 0.0  # keep any val gain, so that the seeds' models differ
        workdirs.append(str(root / f"seed{seed}"))
        cpbjax.train(c, workdirs[-1])
    return workdirs, mirror


def test_the_geometric_mean_is_the_mean_of_log_prices_window_by_window():
    rng = np.random.default_rng(0)
    fcs = [
        forecast.SplitForecast(
            np.arange(3), rng.uniform(1, 2, (3, 2, 4)), rng.normal(size=(3, 2, 4)).astype("f4")
        )
        for _ in range(3)
    ]
    got = seed_ensemble.geometric_mean(fcs)
    for i, h, c in np.ndindex(3, 2, 4):
        want = np.prod([f.prices_NHC[i, h, c] for f in fcs]) ** (1 / 3)
        assert got.prices_NHC[i, h, c] == pytest.approx(want, rel=1e-12)
    np.testing.assert_allclose(got.norm_NHC, np.mean([f.norm_NHC for f in fcs], axis=0))
    moved = forecast.SplitForecast(np.arange(1, 4), fcs[0].prices_NHC, fcs[0].norm_NHC)
    with pytest.raises(ValueError, match="different windows"):
        seed_ensemble.geometric_mean([fcs[0], moved])


def test_members_score_as_their_runs_did_and_an_ensemble_of_one_is_that_member(runs):
    workdirs, mirror = runs
    rows = seed_ensemble.main([*workdirs, "--base-url", mirror, "--records-dir", ""])
    assert [r["lever"] for r in rows] == [*workdirs, "geometric mean"]
    for workdir, row in zip(workdirs, rows[:-1], strict=True):
        assert row == ablation.summarise(workdir, workdir)
    preps, fcs, (L, H) = seed_ensemble.member_forecasts(workdirs[0], mirror, None)
    alone = {n: {s: seed_ensemble.geometric_mean([f[s]]) for s in f} for n, f in fcs.items()}
    got, want = seed_ensemble.score(preps, alone, L, H), seed_ensemble.score(preps, fcs, L, H)
    for name, split in itertools.product(want, ("val", "test")):
        for col, scores in want[name][split]["columns"].items():
            assert got[name][split]["columns"][col]["mae"] == pytest.approx(
                scores["mae"], rel=1e-12
            )
