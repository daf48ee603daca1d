"""cpbjax: short-horizon OHLC forecasting for crypto pairs, many models as one JAX program.

The Python API (cpbjax/api.py), loaded on first use so that `import cpbjax.score.metrics` needs
no jax:

    results = cpbjax.train("configs/gru.py:demo", "runs/demo")
    models = cpbjax.fit({"BTCUSDT-1h": candles_df})  # {series: Model}, trained on frames
    model = cpbjax.load("runs/demo/models/BTCUSDT-1h")
    forecast = model.predict(candles_df)
    folders = cpbjax.export("runs/demo")
"""

from cpbjax.version import __version__  # noqa: F401 (the package face names it)

_API = ("train", "fit", "load", "export", "Model")


def __getattr__(name: str):
    if name in _API:
        from cpbjax import api  # noqa: PLC0415 (deferred: it imports jax)

        return getattr(api, name)
    raise AttributeError(f"module 'cpbjax' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_API])
