"""Compile time of the epoch program per train.share (docs/performance.md, "Pooled model").

  python benchmarks/compile_share.py series pooled series pooled

Compiles the GRU (width 64, vol_band + mae + persistence scale) epoch program of a group
of 12 coins at the default padded length on one device, from abstract shapes (no data),
once per argument, and prints the seconds of each compile.
"""

from __future__ import annotations

import sys
import time

import jax

from cpbjax import models, sharding
from cpbjax.config import schema as config_lib
from cpbjax.training import epoch_spec
from cpbjax.training.group import GroupTrainer


def compile_seconds(share: str) -> float:
    c = config_lib.load("configs/gru.py")
    c.model.hidden = 64
    c.model.baseline, c.train.loss, c.train.loss_scale = "vol_band", "mae", "persistence"
    c.train.share = share
    trainer = GroupTrainer(
        epoch_spec.make_spec(c, models.build(models.make_config(c))),
        12,
        sharding.coin_mesh(jax.devices()[:1]),
    )
    lowered = trainer.lowered_epoch(trainer.abstract_state(), trainer.abstract_arrays())
    began = time.monotonic()
    lowered.compile()
    return time.monotonic() - began


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(name, round(compile_seconds(name), 1), flush=True)
