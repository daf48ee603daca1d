"""A dense network of the window and its context (model.name=mlp), direct decoding only.

Why a dense network beside the sequence models: on the tuning pairs' validation split
(experiments/global_model) the band's correction comes from the context of a window (the
time of day ahead, the day's and week's move, volume, the interval), which the
window's 30 candles do not carry; a dense network of the same inputs matched a GRU with
the context beside its summary, at a sixth of its epoch time on a CPU. It reads:
  - every candle's price columns relative to the close before it (the first candle's to
    its own), in units of the window's range under window_scale=range (layers.PriceScale):
    [B, L·P]. Candle by candle, each input means the same at every lag; the log ratios to
    the last close that the window holds grow with the lag, and the network fitted them
    worse (0.3 to 0.5 points less skill on high and low, experiments/global_model);
  - the other columns at the window's last candle, where they already summarise the past
    (the context features, RSI, ...): [B, F - P];
  - the log of the window's range relative to 1% (the band's sigma, band.window_range),
    so that a scaled window still says how volatile the coin is: [B, 1].
Its hidden layers (gelu, dropout between them) feed a head that starts at zero, so an
untrained model is its baseline (heads.ForecastOutput).

Shape suffixes: models/layers.py; P the price columns of a window.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from cpbjax import band, columns
from cpbjax import config_rules as rules
from cpbjax.models import heads, layers, model_config

SIGMA_REFERENCE = 0.01  # a 1% range: the log-range input is log(sigma / this), about -2..2


@dataclasses.dataclass(frozen=True, kw_only=True)
class MLPConfig(model_config.ModelConfig):
    """config.model fields of the dense network: hidden, num_layers, dropout."""

    hidden: int  # Width of every hidden layer.
    num_layers: int  # Hidden layers.

    @classmethod
    def check_rules(cls, group) -> None:
        super().check_rules(group)
        rules.check(
            group["decoding"] == "direct",
            "model.decoding",
            group["decoding"],
            "direct (model 'mlp' forecasts every step at once)",
        )


class WindowMLP(nn.Module):
    """Window and context -> H·C correction of the baseline; see the module docstring."""

    cfg: MLPConfig

    @nn.compact
    def __call__(self, x_BLF, y_BHC=None, train=False, teacher_forcing=0.0):
        """Forecasts [B, H, C] float32 (normalised space). y_BHC and teacher_forcing are
        unused (direct decoding)."""
        del teacher_forcing
        cfg = self.cfg
        model_config.check_inputs(cfg, x_BLF, y_BHC)
        h_BX = network_inputs(cfg, x_BLF, layers.PriceScale(cfg)(x_BLF))
        for i in range(cfg.num_layers):
            h_BD = nn.gelu(layers.dense(cfg, cfg.hidden, name=f"hidden_{i}")(h_BX))
            h_BX = nn.Dropout(cfg.dropout)(h_BD, deterministic=not train)
        out = cfg.horizon * cfg.num_targets
        raw = layers.dense(cfg, out, kernel_init=heads.head_init(cfg), name="head")(h_BX)
        raw_BHC = raw.reshape(-1, cfg.horizon, cfg.num_targets)
        # The name every model gives its ForecastOutput: the band and fallback mask live there.
        return heads.ForecastOutput(cfg, name="output")(raw_BHC, x_BLF)


def network_inputs(cfg: MLPConfig, x_BLF: jax.Array, scaled_BLF: jax.Array) -> jax.Array:
    """[B, L·P + (F - P) + 1]: the window's prices, each candle's relative to the close
    before it (scaled_BLF: layers.PriceScale's view), the last candle's other columns and
    the window's log range."""
    is_price_F = np.isin(np.arange(x_BLF.shape[-1]), cfg.price_columns)  # static
    close_BL = scaled_BLF[..., columns.CLOSE]
    before_BL = jnp.concatenate([close_BL[:, :1], close_BL[:, :-1]], axis=1)
    prices_BLP = scaled_BLF[..., np.flatnonzero(is_price_F)] - before_BL[..., None]
    others_BF = scaled_BLF[:, -1, np.flatnonzero(~is_price_F)]
    sigma_B = layers.floored_range(band.window_range(x_BLF, jnp))
    log_range_B1 = jnp.log(sigma_B / SIGMA_REFERENCE)[:, None]
    parts = (prices_BLP.reshape(x_BLF.shape[0], -1), others_BF, log_range_B1)
    return jnp.concatenate([p.astype(jnp.float32) for p in parts], axis=-1)
