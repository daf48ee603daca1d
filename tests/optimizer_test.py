"""Tests of cpbjax.training.optimizer: schedule values, clipping, Adam vs AdamW decay."""

import math

import chex
import jax.numpy as jnp
import numpy as np
import optax
from absl.testing import absltest

from cpbjax.config import schema as config_lib
from cpbjax.training import optimizer

LR, INIT, FINAL = 1e-3, 0.01, 0.02


def _train_cfg(**overrides):
    t = config_lib.base_config().train
    t.learning_rate, t.warmup_fraction = LR, 0.1
    t.warmup_init_factor, t.final_lr_factor = INIT, FINAL
    for key, value in overrides.items():
        t[key] = value
    return t


def _reference_lr(step, total, warmup):
    """Linear warmup then cosine decay, written out plainly."""
    if step < warmup:
        return INIT * LR + (LR - INIT * LR) * step / warmup
    progress = min(step - warmup, total - warmup) / (total - warmup)
    return FINAL * LR + (LR - FINAL * LR) * 0.5 * (1 + math.cos(math.pi * progress))


class ScheduleTest(chex.TestCase):
    def test_values_match_reference(self):
        total = 200
        schedule = optimizer.make_schedule(_train_cfg(), total)
        warmup = 20  # 0.1 * 200
        points = {0: INIT * LR, warmup: LR, (warmup + total) // 2: None, total: FINAL * LR}
        for step, expected in points.items():
            ref = _reference_lr(step, total, warmup)
            if expected is not None:
                self.assertAlmostEqual(ref, expected, places=12)  # the reference itself
            np.testing.assert_allclose(float(schedule(step)), ref, rtol=1e-5)
        for step in range(0, total + 1, 7):
            np.testing.assert_allclose(
                float(schedule(step)), _reference_lr(step, total, warmup), rtol=1e-5
            )

    def test_warmup_really_rises_then_decays(self):
        schedule = optimizer.make_schedule(_train_cfg(), 200)
        lrs = np.array([float(schedule(s)) for s in range(201)])
        self.assertTrue((np.diff(lrs[:21]) > 0).all(), "lr must rise during warmup")
        self.assertTrue((np.diff(lrs[20:]) < 0).all(), "lr must decay after warmup")
        self.assertAlmostEqual(lrs.max(), LR, places=9)
        self.assertEqual(int(lrs.argmax()), 20)

    def test_total_steps(self):
        self.assertEqual(optimizer.total_steps(_train_cfg(epochs=7), 13), 91)


class ChainTest(chex.TestCase):
    def _step(self, cfg, params, grads, lr):
        tx = optimizer.make_optimizer(cfg)
        state = optimizer.with_learning_rate(tx.init(params), lr)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    def test_gradients_clipped_to_global_norm(self):
        params = {"a": jnp.zeros(3), "b": jnp.zeros(2)}
        grads = {"a": jnp.array([3.0, 4.0, 0.0]), "b": jnp.array([0.0, 12.0])}  # norm 13
        _, state = self._step(
            _train_cfg(optimizer="adam", weight_decay=0.0, grad_clip=1.0), params, grads, 1e-3
        )
        mu = optax.tree_utils.tree_get(state, "mu")
        # Adam's first moment after one step is (1 - b1) * the clipped gradient.
        for key in grads:
            np.testing.assert_allclose(mu[key], 0.1 * np.asarray(grads[key]) / 13.0, rtol=1e-6)

    def test_small_gradients_not_clipped(self):
        params = {"a": jnp.zeros(2)}
        grads = {"a": jnp.array([0.3, 0.4])}  # norm 0.5 < 1
        _, state = self._step(_train_cfg(optimizer="adam", weight_decay=0.0), params, grads, 1e-3)
        np.testing.assert_allclose(
            optax.tree_utils.tree_get(state, "mu")["a"], [0.03, 0.04], rtol=1e-6
        )

    def test_adamw_decay_is_decoupled(self):
        params, lr, wd = {"w": jnp.array([1.0, -2.0])}, 0.1, 0.5
        zero = {"w": jnp.zeros(2)}
        new, _ = self._step(_train_cfg(optimizer="adamw", weight_decay=wd), params, zero, lr)
        # Adam of a zero gradient is 0; decoupled decay shrinks params by lr * wd.
        np.testing.assert_allclose(new["w"], np.array([1.0, -2.0]) * (1 - lr * wd), rtol=1e-6)

    def test_adam_decay_is_l2_through_adam(self):
        params, lr, wd = {"w": jnp.array([1.0, -2.0])}, 0.1, 0.5
        zero = {"w": jnp.zeros(2)}
        new, _ = self._step(_train_cfg(optimizer="adam", weight_decay=wd), params, zero, lr)
        # torch.optim.Adam: g = wd * p enters Adam, whose first step is lr * g / (|g| + eps).
        g = wd * np.array([1.0, -2.0])
        np.testing.assert_allclose(
            new["w"], np.array([1.0, -2.0]) - lr * g / (np.abs(g) + 1e-8), rtol=1e-6
        )

    def test_learning_rate_is_injected_and_readable(self):
        tx = optimizer.make_optimizer(_train_cfg())
        params = {"w": jnp.ones(2)}
        state = optimizer.with_learning_rate(tx.init(params), 0.25)
        _, state = tx.update({"w": jnp.ones(2)}, state, params)
        self.assertAlmostEqual(float(state.hyperparams["learning_rate"]), 0.25)
        new, _ = self._step(
            _train_cfg(optimizer="adam", weight_decay=0.0), params, {"w": jnp.ones(2)}, 0.25
        )
        np.testing.assert_allclose(new["w"], 1 - 0.25, rtol=1e-5)  # first Adam step = lr


if __name__ == "__main__":
    absltest.main()
