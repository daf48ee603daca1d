"""GRU seq2seq with simple attention pooling, as the replaced system trained it.

Variants: `configs/gru.py` (default), `:demo`, `:tiny` and `:replaced` (cpbjax/config.py
`apply_variant`).
"""

from cpbjax import config as config_lib


def get_config(arg=None):
    c = config_lib.base_config()
    c.model.name = "gru"
    c.model.hidden = 128  # GRU state width of encoder and decoder.
    c.model.num_layers = 2  # Stacked GRU layers in encoder and decoder.
    c.model.dropout = 0.3  # Dropout between stacked layers.
    c.train.optimizer = "adam"
    c.train.learning_rate = 1e-3
    c.train.weight_decay = 0.0
    c.train.batch_size = 64
    c.train.epochs = 100
    c.train.patience = 15
    if not arg:  # the real-data run: one model for every series of the run
        config_lib.pool_by_default(c)
    config_lib.apply_variant(c, arg)
    if arg in config_lib.SMALL:  # demo and tiny: a model small enough for a 2-core CPU.
        c.model.hidden = 32
    return c
