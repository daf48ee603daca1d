"""The project's pairs: the mirror's symbols split into tuning and confirmation pairs.

The rule, fixed before any experiment (issue 42, "The protocol"): sort the 67 USDT
symbols of the shared Binance Vision mirror alphabetically; every fourth one (the 4th,
8th, 12th, ...: 0-based index % 4 == 3) is a *confirmation* pair, the others are
*tuning* pairs. Every choice (features, sizes, learning rates, defaults) is made on the
tuning pairs' validation split; the confirmation pairs' test split is reported once
per candidate default and never used to choose. `CONFIRMATION_SYMBOLS` and
`TUNING_SYMBOLS` are computed from `MIRROR_SYMBOLS` by that rule, so the rule is the code.

`data.symbols` accepts these lists by name: ("@tuning",), ("@confirmation",) or
("@mirror",) expands to the list when the config is validated (`expand`).
"""

from __future__ import annotations

# The 67 symbols of the mirror (its PROVENANCE.md), alphabetical.
MIRROR_SYMBOLS = (
    "ADAUSDT",
    "ALGOUSDT",
    "APEUSDT",
    "ARBUSDT",
    "ATOMUSDT",
    "AVAXUSDT",
    "AXSUSDT",
    "BATUSDT",
    "BNBUSDT",
    "BTCUSDT",
    "CAKEUSDT",
    "CHZUSDT",
    "COMPUSDT",
    "CRVUSDT",
    "DASHUSDT",
    "DOGEUSDT",
    "DOTUSDT",
    "DYDXUSDT",
    "EGLDUSDT",
    "ENAUSDT",
    "ENJUSDT",
    "EOSUSDT",
    "ETHUSDT",
    "FETUSDT",
    "FILUSDT",
    "FLOKIUSDT",
    "FLOWUSDT",
    "FTMUSDT",
    "GRTUSDT",
    "HBARUSDT",
    "ICPUSDT",
    "IMXUSDT",
    "INJUSDT",
    "IOTAUSDT",
    "KAVAUSDT",
    "KSMUSDT",
    "LINKUSDT",
    "LTCUSDT",
    "LUNAUSDT",
    "MANAUSDT",
    "MATICUSDT",
    "MKRUSDT",
    "NEARUSDT",
    "NEOUSDT",
    "OMUSDT",
    "OPUSDT",
    "PEPEUSDT",
    "RUNEUSDT",
    "SANDUSDT",
    "SHIBUSDT",
    "SNXUSDT",
    "SOLUSDT",
    "STXUSDT",
    "SUIUSDT",
    "SUSHIUSDT",
    "TAOUSDT",
    "THETAUSDT",
    "TIAUSDT",
    "UNIUSDT",
    "VETUSDT",
    "WLDUSDT",
    "XLMUSDT",
    "XMRUSDT",
    "XRPUSDT",
    "XTZUSDT",
    "ZECUSDT",
    "ZILUSDT",
)
CONFIRMATION_SYMBOLS = tuple(s for i, s in enumerate(sorted(MIRROR_SYMBOLS)) if i % 4 == 3)
TUNING_SYMBOLS = tuple(s for i, s in enumerate(sorted(MIRROR_SYMBOLS)) if i % 4 != 3)
# Kept for an independent check of the project's results: the project's evaluations
# never use them, in any form (they are not in the mirror, and no list here holds them).
HELD_OUT = ("AAVEUSDT", "TRXUSDT", "BCHUSDT", "ETCUSDT", "APTUSDT")

# data.symbols = (NAME,) with one of these names stands for the list.
NAMED_LISTS = {
    "@tuning": TUNING_SYMBOLS,
    "@confirmation": CONFIRMATION_SYMBOLS,
    "@mirror": MIRROR_SYMBOLS,
}


def expand(symbols) -> tuple:
    """`symbols` with a named list ("@tuning", "@confirmation", "@mirror") replaced by its
    symbols; any other tuple is returned as it is.

    Raises:
      ValueError: a name not in NAMED_LISTS, or a name given beside other entries.
    """
    names = [s for s in symbols if isinstance(s, str) and s.startswith("@")]
    if not names:
        return symbols
    if len(symbols) != 1 or names[0] not in NAMED_LISTS:
        raise ValueError(
            f"data.symbols={tuple(symbols)}: a named list stands alone, one of "
            f"{', '.join(repr((n,)) for n in NAMED_LISTS)}"
        )
    return NAMED_LISTS[names[0]]
