"""The output side shared by the architectures: the forecast head's init and its baseline
(`ForecastOutput`, the vol_band factors `band_factors` / `with_band`, the per-column
fallback mask `keep_columns` / `with_keep`) and `init_params`, which
refuses a baseline or window scale a model would ignore.

Shape suffixes: models/layers.py; Y ensemble members.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from cpbjax import band, columns
from cpbjax import config_rules as rules
from cpbjax.models import ensemble, layers, model_config

# The params key of the per-column fallback mask under "output" (cpbjax/score/column_fallback.py):
# float32 [C] ([Y, C] for an ensemble's members), 1 where the column keeps the network's
# correction, 0 where its forecast is the baseline's. It is set on the kept params after
# training, never by init, so no optimizer step sees it; without it every column keeps
# its correction.
KEEP_COLUMNS = "keep_columns"


def head_init(cfg: model_config.ModelConfig):
    """Kernel init of the output layer: zeros when the output corrects a baseline, so an
    untrained model forecasts the baseline exactly; else Dense's default."""
    return nn.initializers.zeros if cfg.baseline != "none" else nn.linear.default_kernel_init


class ForecastOutput(nn.Module):
    """Turns a head's raw outputs [B, H, C] into forecasts [B, H, C]: the raw output (times
    the window's range under window_scale=range) on the columns cfg.corrected_columns
    names (0 on the others), and on the fallback mask's, plus the baseline (cfg.baseline):
      vol_band: the last close for every column (0 in the last_close space), and
        high = +k_h·sigma and low = -k'_h·sigma, sigma the window's EWMA log range and
        k, k' learned per step ("band_high", "band_low" [H]; group training starts them
        at the coin's train-split fit, `with_band`).
    """

    cfg: model_config.ModelConfig

    @nn.compact
    def __call__(self, raw: jax.Array, x_BLF: jax.Array):
        cfg = self.cfg
        y_BHC = raw.astype(jnp.float32).reshape(*raw.shape[:2], cfg.num_targets)
        sigma_B = band.window_range(x_BLF, jnp)
        if cfg.window_scale == "range":  # the output is in range units
            y_BHC = y_BHC * layers.floored_range(sigma_B)[:, None, None]
        if len(cfg.corrected_columns) < cfg.num_targets:  # static: the others are the baseline's
            corrected_C = np.isin(columns.COLUMNS, cfg.corrected_columns)
            y_BHC = jnp.where(corrected_C, y_BHC, 0.0)
        if self.has_variable("params", KEEP_COLUMNS):  # the correction, masked per column
            keep_C = self.get_variable("params", KEEP_COLUMNS)
            y_BHC = jnp.where(keep_C > 0, y_BHC, 0.0)
        if cfg.baseline == "vol_band":
            steps_H = jnp.sqrt(jnp.arange(1, cfg.horizon + 1, dtype=jnp.float32))
            k_high_H = self.param("band_high", lambda _: 0.5 * steps_H)
            k_low_H = self.param("band_low", lambda _: 0.5 * steps_H)
            band_BH = sigma_B[:, None]
            y_BHC = y_BHC.at[:, :, columns.HIGH].add(k_high_H * band_BH)
            y_BHC = y_BHC.at[:, :, columns.LOW].add(-k_low_H * band_BH)
        return y_BHC


def init_params(module: nn.Module, rngs, x_BLF, y_BHC) -> dict:
    """module.init's params, refusing a baseline (cfg.baseline) or a window scale
    (cfg.window_scale) the module would ignore.

    A registered user model whose forecasts do not go through ForecastOutput would
    silently forecast without its baseline (and, for vol_band, have no band to start);
    one whose inputs skip PriceScale would see unscaled prices and scale its outputs.
    An interceptor sees which of the two the init runs through.
    """
    used = set()

    def note_used(call, args, kwargs, context):
        used.add(type(context.module))
        return call(*args, **kwargs)

    with nn.intercept_methods(note_used):
        params = module.init(rngs, x_BLF, y_BHC, train=False)["params"]
    cfg = module.cfg
    for field, value, needs in (
        ("baseline", cfg.baseline, (ForecastOutput,)),
        ("window_scale", cfg.window_scale, (ForecastOutput, layers.PriceScale)),
    ):
        missing = [
            f"{m.__module__.rsplit('.', 1)[-1]}.{m.__name__}" for m in needs if m not in used
        ]
        if value != "none" and missing:
            raise rules.ConfigError(
                f"config.model.{field}={value!r} needs a model that runs "
                f"{' and '.join(missing)}; model {cfg.name!r} does not: set "
                f"--config.model.{field}=none"
            )
    return params


def band_factors(params) -> jax.Array:
    """The vol_band factors of one model's params: [H, 2] (high, low), or [Y, H, 2] for an
    ensemble's members."""
    out = _output(params)
    return jnp.stack([out["band_high"], out["band_low"]], axis=-1)


def with_band(params, k_H2) -> dict:
    """params with the vol_band factors set to k_H2 [H, 2] (high, low), others as they are;
    an ensemble's members all take k_H2, or each its own row of a k_YH2 [Y, H, 2]."""
    if ensemble.MEMBERS in params:
        members = params[ensemble.MEMBERS]
        size = members["output"]["band_high"].shape[0]  # Y
        return {
            **params,
            ensemble.MEMBERS: with_band(members, jnp.broadcast_to(k_H2, (size, *k_H2.shape[-2:]))),
        }
    out = dict(params)
    out["output"] = {**params["output"], "band_high": k_H2[..., 0], "band_low": k_H2[..., 1]}
    return out


def _output(params) -> dict:
    """The ForecastOutput params of one model, or an ensemble's stacked [Y, ...] ones."""
    return params[ensemble.MEMBERS]["output"] if ensemble.MEMBERS in params else params["output"]


def keep_columns(params):
    """The fallback mask of one model's params as bool [C] (an ensemble's members share
    one), or None where the params carry none (every column keeps its correction)."""
    out = (params.get(ensemble.MEMBERS) or params).get("output") or {}
    if KEEP_COLUMNS not in out:
        return None
    keep = np.asarray(out[KEEP_COLUMNS]) > 0
    return keep.reshape(-1, keep.shape[-1])[0]


def with_keep(params, keep_C) -> dict:
    """params with the fallback mask set to keep_C (bool [C]); an ensemble's members all
    take it, as a [Y, C] leaf."""
    keep = np.asarray(keep_C, np.float32)
    if ensemble.MEMBERS in params:
        members = params[ensemble.MEMBERS]
        size = jax.tree.leaves(members)[0].shape[0]  # Y
        return {**params, ensemble.MEMBERS: _set_keep(members, np.tile(keep, (size, 1)))}
    return _set_keep(params, keep)


def _set_keep(params, keep) -> dict:
    out = dict(params)
    out["output"] = {**params.get("output", {}), KEEP_COLUMNS: keep}
    return out


def without_keep(params) -> dict:
    """params without a fallback mask: the trained model on every column, and the tree
    init makes (what training starts from, e.g. train.init_from)."""
    if keep_columns(params) is None:
        return params
    inner = params.get(ensemble.MEMBERS) or params
    stripped = dict(inner)
    stripped["output"] = {k: v for k, v in inner["output"].items() if k != KEEP_COLUMNS}
    if ensemble.MEMBERS in params:
        return {**params, ensemble.MEMBERS: stripped}
    return stripped
