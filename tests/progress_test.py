"""The count and ETA that evaluation, plots and export log as their series finish."""

from __future__ import annotations

from cpbjax import progress
from cpbjax.score import evaluate


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "absl"]


def test_count_and_eta_at_most_every_interval(monkeypatch, caplog):
    clock = _Clock()
    monkeypatch.setattr(progress.time, "monotonic", clock)
    caplog.set_level("INFO")
    counted = progress.Counted("evaluate", 10)
    clock.now += 2.0
    counted.advance()  # 2 s in: too soon for a line
    clock.now += 4.0
    counted.advance()  # 6 s in, 2 of 10 done: 3 s each, 8 left
    clock.now += 1.0
    counted.advance()  # 1 s after the last line: none
    clock.now += 8.0
    counted.advance(7)  # all done: no ETA line, the finish line says it
    counted.finish()
    assert _lines(caplog) == [
        "evaluate: 2/10 series, ETA 24 s",
        "evaluate: 10 series in 15.0 s",
    ]


def test_a_single_item_logs_nothing(caplog):
    caplog.set_level("INFO")
    counted = progress.Counted("export", 1)
    counted.advance()
    counted.finish()
    assert _lines(caplog) == []


def test_map_series_counts_every_job_in_order(monkeypatch, caplog):
    caplog.set_level("INFO")
    monkeypatch.setattr(evaluate, "SCORING_THREADS", 2)
    assert evaluate.map_series(lambda j: j * j, list(range(7))) == [j * j for j in range(7)]
    assert _lines(caplog)[-1].startswith("evaluate: 7 series in ")
