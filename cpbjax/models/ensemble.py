"""model.ensemble: independently initialised copies of one architecture as ONE module.

Why: on 40 real series the default transformer's val gain over its band is the size of
the val noise, so whether a seed trains past the band is luck (experiments/ensemble_default: the mean of three seeds met issue #13 where one seed kept the band).
Stacking the members here makes that mean one compiled program, and every consumer of
a module (evaluate, predict, serve, export) sees one forecast.

The members' params carry a leading member axis Y under the "members" key (`nn.vmap`,
each member with its own init, dropout and teacher-forcing keys). Training sums the
members' losses (`member_outputs=True` gives each member's forecast, [Y, B, H, C]),
and optimizer.make_optimizer vmaps the Optax chain over the member axis, so each member
takes exactly the update it would take alone on the same batch: its own gradient
clipping and Adam moments. The forecast (member_outputs=False) is the mean over the
members of their log forecasts (under last_close normalisation, the geometric mean of
their prices).
Early stopping judges that mean forecast, so the members are kept (or not) together.

Shape letters (docs/design.md): Y members, B batch, L lookback, H horizon, C targets.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from cpbjax.models import model_config

# The params key of model.ensemble's members, every leaf under it [Y, ...].
MEMBERS = "members"


class Ensemble(nn.Module):
    """cfg.ensemble members of `member_type` (a registered architecture) side by side."""

    cfg: model_config.ModelConfig
    member_type: Any  # the architecture's nn.Module class, built as member_type(cfg)

    @nn.compact
    def __call__(
        self,
        x_BLF,
        y_BHC=None,
        train: bool = False,
        teacher_forcing=0.0,
        member_outputs: bool = False,
    ):
        """The architecture's outputs averaged over the members (its __call__ contract), or
        with member_outputs=True every member's, each with a leading axis Y."""
        stack = nn.vmap(
            self.member_type,
            variable_axes={"params": 0},
            split_rngs={"params": True, "dropout": True, "teacher": True},
            in_axes=None,  # every member reads the same windows
            out_axes=0,
            axis_size=self.cfg.ensemble,
        )
        # Positional: nn.vmap broadcasts them.
        args = (x_BLF, y_BHC, train, teacher_forcing)
        out = stack(self.cfg, name=MEMBERS)(*args)
        if member_outputs:
            return out
        return jax.tree.map(lambda a_Y: jnp.mean(a_Y, axis=0), out)
