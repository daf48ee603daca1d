"""experiments/interval_scale/interval_scale_choice.py: its weight-0 interval IS the volatility band's
quantiles (so its skills are against the band results.json scores), and its rolling
origins never score a window before, or whose targets were, fitted."""

import numpy as np

from cpbjax.score import intervals, metrics
from experiments.interval_scale import interval_scale_choice as choice
from tests.helpers import levers_preps

L, H = 30, 10


def test_weight_zero_is_the_band_and_skills_are_against_it():
    prep = levers_preps()[0]
    fit_on, scored = np.concatenate([prep.ends["train"], prep.ends["val"]]), prep.ends["test"]
    loss, _ = choice._pinball_by_column(prep, fit_on, scored, L, H, (1.0, 0.0))
    k = intervals.fit_band_quantiles(prep.ohlc, fit_on, L, H, choice.LEVELS)
    band = intervals.band_quantiles(k, prep.ohlc, scored, L)
    actual = metrics.next_candles(prep.ohlc, scored, H)
    want = intervals.pinball(actual, band, choice.LEVELS).mean((0, 1, 3))
    np.testing.assert_allclose(loss, want, rtol=1e-12)
    skills = choice._skills(prep, [(fit_on, scored)], L, H)
    np.testing.assert_array_equal(skills[(1.0, 0.0)][0], np.zeros(4))
    blended, _ = choice._pinball_by_column(prep, fit_on, scored, L, H, (7.0, 0.25))
    np.testing.assert_allclose(skills[(7.0, 0.25)][0], 1 - blended / want, rtol=1e-12)


def test_rolling_folds_score_later_windows_only():
    prep = levers_preps()[0]
    folds = choice._rolling_folds(prep, H)
    assert len(folds) == choice.BLOCKS - 1
    for fit_on, scored in folds:
        assert fit_on.max() + H < scored.min()  # no scored target candle was a fitted one
        assert scored.max() <= prep.ends["val"].max() < prep.ends["test"].min()
