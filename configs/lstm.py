"""LSTM seq2seq with 4-head attention. The body is the default run on real data, each
value with the reason it was chosen; VARIANTS below are named changes of it.

Variants (`configs/lstm.py:<variant>`): `demo` and `tiny` (synthetic series and a model
small enough for a 2-core CPU) and `replaced` (the replaced system's model, schedule and
objective on the real data); cpbjax/config/schema.py `apply_variant` adds the data and objective
parts that every model's variant shares.
"""

from cpbjax.config import schema as config_lib


def get_config(arg=None):
    c = config_lib.base_config()
    c.model.name = "lstm"
    c.model.hidden = 256  # LSTM state width of encoder and decoder, as the replaced system's.
    c.model.num_layers = 2  # Stacked LSTM layers, as the replaced system's.
    c.model.dropout = 0.3  # Dropout between stacked layers, as the replaced system's.
    c.model.attention_heads = 4  # Decoder-over-encoder attention heads, as the replaced system's.
    # The defaults of base_config stay for: model.ensemble (one model: ensembles were
    # measured on the transformer only), model.window_scale (raw windows: the range scale
    # was not measured on the LSTM) and train.share with its learning rate (one model per
    # series at the rate they were tuned at: the LSTM was not measured pooled;
    # experiments/pooled_or_series).
    c.train.optimizer = "adam"  # The replaced system's optimizer, decay, batch and schedule.
    c.train.weight_decay = 1e-5
    c.train.batch_size = 32
    c.train.epochs = 200
    c.train.patience = 20
    return config_lib.apply_variant(c, arg, VARIANTS)


VARIANTS = {
    "demo": {"model.hidden": 32},  # small enough for a 2-core CPU (4 heads still divide it)
    "tiny": {"model.hidden": 32},
    "replaced": {},  # the body's model, size and schedule are the replaced system's
}
