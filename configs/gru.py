"""GRU seq2seq with simple attention pooling. The body is the default run on real data,
each value with the reason it was chosen; VARIANTS below are named changes of it.

Variants (`configs/gru.py:<variant>`): `demo` and `tiny` (synthetic series and per-series
models small enough for a 2-core CPU) and `replaced` (the replaced system's model,
schedule and objective on the real data); cpbjax/config/schema.py `apply_variant` adds the data
and objective parts that every model's variant shares.
"""

from cpbjax.config import schema as config_lib


def get_config(arg=None):
    c = config_lib.base_config()
    c.model.name = "gru"
    c.model.hidden = 128  # GRU state width of encoder and decoder, as the replaced system's.
    c.model.num_layers = 2  # Stacked GRU layers in encoder and decoder, as the replaced system's.
    c.model.dropout = 0.3  # Dropout between stacked layers, as the replaced system's.
    # The defaults of base_config stay for: model.ensemble (one model: ensembles were
    # measured on the transformer only) and model.window_scale (raw windows: for the GRU
    # the window's range scale tied, val mean skill 2.80 against 2.77, one seed, and its
    # default-size figures were measured without it; experiments/window_scale).
    # ONE model for every series of the run: at default size on the 40 real series it
    # scored above per-series models on the earlier folds of a 3-fold backtest, three seeds,
    # and meets the issue #13 accuracy targets on test (experiments/pooled_or_series). Per-series models were tuned at 1e-3: pass
    # --config.train.learning_rate=1e-3 with --config.train.share=series.
    c.train.share = "pooled"
    c.train.learning_rate = 3e-4
    c.train.optimizer = "adam"  # The replaced system's optimizer, decay, batch and schedule.
    c.train.weight_decay = 0.0
    c.train.batch_size = 64
    c.train.epochs = 100
    c.train.patience = 15
    return config_lib.apply_variant(c, arg, VARIANTS)


# Per-series models at the learning rate they were tuned at: demo and tiny show and test
# the vmapped path, its sweeps and the timings of docs/performance.md.
_PER_SERIES = {"train.share": "series", "train.learning_rate": 1e-3}
VARIANTS = {
    "demo": {**_PER_SERIES, "model.hidden": 32},  # small enough for a 2-core CPU
    "tiny": {**_PER_SERIES, "model.hidden": 32},
    "replaced": _PER_SERIES,  # the body's size and schedule are the replaced system's
}
