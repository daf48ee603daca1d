"""The modes of launch.py, one module each: train (driver, with its plan and init_from),
sweep, backtest, evaluate, predict, export and serve."""
