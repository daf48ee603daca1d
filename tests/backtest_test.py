"""Tests of --mode backtest: fold geometry without leaks, folds as coins, resume.

One backtest of 2 tiny series x 3 folds runs once in a subprocess (module fixture) with
the driver tests' persistent compilation cache at XLA optimisation level 0; the other
runs (one fold alone, a killed and resumed backtest) reuse its compiled programs.
"""

import dataclasses
import html.parser
import os
import signal

import numpy as np
import pytest
from absl import logging

from cpbjax import writers
from cpbjax.data import folds, sources, windows
from cpbjax.modes import backtest
from cpbjax.report import backtest_tables, plots
from cpbjax.report import html_page as report_html
from cpbjax.report import spec as report_spec
from cpbjax.score import backtest_scores, metrics
from cpbjax.training import ledger
from tests import helpers

FOLDS = 3
SERIES = ("BTCUSDT-1h", "ETHUSDT-1h")  # x 3 folds: 6 coins, in groups of 4 and 2
ALONE = "ETHUSDT-1h@fold1"  # the fold trained again on its own
KILL_GROUP, KILL_EPOCH = "group-001", 2


def backtest_config():
    """helpers.tiny_config's GRU (300 candles, 1 layer of 16), 2 series, 3 folds, 3 epochs."""
    c = helpers.tiny_config()
    c.data.symbols = tuple(s.split("-")[0] for s in SERIES)
    c.train.epochs, c.train.patience = 3, 3
    c.ckpt.every_epochs = 1
    c.backtest.folds = FOLDS
    return c


def run(workdir: str) -> None:
    logging.set_verbosity(logging.INFO)  # the resume test reads what was skipped
    backtest.run_backtest(backtest_config(), workdir)


def run_alone(workdir: str) -> None:
    """Trains the fold ALONE as the only coin of a run, through the same driver."""
    from cpbjax.modes import driver, plan
    from cpbjax.report.runlog import StageClock

    config = backtest_config()
    preps = [p for p in fold_preps(config) if p.name == ALONE]
    alone = plan.chunked(config, preps, keep_models=False)
    entries, _ = driver.train_groups(config, workdir, alone, StageClock())
    writers.write_json(os.path.join(workdir, "alone.json"), entries)


def run_killed(workdir: str) -> None:
    """The backtest, SIGKILLed right after KILL_GROUP saved its epoch KILL_EPOCH checkpoint."""
    from cpbjax.training import checkpoint

    save = checkpoint.GroupCheckpoints.maybe_save

    def save_then_die(self, epoch, state, force=False):
        saved = save(self, epoch, state, force)
        if epoch == KILL_EPOCH and self.directory.endswith(KILL_GROUP):
            self.close()
            os.kill(os.getpid(), signal.SIGKILL)
        return saved

    checkpoint.GroupCheckpoints.maybe_save = save_then_die
    run(workdir)


def fold_preps(config, series=None):
    """The fold PreparedSeries of `series` (default: the config's synthetic series)."""
    series = series if series is not None else sources.load_all(config.data)[0]
    return folds.prepare_all(series, config.data, config.backtest)[0]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """One CPU device and a compilation cache shared by this module's runs."""
    return helpers.cached_env(tmp_path_factory.mktemp("jax-cache"))


@pytest.fixture(scope="module")
def finished(env, tmp_path_factory):
    """(workdir, what it printed) of the backtest."""
    workdir = tmp_path_factory.mktemp("backtest")
    proc = helpers.spawn("backtest_test", "run", workdir, env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return workdir, proc.stdout


@pytest.fixture(scope="module")
def full(finished):
    return finished[0]


def _read(workdir) -> dict:
    return writers.read_json(os.path.join(workdir, "backtest.json"))


def _assert_same_backtest(a, b, where="") -> None:
    """Equal backtest.json trees: every count, name, status and epoch exactly, every float
    to rel 1e-5. A resumed group restarts at its full program size and compacts again only
    after an epoch, so its last epochs may run in another program than the uninterrupted
    run's (as in a train run, tests/compaction_test.py): equal up to float32 rounding."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            if k not in ("started", "wall_seconds"):
                _assert_same_backtest(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same_backtest(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and not isinstance(b, (str, type(None))):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-9), where
    else:
        assert a == b, where


def test_backtest_json_holds_every_fold_in_time_order(full):
    out = _read(full)
    assert set(out) == {"run", "backtest", "series", "pooled", "skipped"}
    assert out["skipped"] == {} and set(out["series"]) == set(SERIES)
    # The last fold's test block is exactly a train run's test split.
    whole = {
        p.name: p
        for p in windows.prepare_all(
            sources.load_all(backtest_config().data)[0], backtest_config().data
        )[0]
    }
    for name, entry in out["series"].items():
        assert [f["fold"] for f in entry["folds"]] == list(range(FOLDS))
        tests = [f["blocks"]["test"] for f in entry["folds"]]
        for earlier, later in zip(tests, tests[1:], strict=False):
            assert earlier["last_window_end"] < later["first_window_end"]
        test = whole[name].ends["test"]
        assert tests[-1]["windows"] == len(test)
        assert tests[-1]["last_window_end"] == entry["folds"][-1]["test"]["last_window_end"]
        assert entry["pooled"]["windows"] == sum(t["windows"] for t in tests)
    assert out["pooled"]["series"] == len(SERIES)
    assert os.path.exists(os.path.join(full, "backtest.md"))
    # A backtest writes no train-run file: results.json and models/ stay a train run's.
    assert not os.path.exists(os.path.join(full, "results.json"))
    assert not os.path.exists(os.path.join(full, "models"))
    assert not os.path.exists(os.path.join(full, "backtest", "models"))


def test_pooled_baselines_are_the_folds_own_fits(full):
    # Each fold's evaluate entry scores the band and HAR refit on that fold; the pooled
    # figures refit them again from the forecasts files. Their MAE over the concatenated
    # folds is the window-weighted mean of the folds' MAEs.
    out = _read(full)
    for entry in out["series"].values():
        n = [f["blocks"]["test"]["windows"] for f in entry["folds"]]
        for name in ("vol_band", "har"):
            for col in ("high", "low"):
                maes = [f["test"][name]["columns"][col]["mae"] for f in entry["folds"]]
                pooled = entry["pooled"]["columns"][col][name]
                assert pooled["mae"] == pytest.approx(np.average(maes, weights=n), rel=1e-9)
    for col in ("high", "low"):
        har = out["pooled"]["columns"][col]["har"]
        assert set(har["dm"]) == {"1h"} and har["dm"]["1h"]["p_value_better"] is not None


def _perturbed_from(series, first_ms: int):
    """A copy of `series` whose candles from open time `first_ms` on are 1.37x (volume too)."""
    ohlcv = series.ohlcv.copy()
    ohlcv[series.open_time_ms >= first_ms] *= 1.37
    return dataclasses.replace(series, ohlcv=ohlcv)


def test_no_fold_trains_on_candles_from_its_test_block():
    config = backtest_config()
    H = config.data.horizon
    series = sources.load_all(config.data)[0]
    for prep in fold_preps(config, series):
        first_end = int(prep.ends["test"][0])
        # Purged as windows.split_ends: every train/val target comes before the test
        # block's first window's last input candle, so before its first target.
        for split in ("train", "val"):
            assert (prep.ends[split] + H < first_end).all(), (prep.name, split)
        assert prep.ends["train"][-1] < prep.ends["val"][0] < prep.ends["val"][-1] < first_end
        # Changing every candle from the first target on changes nothing training reads.
        source = next(s for s in series if s.name == folds.series_of(prep.name))
        changed = _perturbed_from(source, int(prep.open_time_ms[first_end + 1]))
        again = next(p for p in fold_preps(config, [changed]) if p.name == prep.name)
        read = int(prep.ends["val"][-1]) + H + 1  # every candle a train or val window reads
        for split in ("train", "val"):
            np.testing.assert_array_equal(again.ends[split], prep.ends[split])
        for field in ("inputs", "targets", "anchor"):
            np.testing.assert_array_equal(getattr(again, field)[:read], getattr(prep, field)[:read])
        for key in ("feature_mean", "feature_std", "log_p0"):
            np.testing.assert_array_equal(again.norm[key], prep.norm[key])
        assert not np.array_equal(again.ohlc[first_end + 1 :], prep.ohlc[first_end + 1 :])


def test_folds_that_do_not_fit_are_skipped_with_their_reason():
    config = backtest_config()
    config.backtest.folds = 6
    series = sources.load_all(config.data)[0][:1]
    preps, skipped = folds.prepare_all(series, config.data, config.backtest)
    name = series[0].name
    assert [p.name for p in preps] == [folds.fold_name(name, f) for f in range(2, 6)]
    assert "does not fit" in skipped[folds.fold_name(name, 0)]
    assert "fewer than its val block" in skipped[folds.fold_name(name, 1)]
    # Sliding: the newest backtest.window train windows of the expanding fold.
    config.backtest.window, config.backtest.min_train_windows = 20, 20
    sliding = {p.name: p for p in folds.prepare_all(series, config.data, config.backtest)[0]}
    assert folds.fold_name(name, 1) not in sliding  # 17 windows: still too few
    for a in preps:
        np.testing.assert_array_equal(sliding[a.name].ends["train"], a.ends["train"][-20:])
        np.testing.assert_array_equal(sliding[a.name].ends["test"], a.ends["test"])


def test_fold_coin_trains_as_that_fold_alone(full, env, tmp_path):
    proc = helpers.spawn("backtest_test", "run_alone", tmp_path, env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    alone = writers.read_json(os.path.join(tmp_path, "alone.json"))[ALONE]
    fold = next(
        f for f in _read(full)["series"][folds.series_of(ALONE)]["folds"] if f["name"] == ALONE
    )
    for field in ("status", "best_epoch", "epochs_run", "num_params"):
        assert alone[field] == fold[field], field
    # One coin is another program than a group: equal up to float32 rounding.
    assert alone["best_val_loss"] == pytest.approx(fold["best_val_loss"], rel=1e-5)
    for col in ("close", "high", "low"):
        got, want = alone["test"]["columns"][col], fold["test"]["columns"][col]
        assert got["mae"] == pytest.approx(want["mae"], rel=1e-5)


def test_killed_backtest_resumes_to_the_same_backtest_json(full, env, tmp_path):
    killed = helpers.spawn("backtest_test", "run_killed", tmp_path, env)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert not os.path.exists(os.path.join(tmp_path, "backtest.json"))
    resumed = helpers.spawn("backtest_test", "run", tmp_path, env)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "group-000 already finished" in resumed.stderr
    assert f"{KILL_GROUP}: resuming after epoch {KILL_EPOCH}" in resumed.stderr
    _assert_same_backtest(_read(tmp_path), _read(full))


def test_rerun_with_other_folds_is_refused_and_changes_nothing(full):
    path = os.path.join(full, "backtest.json")
    with open(path, "rb") as f:
        before = f.read()
    config = backtest_config()
    config.backtest.folds = 2
    with pytest.raises(ledger.RunMismatch, match="backtest.folds: 3 -> 2"):
        backtest.run_backtest(config, str(full))
    with open(path, "rb") as f:
        assert f.read() == before


def test_panel_dm_tests_the_cross_series_mean_at_each_time():
    rng = np.random.default_rng(0)
    times = np.arange(40) * 60
    a = (times, rng.random(40), rng.random(40))
    b = (times[5:], rng.random(35), rng.random(35))  # starts later: alone for 5 windows
    got = backtest_scores.panel_dm([a, b], lag=2)
    model, ref = [], []
    for t in times:  # the plain reference: average the series with a window at t
        present = [p for p in (a, b) if t in p[0]]
        idx = [int(np.flatnonzero(p[0] == t)[0]) for p in present]
        model.append(np.mean([p[1][j] for p, j in zip(present, idx, strict=True)]))
        ref.append(np.mean([p[2][j] for p, j in zip(present, idx, strict=True)]))
    want = metrics.diebold_mariano(np.array(model), np.array(ref), 2)
    assert got["statistic"] == pytest.approx(want["statistic"], rel=1e-12)
    assert got["n"] == 40 and got["series"] == 2


class _TableCells(html.parser.HTMLParser):
    """The text of every <td> of the table with id `table_id`, row by row."""

    def __init__(self, table_id: str):
        super().__init__()
        self.table_id, self.inside, self.rows = table_id, False, []

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.inside = dict(attrs).get("id") == self.table_id
        elif self.inside and tag == "tr":
            self.rows.append([])
        elif self.inside and tag == "td":
            self.rows[-1].append("")

    def handle_endtag(self, tag):
        if tag == "table":
            self.inside = False

    def handle_data(self, data):
        if self.inside and self.rows and self.rows[-1]:
            self.rows[-1][-1] += data


def test_backtest_html_shows_the_fold_and_pooled_tables_and_the_fold_chart(full, tmp_path):
    out = _read(full)
    with open(os.path.join(full, "backtest.html")) as f:
        page = f.read()
    for table_id, rows in (
        ("folds-table", backtest_tables.fold_rows(out)),
        ("pooled-table", backtest_tables.pooled_rows(out)),
    ):
        parser = _TableCells(table_id)
        parser.feed(page)
        assert [r for r in parser.rows if r] == rows, table_id
    assert len(backtest_tables.fold_rows(out)) == FOLDS
    # The chart's per-fold means are the fold table's skill columns.
    for col, cell in (("close", 4), ("high", 5), ("low", 6)):
        by_fold = plots.fold_skills(out, col)
        for row in backtest_tables.fold_rows(out):
            assert f"{100 * np.mean(by_fold[int(row[0])]):+.2f}" == row[cell]
    chart = plots.plot_fold_skill(str(tmp_path / "fold_skill.png"), out)
    with open(chart, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    page = report_html.render_backtest_html(out, report_spec.make_spec(backtest_config()), chart)
    assert page.count("data:image/png;base64,") == 1
    assert 'href="#s-' not in page  # the folds' "series" column is a count, not a link


def test_a_backtest_prints_its_pooled_skill_and_the_paths_it_wrote(finished):
    workdir, printed = finished
    pooled = _read(workdir)["pooled"]
    lines = printed.splitlines()
    assert "…" not in printed
    for col, refs in pooled["columns"].items():
        for ref, r in refs.items():
            rows = [line.split() for line in lines if line.split()[:2] == [col, ref]]
            if ref == "ridge":
                assert rows == []  # in backtest.md, not printed
                continue
            (p,) = (t["p_value_better"] for t in r["dm"].values())  # one interval, 1h
            mean, median = f"{100 * r['mean_skill']:+.2f}", f"{100 * r['median_skill']:+.2f}"
            assert rows == [
                [col, ref, mean, median, str(r["positive"]), "of", "2", "1h", f"{p:.3g}"]
            ]
    text = " ".join(printed.split())
    for name in ("backtest.json", "backtest.md", "backtest.html"):
        assert os.path.join(str(workdir), name) in text


def test_fold_choice_chooses_on_earlier_folds_and_reports_the_last(full):
    from experiments import fold_choice

    out = _read(full)
    (row,) = fold_choice.rows({"gru": str(full)})

    def median(fold, col, block=None):
        got = []
        for entry in out["series"].values():
            test = entry["folds"][fold]["test"]
            got.append((test[block] if block else test)["columns"][col]["skill"])
        return round(100 * float(np.median(got)), 2)

    assert row["series"] == {f: len(SERIES) for f in range(FOLDS)}
    for f in range(FOLDS - 1):
        assert row["folds"][f] == {c: median(f, c) for c in ("close", "high", "low")}
    every = [median(f, c) for f in range(FOLDS - 1) for c in ("close", "high", "low")]
    assert row["choice"] == round(float(np.mean(every)), 2)
    assert row["last"] == {c: median(FOLDS - 1, c) for c in ("close", "high", "low")}
    assert row["band"] == {c: median(FOLDS - 1, c, "vol_band") for c in ("high", "low")}
    for f in range(FOLDS - 1):
        for block in ("vol_band", "har"):
            want = {c: median(f, c, block) for c in ("high", "low")}
            assert row["fitted"][f][block] == want
