"""cpbjax: short-horizon OHLC forecasting for crypto pairs, many models as one JAX program."""

__version__ = "0.1.0"
