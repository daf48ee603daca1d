"""Which windows the model's own fits read (config.eval.fit_days).

Two fits after training read the trained model's forecasts of the splits before the
scored one (train for val, train+val for test): the band refit (band_refit.py) and the
calibrated interval (intervals.fit_before). With eval.fit_days = D > 0 they read only the
windows of those splits that end within D days of the newest of them (never none), so
the train split is forecast only as far back as val's fits reach (`forecast_ends`). D = 0 reads every window of the splits before, as the fitted
baselines always do (baselines.fit_ends). Shapes (docs/design.md): N windows.
"""

from __future__ import annotations

import numpy as np

from cpbjax.score import baselines, forecast

DAY_MS = 86_400_000


def _since_ms(prep, split: str, days: float) -> int | None:
    """The first end time a fit for scoring `split` may read: `days` before the newest
    window of the splits before it; None reads every window."""
    newest = [prep.ends[s][-1] for s in baselines.SPLITS_BEFORE[split] if len(prep.ends[s])]
    if days <= 0 or not newest:
        return None
    return int(prep.open_time_ms[max(newest)]) - round(days * DAY_MS)


def _recent(prep, ends_N, since_ms):
    """The mask [N] of the windows ending at or after since_ms (all where None)."""
    if since_ms is None:
        return np.ones(len(ends_N), bool)
    return prep.open_time_ms[ends_N] >= since_ms


def forecast_ends(prep, split: str, days: float) -> np.ndarray:
    """The windows of `split` whose forecasts scoring reads: all but train's, of which the
    windows the val fits read (their test fits read none older)."""
    ends = prep.ends[split]
    if split != "train":
        return ends
    return ends[_recent(prep, ends, _since_ms(prep, "val", days))]


def before(split: str, prep, fcs: dict, days: float) -> dict:
    """The forecasts `fcs` (split -> forecast.SplitForecast) of the splits before `split`
    that its fits read: those ending within `days` days of the newest of them (of the
    splits `fcs` has: train is forecast only for a fit)."""
    since = _since_ms(prep, split, days)
    out = {}
    for s in (s for s in baselines.SPLITS_BEFORE[split] if s in fcs):
        keep_N = _recent(prep, fcs[s].ends_N, since)
        out[s] = forecast.SplitForecast(*(a[keep_N] for a in fcs[s]))
    return out
