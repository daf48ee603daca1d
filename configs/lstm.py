"""LSTM seq2seq with 4-head attention, as the replaced system trained it.

Variants: `configs/lstm.py` (default), `:demo`, `:tiny` and `:replaced` (cpbjax/config.py
`apply_variant`).
"""

from cpbjax import config as config_lib


def get_config(arg=None):
    c = config_lib.base_config()
    c.model.name = "lstm"
    c.model.hidden = 256  # LSTM state width of encoder and decoder.
    c.model.num_layers = 2  # Stacked LSTM layers in encoder and decoder.
    c.model.dropout = 0.3  # Dropout between stacked layers.
    c.model.attention_heads = 4  # Decoder-over-encoder attention heads.
    c.train.optimizer = "adam"
    c.train.learning_rate = 1e-3
    c.train.weight_decay = 1e-5
    c.train.batch_size = 32
    c.train.epochs = 200
    c.train.patience = 20
    config_lib.apply_variant(c, arg)
    if arg in config_lib.SMALL:  # demo and tiny: a model small enough for a 2-core CPU.
        c.model.hidden, c.model.attention_heads = 32, 4
    return c
