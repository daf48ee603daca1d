"""config.recurrent_gradient=fused: the GRU/LSTM encoder's hand-written backward pass.

The reference is the autodiff path (nn.RNN over the cell, jax.grad through its scan):
the fused path must create the same parameters, forecast the same bits and give the
same gradients up to summation order.
"""

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

from cpbjax import config as config_lib
from cpbjax import models
from cpbjax.models import recurrence

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
B, L, H = 5, 7, 3


def _modules(name, decoding, dtype="float32"):
    c = config_lib.load(os.path.join(CONFIGS, f"{name}.py:tiny"))
    c.data.lookback, c.data.horizon, c.model.decoding, c.dtype = L, H, decoding, dtype
    c.model.baseline = "none"
    c.model.hidden = 8
    cfg = models.make_config(config_lib.validate(c))
    fused = dataclasses.replace(cfg, recurrent_gradient="fused")
    return models.build(cfg), models.build(fused), cfg


def _data(cfg):
    kx, ky = jax.random.split(jax.random.key(1))
    return (
        jax.random.normal(kx, (B, L, cfg.num_features)),
        jax.random.normal(ky, (B, H, cfg.num_targets)),
    )


def _perturbed_params(module, x):
    """Init params plus noise: the zero-initialised head would otherwise stop every gradient."""
    params = module.init({"params": jax.random.key(0)}, x)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(2), len(leaves))
    noisy = [p + 0.2 * jax.random.normal(k, p.shape) for p, k in zip(leaves, keys, strict=True)]
    return jax.tree.unflatten(tree, noisy)


def _loss(module, params, x, y):
    rngs = {"dropout": jax.random.key(3), "teacher": jax.random.key(4)}
    y_hat = module.apply(params, x, y, train=True, teacher_forcing=0.5, rngs=rngs)
    return jnp.mean((y_hat - y) ** 2)


def _grad(module, coins=False):
    """jit(grad of the loss in params); with coins, vmapped over a leading coin axis."""
    grad = jax.grad(functools.partial(_loss, module))
    return jax.jit(jax.vmap(grad) if coins else grad)


def _forecast(module, params, x):
    """module's forecast, jitted at XLA's default optimisation level (3), the code users
    run: bit-identity is claimed there, not at the -O0 of the rest of the suite
    (tests/conftest.py), whose codegen rounds the two op sequences apart."""
    apply = jax.jit(module.apply).lower(params, x).compile({"xla_backend_optimization_level": 3})
    return apply(params, x)


class FusedRecurrenceTest(parameterized.TestCase):
    @parameterized.parameters(("gru", "autoregressive"), ("lstm", "direct"))
    def test_same_params_and_forecasts(self, name, decoding):
        autodiff, fused, cfg = _modules(name, decoding)
        x, _ = _data(cfg)
        p_autodiff = autodiff.init({"params": jax.random.key(0)}, x)
        p_fused = fused.init({"params": jax.random.key(0)}, x)
        jax.tree.map(np.testing.assert_array_equal, p_autodiff, p_fused)
        params = _perturbed_params(autodiff, x)
        np.testing.assert_array_equal(_forecast(autodiff, params, x), _forecast(fused, params, x))

    @parameterized.parameters(("gru", "direct"), ("lstm", "autoregressive"))
    def test_gradients_match_autodiff(self, name, decoding):
        # Vmapped over 2 coins, as the group program runs the step. autoregressive: the
        # decoder starts from the encoder's final states, so their cotangent enters the
        # backward loop too.
        autodiff, fused, cfg = _modules(name, decoding)
        x, y = _data(cfg)
        params = jax.vmap(lambda s: _perturbed_params(autodiff, x + s))(jnp.arange(2.0))
        xs, ys = jnp.stack([x, -x]), jnp.stack([y, 2 * y])
        g_ref = _grad(autodiff, coins=True)(params, xs, ys)
        g_fused = _grad(fused, coins=True)(params, xs, ys)
        encoder = [k for k in g_ref["params"] if k.startswith("encoder_")]
        self.assertLen(encoder, cfg.num_layers)
        _assert_close(self, g_fused, g_ref, rtol=2e-6)

    def test_bfloat16_gradients_close(self):
        autodiff, fused, cfg = _modules("gru", "direct", "bfloat16")
        x, y = _data(cfg)
        params = _perturbed_params(autodiff, x)
        g_ref, g_fused = _grad(autodiff)(params, x, y), _grad(fused)(params, x, y)
        _assert_close(self, g_fused, g_ref, rtol=2e-2)  # bfloat16 keeps 8 bits

    def test_encoder_layer_is_the_fused_one(self):
        # The equalities above would also hold if both modules took the autodiff path.
        autodiff, fused, cfg = _modules("gru", "direct")
        x, _ = _data(cfg)
        params = fused.init({"params": jax.random.key(0)}, x)
        calls = lambda m: str(jax.make_jaxpr(m.apply)(params, x)).count("custom_vjp_call")  # noqa: E731
        self.assertEqual((calls(autodiff), calls(fused)), (0, cfg.num_layers))
        self.assertIsInstance(fused.bind(params).encoder[0], recurrence.EncoderLayer)

    def test_bad_value_is_refused(self):
        c = config_lib.load(os.path.join(CONFIGS, "gru.py:tiny"))
        c.recurrent_gradient = "manual"
        with self.assertRaisesRegex(config_lib.ConfigError, "recurrent_gradient"):
            config_lib.validate(c)


def _assert_close(test, got, ref, rtol):
    """Every leaf of got within rtol x the largest |value| of ref's leaf; the encoder's
    leaves, whose gradients the fused path computes, must not be all zero."""
    for path, want in jax.tree_util.tree_leaves_with_path(ref):
        leaf = got
        for key in path:
            leaf = leaf[key.key]
        scale = float(jnp.max(jnp.abs(want)))
        if path[1].key.startswith("encoder_"):
            test.assertGreater(scale, 0.0, jax.tree_util.keystr(path))
        np.testing.assert_allclose(leaf, want, atol=rtol * scale, err_msg=str(path))


if __name__ == "__main__":
    absltest.main()
