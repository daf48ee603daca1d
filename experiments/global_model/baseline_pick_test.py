"""experiments/global_model/baseline_pick.py: the per-series choice on val and its test
score, against a plain loop over made-up series."""

import numpy as np

from experiments.global_model import baseline_pick


def _entry(model, band, har):
    """One split of a results.json series entry with these high skills (fractions)."""
    return {
        "columns": {"high": {"skill": model}},
        "vol_band": {"columns": {"high": {"skill": band}}},
        "har": {"columns": {"high": {"skill": har}}},
    }


def test_picks_match_a_plain_loop():
    rng = np.random.default_rng(0)
    val, test = rng.normal(0.04, 0.01, (7, 3)), rng.normal(0.04, 0.01, (7, 3))
    series = {f"S{i}-1h": {"val": _entry(*val[i]), "test": _entry(*test[i])} for i in range(7)}
    series["LATE-1h"] = {"test": _entry(1.0, 0.0, 0.0)}  # no val: not scored
    got = baseline_pick.picks({"series": series}, "high")
    pick3, pick2, har_share = [], [], 0
    for v, t in zip(val, test, strict=True):
        best = max(range(3), key=lambda j: v[j])
        pick3.append(t[best] - t[1])
        pick2.append((t[2] if v[2] > v[1] else t[1]) - t[1])
        har_share += best == 2
    assert got["series"] == 7
    assert got["pick3"] == round(100 * float(np.median(pick3)), 2)
    assert got["pick_band_har"] == round(100 * float(np.median(pick2)), 2)
    assert got["model"] == round(100 * float(np.median(test[:, 0] - test[:, 1])), 2)
    assert got["HAR"] == round(100 * float(np.median(test[:, 2] - test[:, 1])), 2)
    assert got["share_HAR"] == round(har_share / 7, 2)
