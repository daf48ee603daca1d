"""The Optax chain and its warmup-cosine schedule.

The chain is clip_by_global_norm -> adam | adamw. Its learning rate is an
injected hyperparameter (`optax.inject_hyperparams`) that the train step sets
before every update from `schedule(global_step)`, so:
  - the schedule follows the group's global step (epoch * steps_per_epoch + batch),
    and a batch a coin skips (no valid windows, or the coin is frozen) does not
    shift that coin's schedule;
  - the learning rate lives in the optimizer state, where metrics can read it.
A sweep coin (cpbjax/config/sweep_grid.py) multiplies that rate by its own lr_mult, and with
`per_coin_decay` its weight decay is injected the same way. For model.ensemble the chain
runs once per member (`per_member`), so clipping and Adam see one member at a time.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def total_steps(train_cfg, steps_per_epoch: int) -> int:
    """Optimizer steps of a full run: epochs x batches per epoch."""
    return train_cfg.epochs * steps_per_epoch


def make_schedule(train_cfg, num_steps: int) -> optax.Schedule:
    """Linear warmup from warmup_init_factor*lr to lr, then cosine decay to final_lr_factor*lr.

    Args:
      train_cfg: config.train.
      num_steps: all optimizer steps of the run (see `total_steps`).

    Returns:
      step -> learning rate. Warmup covers round(warmup_fraction * num_steps) steps;
      the value is lr at the end of warmup and final_lr_factor*lr at num_steps.
    """
    lr = train_cfg.learning_rate
    warmup = int(round(train_cfg.warmup_fraction * num_steps))
    return optax.warmup_cosine_decay_schedule(
        init_value=train_cfg.warmup_init_factor * lr,
        peak_value=lr,
        warmup_steps=warmup,
        decay_steps=max(num_steps, warmup + 1),
        end_value=train_cfg.final_lr_factor * lr,
    )


def make_optimizer(train_cfg, per_coin_decay: bool = False, members: int = 1):
    """clip_by_global_norm(grad_clip) -> adam or adamw, with an injected learning rate.

    For `adam`, weight_decay is an L2 term added to the clipped gradients before
    Adam's moments, as torch.optim.Adam does; for `adamw` it is decoupled decay.
    Set the rate with `with_learning_rate` before each update.

    Args:
      train_cfg: config.train.
      per_coin_decay: a sweep over weight decay (cpbjax/config/sweep_grid.py): the decay is an
        injected hyperparameter too, set per coin each step, and adam always carries its
        L2 term. False (default) keeps train.weight_decay a constant of the chain.
      members: model.ensemble; above 1 the chain is `per_member`.
    """
    name, clip = train_cfg.optimizer, train_cfg.grad_clip

    def chain(learning_rate, weight_decay):
        if name == "adamw":
            inner = optax.adamw(learning_rate, weight_decay=weight_decay)
        elif per_coin_decay or weight_decay > 0:
            inner = optax.chain(optax.add_decayed_weights(weight_decay), optax.adam(learning_rate))
        else:
            inner = optax.adam(learning_rate)
        return optax.chain(optax.clip_by_global_norm(clip), inner)

    if per_coin_decay:
        inject = optax.inject_hyperparams(chain, hyperparam_dtype=jnp.float32)
        tx = inject(learning_rate=0.0, weight_decay=float(train_cfg.weight_decay))
    else:

        def constant_decay(learning_rate):
            # inject_hyperparams injects every numeric argument: here only the rate.
            return chain(learning_rate, train_cfg.weight_decay)

        tx = optax.inject_hyperparams(constant_decay, hyperparam_dtype=jnp.float32)(
            learning_rate=0.0
        )
    return per_member(tx) if members > 1 else tx


def per_member(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """`tx` applied to each member of an ensemble on its own: every leaf of the params,
    updates and state carries the member axis Y first (models/ensemble.py), so each
    member's global-norm clip and Adam moments are the ones it would have alone."""
    return optax.GradientTransformation(jax.vmap(tx.init), jax.vmap(tx.update))


def with_learning_rate(opt_state, learning_rate: jax.Array, **others: jax.Array):
    """Returns `opt_state` (of `make_optimizer`) with its learning rate set, and the other
    injected hyperparameters given (a coin's weight_decay under per_coin_decay); under
    `per_member` every member gets the same values."""
    values = {"learning_rate": learning_rate, **others}
    old = opt_state.hyperparams
    hyperparams = dict(
        old,
        **{
            k: jnp.broadcast_to(jnp.asarray(v, jnp.float32), jnp.shape(old[k]))
            for k, v in values.items()
        },
    )
    return opt_state._replace(hyperparams=hyperparams)
