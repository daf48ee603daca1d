"""experiments/global_model/heldout.py: a run's skill on the held-out span is the plain
computation on the windows whose targets all open before the end, and nothing later."""

import numpy as np

from experiments.global_model import heldout

H, N = 10, 300
HOUR_MS = 3_600_000


def _write_run(folder, name, predicted, actual, last, target_ms):
    (folder / "forecasts").mkdir(parents=True, exist_ok=True)
    np.savez(
        folder / "forecasts" / f"{name}.npz",
        series=np.array(name),
        last_candle=last,
        actual=actual,
        predicted=predicted,
        target_open_time_ms=target_ms,
    )


def _plain_skill(pred, actual, last, col):
    """1 - MAE / MAE of the better of persistence and the last candle, in %."""
    mae = np.abs(pred[..., col] - actual[..., col]).mean()
    persistence = np.abs(last[:, None, 3] - actual[..., col]).mean()
    last_candle = np.abs(last[:, None, col] - actual[..., col]).mean()
    return 100 * (1 - mae / min(persistence, last_candle))


def _windows(seed):
    """N hourly windows: last candles, actual targets, their open times, and a forecast
    halfway between the last close and the actual (skill > 0)."""
    rng = np.random.default_rng(seed)
    last = 100 + rng.normal(size=(N, 4))
    actual = last[:, None, 3:4] + rng.normal(size=(N, H, 4))
    target_ms = (np.arange(N)[:, None] + np.arange(1, H + 1)[None, :]) * HOUR_MS
    good = last[:, None, 3:4] + 0.5 * (actual - last[:, None, 3:4])
    return last, actual, target_ms, good


def test_held_out_skill_scores_only_windows_before_the_end(tmp_path):
    last, actual, target_ms, good = _windows(0)
    # After the end the forecast is wrecked: a score that used those windows would show it.
    good[200:] += 50.0
    _write_run(tmp_path / "a", "BTCUSDT-1h", good, actual, last, target_ms)
    end_ms = int(target_ms[150].max()) + 1  # windows 0..150 end before it
    got = heldout.held_out_skills(str(tmp_path / "a"), end_ms)["BTCUSDT-1h"]
    keep = slice(0, 151)
    for col, name in ((1, "high"), (2, "low"), (3, "close")):
        want = _plain_skill(good[keep], actual[keep], last[keep], col)
        np.testing.assert_allclose(got[name], want, rtol=1e-12)
        assert got[name] > 0


def test_a_span_with_a_start_scores_only_windows_whose_targets_all_open_inside_it(tmp_path):
    last, actual, target_ms, good = _windows(1)
    good[:100] += 50.0  # before the start and after the end the forecast is wrecked
    good[260:] += 50.0
    _write_run(tmp_path / "a", "BTCUSDT-1h", good, actual, last, target_ms)
    start_ms = int(target_ms[100].min())  # window 100's first target opens at the start
    end_ms = int(target_ms[250].max()) + 1
    got = heldout.held_out_skills(str(tmp_path / "a"), end_ms, start_ms)["BTCUSDT-1h"]
    keep = slice(100, 251)
    for col, name in ((1, "high"), (2, "low"), (3, "close")):
        want = _plain_skill(good[keep], actual[keep], last[keep], col)
        np.testing.assert_allclose(got[name], want, rtol=1e-12)
