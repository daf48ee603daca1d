"""experiments/baseline_choice/band_har_mix.py scores the band and HAR exactly as results.json does
(evaluate's fitted baselines, on the same splits), and their geometric mean between them."""

import numpy as np
import pytest

from cpbjax.score import baselines, evaluate, metrics
from experiments.baseline_choice import band_har_mix
from tests.helpers import levers_preps

L, H = 30, 10


@pytest.mark.parametrize("split", ["val", "test"])
def test_band_and_har_skills_are_the_reported_ones(split):
    for prep in levers_preps():
        got = band_har_mix._skills(prep, split, L, H)
        ends = prep.ends[split]
        actual = metrics.next_candles(prep.ohlc, ends, H)
        persistence = metrics.naive_forecasts(prep.ohlc[ends], H)["persistence"]
        model_cols = metrics.score_prices(prep.ohlc[ends], actual, persistence)["columns"]
        blocks = baselines.fitted_baselines(prep, split, ends, evaluate.EvalSpec(L, H), model_cols)
        for method, block in (("band", "vol_band"), ("HAR", "har")):
            want = [blocks[block]["columns"][c]["skill"] for c in ("high", "low")]
            np.testing.assert_allclose(got[method], want, rtol=1e-9)
        forecasts = band_har_mix._forecasts(prep, split, L, H)
        for j in range(2):  # the mix's log forecast is the mean of the two
            mean_log = (np.log(forecasts["band"][j]) + np.log(forecasts["HAR"][j])) / 2
            np.testing.assert_allclose(np.log(forecasts["geometric mean"][j]), mean_log)
