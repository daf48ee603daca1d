"""Scoring, in price units: forecasts of trained models (forecast, saved), the naive and
fitted baselines (metrics, baselines), calibrated intervals (intervals, band_refit), the
per-column fallback, a backtest's pooled scores and a pooled model on a new pair."""
