"""Market data: sources (Binance Vision, local files, synthetic), parsing, features, windows.

`sources.load_all(config.data)` returns validated `Series` records and the skip
reason of every series that could not be used (`binance` with its `mirrors` and
download `progress`, `synthetic`, local files; all through `parsing`); `windows`
turns them into leak-free windows on the device, with `features` and `normalize`.
"""

from cpbjax.data.series import Series, SeriesSkipped

__all__ = ["Series", "SeriesSkipped"]
