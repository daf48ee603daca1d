"""The fault matrix: bad input and damaged workdirs end in one clear line or a recorded reason.

Each row of FAULTS damages a copy of one finished tiny workdir (or gives a bad command),
runs launch.py on it, and checks the promise of docs/design.md "Reliability": exit 2 with
one `error:` line naming the bad thing and no traceback, or exit 0 with the reason
recorded; and after a failing rerun the finished files are byte-identical to before.
New faults become new rows.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import zipfile
from collections.abc import Callable

import numpy as np
import pytest

from cpbjax.data import parsing, synthetic
from cpbjax.score import forecast
from cpbjax.training import checkpoint
from tests import helpers
from tests.fake_data import damage_deflate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = (
    "--config=configs/gru.py:tiny",
    "--config.data.symbols=('BTCUSDT','ETHUSDT')",
    "--config.data.intervals=('1h',)",
    "--config.train.epochs=1",
    "--config.eval.plots=False",
    "--config.logging.progress=plain",
)
# What a failing rerun must leave byte-identical.
FINISHED = ("results.json", "config.json", "models", "checkpoints")


# Every launch.py run of the module at XLA -O0 with one persistent compilation cache: the
# rows run the same tiny programs, so only the first compiles them. What a row checks (an
# error line, a recorded reason, unchanged files) does not depend on code generation.
driver_env = helpers.driver_env


def _launch(env: dict, *args: str) -> subprocess.CompletedProcess:
    return helpers.run_launch(*args, env=env, timeout=300)


def _snapshot(workdir: str) -> dict[str, str]:
    """sha256 of every file under the finished paths of a workdir."""
    digests = {}
    for top in FINISHED:
        path = os.path.join(workdir, top)
        files = [path] if os.path.isfile(path) else []
        for root, _, names in os.walk(path):
            files += [os.path.join(root, n) for n in names]
        for f in files:
            with open(f, "rb") as fh:
                digests[os.path.relpath(f, workdir)] = hashlib.sha256(fh.read()).hexdigest()
    return digests


@pytest.fixture(scope="module")
def finished(tmp_path_factory, driver_env) -> str:
    workdir = str(tmp_path_factory.mktemp("finished") / "run")
    proc = _launch(driver_env, *TINY, f"--workdir={workdir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return workdir


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _edit_meta(model_dir: str, **fields) -> None:
    """Re-saves a saved model with meta.json's `fields` replaced, as a cpbjax that wrote
    them would (its manifest matches: an edit by hand is refused before these checks)."""
    params, meta = checkpoint.load_series_model(model_dir)
    checkpoint.save_series_model(model_dir, params, {**meta, **fields})


@dataclasses.dataclass(frozen=True)
class Fault:
    name: str
    args: tuple[str, ...]  # launch.py arguments; {w} is the damaged workdir's copy
    damage: Callable[[str], None] | None = None  # applied to the copy before the run
    exit_code: int = 2
    says: str = ""  # a fragment of the one error line (exit 2) or of stderr (exit 0)
    unchanged: bool = True  # the finished files must stay byte-identical
    check: Callable[[str], None] | None = None  # more checks of the workdir afterwards


def _skipped_in(path: str, series: str, fragment: str) -> Callable[[str], None]:
    def check(workdir: str) -> None:
        with open(os.path.join(workdir, path)) as f:
            assert fragment in json.load(f)["skipped"][series]

    return check


# A fresh run on a Binance Vision mirror of BTCUSDT and ETHUSDT whose damage step writes
# the mirror at {w}-mirror and spoils ETHUSDT's newest month (DAMAGED).
MIRROR_RUN = (
    *TINY,
    "--workdir={w}-fresh",
    "--config.data.source=binance",
    "--config.data.base_url={w}-mirror",
    "--config.data.cache_dir={w}-cache",
    "--config.data.months=2",
    "--config.data.end=2025-02",
)
DAMAGED = "ETHUSDT-1h-2025-02.zip"


def _mirror_with(spoil: Callable[[str], None]) -> Callable[[str], None]:
    def damage(workdir: str) -> None:
        root = workdir + "-mirror"
        synthetic.write_vision_mirror(root, ("BTCUSDT", "ETHUSDT"), ("1h",), ("2025-01", "2025-02"))
        spoil(os.path.join(root, "data/spot/monthly/klines/ETHUSDT/1h", DAMAGED))

    return damage


def _rewrite_rows(edit: Callable[[list[str]], None]) -> Callable[[str], None]:
    """A spoil step that edits the CSV lines of a zip and writes it with a matching CHECKSUM."""

    def spoil(path: str) -> None:
        with open(path, "rb") as f, zipfile.ZipFile(f) as z:
            lines = z.read(z.namelist()[0]).decode().splitlines()
        edit(lines)
        synthetic.write_zip(path, ("\n".join(lines) + "\n").encode())

    return spoil


def _huge_open_time(lines: list[str]) -> None:
    lines[100] = "99999999999999999999999" + lines[100][lines[100].index(",") :]


def _price_spike(lines: list[str]) -> None:
    times, ohlcv = parsing.read_kline_csv(lines[100].encode(), "row")
    ohlcv[:, :4] *= 1e300
    lines[100] = synthetic.kline_csv(times, ohlcv, "1h", True).decode().strip()


def _fresh_skipped(series: str, fragment: str) -> Callable[[str], None]:
    """Checks the fresh mirror run: `series` skipped with `fragment`, the other one trained."""

    def check(workdir: str) -> None:
        with open(workdir + "-fresh/results.json") as f:
            results = json.load(f)
        assert fragment in results["skipped"][series], results["skipped"]
        assert list(results["series"]) == ["BTCUSDT-1h"]
        assert np.isfinite(results["series"]["BTCUSDT-1h"]["best_val_loss"])

    return check


def _warned_in_results(fragment: str) -> Callable[[str], None]:
    def check(workdir: str) -> None:
        with open(os.path.join(workdir, "lr10", "results.json")) as f:
            series = json.load(f)["series"]
        assert series and all(fragment in e.get("warning", "") for e in series.values()), series

    return check


# A run whose data.base_url names a folder that does not exist.
NO_MIRROR = (*TINY, "--config.data.source=binance", "--config.data.base_url={w}-nowhere")


def _absent(path: str) -> None:
    assert not os.path.exists(path), os.listdir(path)


FAULTS = [
    Fault(
        "rerun_that_skips_every_series",
        (*TINY, "--workdir={w}", "--config.data.synthetic_candles=10"),
        says="is left as it was",
    ),
    Fault(
        "rerun_with_another_config",
        (*TINY, "--workdir={w}", "--config.train.epochs=2"),
        says="train.epochs: 1 -> 2",
    ),
    Fault(
        "corrupt_ledger",
        (*TINY, "--workdir={w}"),
        damage=lambda w: _write(os.path.join(w, "checkpoints", "groups.json"), '{"finger'),
        says="groups.json is damaged",
        unchanged=False,  # the damaged ledger itself is the one changed file
    ),
    Fault(
        "ledger_of_another_shape",
        (*TINY, "--workdir={w}"),
        damage=lambda w: _write(os.path.join(w, "checkpoints", "groups.json"), "[1, 2]"),
        says="groups.json is damaged",
        unchanged=False,
    ),
    Fault("missing_config_file", ("--config=configs/nope.py",), says="configs/nope.py"),
    Fault("unknown_variant", ("--config=configs/gru.py:huge", "--workdir={w}"), says="'huge'"),
    Fault(
        "workdir_is_a_file",
        (*TINY, "--workdir={w}/results.json"),
        says="cannot hold a run",
    ),
    Fault(
        "workdir_under_a_file",
        (*TINY, "--workdir={w}/config.json/sub"),
        says="cannot hold a run",
    ),
    Fault(
        "evaluate_with_nothing_to_score",
        ("--mode=evaluate", *TINY, "--workdir={w}", "--config.data.synthetic_candles=10"),
        says="no series could be evaluated",
    ),
    Fault(
        "predict_with_one_damaged_meta",
        ("--mode=predict", *TINY, "--workdir={w}"),
        damage=lambda w: _write(os.path.join(w, "models", "ETHUSDT-1h", "meta.json"), "{"),
        exit_code=0,
        unchanged=False,
        check=_skipped_in("forecast.json", "ETHUSDT-1h", "saved model unreadable"),
    ),
    Fault(
        "predict_with_a_malformed_interval_calibration",
        ("--mode=predict", *TINY, "--workdir={w}"),
        damage=lambda w: _edit_meta(
            os.path.join(w, "models", "ETHUSDT-1h"),
            interval_calibration={"levels": [0.1, 0.9], "k": [[0.0]]},
        ),
        exit_code=0,
        unchanged=False,
        check=_skipped_in("forecast.json", "ETHUSDT-1h", "interval_calibration k has shape (1, 1)"),
    ),
    Fault(
        "predict_with_every_meta_damaged",
        ("--mode=predict", *TINY, "--workdir={w}"),
        damage=lambda w: [
            _write(os.path.join(w, "models", s, "meta.json"), "{")
            for s in ("BTCUSDT-1h", "ETHUSDT-1h")
        ],
        says="no requested model could be read",
        unchanged=False,
    ),
    Fault(
        "finished_rerun_after_a_model_folder_was_deleted",
        (*TINY, "--workdir={w}", "--config.eval.plots=True"),
        damage=lambda w: shutil.rmtree(os.path.join(w, "models", "ETHUSDT-1h")),
        exit_code=0,
        says="ETHUSDT-1h: no test forecasts",
        unchanged=False,
    ),
    Fault(
        "mirror_month_with_damaged_deflate_and_matching_checksum",
        MIRROR_RUN,
        damage=_mirror_with(damage_deflate),
        exit_code=0,
        says=f"{DAMAGED}: damaged compressed data",
        check=_fresh_skipped("ETHUSDT-1h", f"{DAMAGED}: damaged compressed data"),
    ),
    Fault(
        "mirror_month_with_an_open_time_beyond_int64",
        MIRROR_RUN,
        damage=_mirror_with(_rewrite_rows(_huge_open_time)),
        exit_code=0,
        says=f"{DAMAGED}: a value does not fit in 64 bits",
        check=_fresh_skipped("ETHUSDT-1h", f"{DAMAGED}: a value does not fit in 64 bits"),
    ),
    Fault(
        "mirror_month_with_a_1e300_price_spike",
        MIRROR_RUN,
        damage=_mirror_with(_rewrite_rows(_price_spike)),
        exit_code=0,
        says="1 implausible price jump",
        check=_fresh_skipped("ETHUSDT-1h", "1 implausible price jump"),
    ),
    Fault(
        "learning_rate_of_10_is_flagged_not_silently_trained",
        (*TINY, "--workdir={w}/lr10", "--config.train.learning_rate=10"),
        exit_code=0,
        says="worse than not training",
        check=_warned_in_results("worse than not training"),
    ),
    Fault(
        "missing_mirror_folder_leaves_no_new_workdir",
        (*NO_MIRROR, "--workdir={w}-new/run"),
        says="-nowhere is not a directory",
        check=lambda w: _absent(w + "-new"),
    ),
    Fault(
        "missing_mirror_folder_on_a_finished_workdir",
        (*NO_MIRROR, "--workdir={w}"),
        says="-nowhere is not a directory",
    ),
    Fault(
        "save_forecasts_on_a_finished_rerun",
        (*TINY, "--workdir={w}", "--config.eval.save_forecasts=True"),
        exit_code=0,
        unchanged=False,  # config.json records save_forecasts=True, as it should
        check=lambda w: _reloaded_forecasts_have_intervals(w, ("BTCUSDT-1h", "ETHUSDT-1h")),
    ),
]


def _reloaded_forecasts_have_intervals(workdir: str, names) -> None:
    """Forecasts rebuilt for a finished run carry the interval its models were saved with."""
    for name in names:
        record = forecast.load_forecasts(os.path.join(workdir, "forecasts", f"{name}.npz"))
        _, meta = checkpoint.load_series_model(os.path.join(workdir, "models", name))
        np.testing.assert_array_equal(
            record["interval_levels"], meta["interval_calibration"]["levels"]
        )
        assert record["interval_bounds"].shape == (*record["predicted"].shape, 2)


@pytest.mark.slow
@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.name)
def test_fault(fault: Fault, finished: str, driver_env, tmp_path):
    workdir = str(tmp_path / "run")
    shutil.copytree(finished, workdir)
    if fault.damage:
        fault.damage(workdir)
    before = _snapshot(workdir)
    proc = _launch(driver_env, *(a.format(w=workdir) for a in fault.args))
    assert proc.returncode == fault.exit_code, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    if fault.exit_code == 2:
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, proc.stderr[-3000:]
        assert fault.says in errors[0], errors
    elif fault.says:
        assert fault.says in proc.stderr, proc.stderr[-3000:]
    if fault.unchanged:
        assert _snapshot(workdir) == before
    if fault.check:
        fault.check(workdir)
