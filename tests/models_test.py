"""Tests for the three forecasting models, their registry and their config boundary."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from scipy import special

from cpbjax import models
from cpbjax.models import gru, lstm
from tests.helpers import (
    MODEL_B,
    MODEL_C,
    MODEL_H,
    MODEL_L,
    SHIFT_INVARIANT,
    build_model,
    init_shapes,
    model_data,
    model_rngs,
    model_run_config,
    param_paths,
    random_params,
)

NAMES = ("transformer", "gru", "lstm")
B, L, H, C = MODEL_B, MODEL_L, MODEL_H, MODEL_C  # batch, lookback, horizon, columns


@functools.cache
def _forward(name, decoding="autoregressive", dtype="float32", train=False):
    """A jitted apply(params, x, y, ratio, rngs), shared by the tests so each compiles once.

    Evaluation (train=False) runs a model built with dropout 0.3, which it must
    ignore; training runs a dropout-free model, so teacher forcing is its only
    randomness.
    """
    module = build_model(name, decoding, dropout=0.0 if train else 0.3, dtype=dtype)[1]

    def forward(params, x, y, ratio, rngs):
        return module.apply({"params": params}, x, y, train=train, teacher_forcing=ratio, rngs=rngs)

    return jax.jit(forward)


class ParamCountTest(parameterized.TestCase):
    @parameterized.parameters(("transformer", 926_852), ("gru", 334_597), ("lstm", 1_984_772))
    def test_replaced_models_match_the_torch_reference(self, name, expected):
        module = models.build(models.make_config(model_run_config(name, tiny=False)))
        shapes = init_shapes(module, jnp.zeros((2, 30, 4)), jnp.zeros((2, 10, 4)))["params"]
        self.assertEqual(sum(leaf.size for leaf in jax.tree_util.tree_leaves(shapes)), expected)


class ForwardBackwardTest(chex.TestCase):
    def setUp(self):
        super().setUp()
        chex.clear_trace_counter()  # Counters are keyed by function, shared across cases.

    # Eager (without_jit) runs compile every op, and re-trace every scan, on each call, so
    # only the GRU takes both variants (the LSTM shares its RNNSeq2Seq). The Transformer
    # has one layer each side here: every dropout site costs compile time on CPU, and
    # stacking is covered by the reference tests below.
    @chex.variants(with_jit=True, without_jit=True)
    def test_gru_outputs_and_gradients(self):
        self._check_outputs_and_gradients(build_model("gru", dropout=0.1)[1])

    @chex.variants(with_jit=True)
    @parameterized.parameters("transformer", "lstm")
    def test_outputs_and_gradients(self, name):
        self._check_outputs_and_gradients(build_model(name, dropout=0.1, transformer_layers=1)[1])

    @chex.variants(with_jit=True)
    @parameterized.parameters(*NAMES)
    def test_direct_outputs_and_gradients(self, name):
        self._check_outputs_and_gradients(build_model(name, "direct", transformer_layers=1)[1])

    def _check_outputs_and_gradients(self, module):
        params = random_params(module)

        @self.variant
        @chex.assert_max_traces(n=1)
        def loss_and_grads(params, x, y, ratio, rngs):
            def loss(p):
                y_hat = module.apply(
                    {"params": p}, x, y, train=True, teacher_forcing=ratio, rngs=rngs
                )
                return jnp.mean((y_hat - y) ** 2), y_hat

            return jax.value_and_grad(loss, has_aux=True)(params)

        # Jitted, the step is called again with new data and ratios: no retracing.
        calls = 3 if self.variant.type == chex.ChexVariantType.WITH_JIT else 1
        for i, ratio in enumerate((0.5, 0.0, 1.0)[:calls]):
            x, y = model_data(seed=i)
            (loss, y_hat), grads = loss_and_grads(params, x, y, jnp.float32(ratio), model_rngs(i))
        chex.assert_shape(y_hat, (B, H, C))
        self.assertEqual(y_hat.dtype, jnp.float32)
        chex.assert_tree_all_finite((loss, y_hat, grads))
        chex.assert_trees_all_equal_shapes_and_dtypes(grads, params)
        for path, g in param_paths(grads):
            size = float(jnp.max(jnp.abs(g)))
            if path.endswith(SHIFT_INVARIANT):
                self.assertLess(size, 1e-6, path)
            else:
                self.assertGreater(size, 0.0, path)


class BehaviourTest(chex.TestCase):
    @parameterized.parameters(*NAMES)
    def test_causal_under_full_teacher_forcing(self, name):
        params = random_params(build_model(name)[1])
        x, y = model_data()
        forward = _forward(name, train=True)
        base = forward(params, x, y, 1.0, model_rngs(2))
        for t in range(H):
            changed = forward(params, x, y.at[:, t:].add(1.0), 1.0, model_rngs(2))
            np.testing.assert_array_equal(changed[:, : t + 1], base[:, : t + 1])
            if t + 1 < H:  # The true candles were fed: later steps must see the change.
                self.assertGreater(
                    float(jnp.max(jnp.abs(changed[:, t + 1 :] - base[:, t + 1 :]))), 0
                )

    @parameterized.parameters(*NAMES)
    def test_teacher_forcing_ratio_draws_on_device(self, name):
        params = random_params(build_model(name)[1])
        x, y = model_data()
        forward = _forward(name, train=True)
        free = _forward(name)(params, x, y, 0.0, model_rngs(0))  # Evaluation: own forecasts only.
        np.testing.assert_allclose(forward(params, x, y, 0.0, model_rngs(0)), free, atol=1e-6)
        forced = forward(params, x, y, 1.0, model_rngs(0))
        self.assertGreater(float(jnp.max(jnp.abs(forced - free))), 1e-4)
        # At 0.5 the draws differ by key; some key must mix fed and forecast candles.
        mixes = [forward(params, x, y, 0.5, model_rngs(seed)) for seed in range(6)]
        self.assertTrue(
            any(
                float(jnp.max(jnp.abs(m - free))) > 1e-4
                and float(jnp.max(jnp.abs(m - forced))) > 1e-4
                for m in mixes
            )
        )

    @parameterized.product(name=NAMES, decoding=("autoregressive", "direct"))
    def test_evaluation_is_deterministic(self, name, decoding):
        # The model has dropout 0.3, and true targets with teacher forcing 1.0 and
        # different keys are offered: evaluation must use none of them.
        params = random_params(build_model(name, decoding)[1])
        x, y = model_data()
        forward = _forward(name, decoding)
        first = forward(params, x, y, 1.0, model_rngs(3))
        np.testing.assert_array_equal(first, forward(params, x, y, 1.0, model_rngs(3)))
        np.testing.assert_array_equal(first, forward(params, x, y + 1.0, 0.5, model_rngs(4)))

    @parameterized.parameters("transformer", "gru")  # The LSTM shares the GRU's scan.
    def test_vmap_over_coins_equals_separate_applies(self, name):
        module = build_model(name)[1]
        coins = [model_data(seed) for seed in range(3)]
        x_KBLF, y_KBHC = jnp.stack([c[0] for c in coins]), jnp.stack([c[1] for c in coins])
        params = [random_params(module, seed) for seed in range(3)]
        params_K = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *params)
        keys_K = jax.vmap(model_rngs)(jnp.arange(3))
        forward = _forward(name, train=True)
        stacked = jax.jit(jax.vmap(forward, in_axes=(0, 0, 0, None, 0)))(
            params_K, x_KBLF, y_KBHC, 0.5, keys_K
        )
        for i in range(3):
            keys = jax.tree_util.tree_map(lambda k, i=i: k[i], keys_K)
            one = forward(params[i], x_KBLF[i], y_KBHC[i], 0.5, keys)
            np.testing.assert_allclose(stacked[i], one, rtol=1e-5, atol=1e-6)

    @parameterized.parameters(*NAMES)
    def test_bfloat16_compute_keeps_float32_params(self, name):
        module = build_model(name, dtype="bfloat16")[1]
        x, y = model_data()
        for path, leaf in param_paths(init_shapes(module, x, y)["params"]):
            self.assertEqual(leaf.dtype, jnp.float32, path)
        params = random_params(module)
        y_hat = _forward(name, dtype="bfloat16")(params, x, y, 0.0, model_rngs(0))
        self.assertEqual(y_hat.dtype, jnp.float32)
        chex.assert_tree_all_finite(y_hat)
        reference = _forward(name)(params, x, y, 0.0, model_rngs(0))
        np.testing.assert_allclose(y_hat, reference, atol=0.05 * float(jnp.max(jnp.abs(reference))))
        self.assertFalse(np.array_equal(y_hat, reference))  # bfloat16 really was used.


def _sinusoid(length, width):
    pe = np.zeros((length, width))
    for pos in range(length):
        for i in range(0, width, 2):
            pe[pos, i] = np.sin(pos / 10000 ** (i / width))
            pe[pos, i + 1] = np.cos(pos / 10000 ** (i / width))
    return pe


def _dense(p, x):
    return x @ np.asarray(p["kernel"], np.float64) + np.asarray(p["bias"], np.float64)


def _norm(p, x):
    z = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    return z * np.asarray(p["scale"], np.float64) + np.asarray(p["bias"], np.float64)


def _mha(p, heads, x_q, x_kv, causal):
    def split(a):
        return a.reshape(a.shape[0], a.shape[1], heads, -1).transpose(0, 2, 1, 3)

    q, k, v = (
        split(_dense(p["query"], x_q)),
        split(_dense(p["key"], x_kv)),
        split(_dense(p["value"], x_kv)),
    )
    logits = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    if causal:
        logits = np.where(np.tril(np.ones(logits.shape[-2:], bool)), logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    out = (w / w.sum(-1, keepdims=True)) @ v
    return _dense(p["out"], out.transpose(0, 2, 1, 3).reshape(x_q.shape))


def _ff(p, x):
    h = _dense(p["linear1"], x)
    return _dense(p["linear2"], 0.5 * h * (1 + special.erf(h / np.sqrt(2))))


def _plain_transformer(params, cfg, x, tokens, causal):
    """torch-style post-LN encoder-decoder without any cache, in float64 numpy."""
    h = _dense(params["input_proj"], np.asarray(x, np.float64)) + _sinusoid(L, cfg.d_model)
    for i in range(cfg.num_encoder_layers):
        p = params[f"encoder_{i}"]
        h = _norm(p["norm1"], h + _mha(p["self_attn"], cfg.num_heads, h, h, False))
        h = _norm(p["norm2"], h + _ff(p["ff"], h))
    d = tokens
    for i in range(cfg.num_decoder_layers):
        p = params[f"decoder_{i}"]
        d = _norm(p["norm1"], d + _mha(p["self_attn"], cfg.num_heads, d, d, causal))
        d = _norm(p["norm2"], d + _mha(p["cross_attn"], cfg.num_heads, d, h, False))
        d = _norm(p["norm3"], d + _ff(p["ff"], d))
    return _dense(params["output_proj"], d)


class TransformerDecoderTest(parameterized.TestCase):
    def _tokens(self, params, cfg, candles_BHC):
        """Decoder inputs: a zero token, then the projected previous candles, plus positions."""
        projected = _dense(params["input_proj"], np.asarray(candles_BHC, np.float64))
        prev = np.concatenate([np.zeros((B, 1, cfg.d_model)), projected[:, :-1]], axis=1)
        return prev + _sinusoid(H, cfg.d_model)

    def test_kv_cache_equals_plain_causal_decoder_when_teacher_forced(self):
        cfg, module = build_model("transformer")
        params = random_params(module)
        x, y = model_data()
        y_hat = _forward("transformer", train=True)(params, x, y, 1.0, model_rngs(0))
        expected = _plain_transformer(params, cfg, x, self._tokens(params, cfg, y), causal=True)
        np.testing.assert_allclose(y_hat, expected, atol=2e-5)

    def test_kv_cache_equals_plain_causal_decoder_on_own_forecasts(self):
        cfg, module = build_model("transformer")
        params = random_params(module)
        x, y = model_data()
        y_hat = _forward("transformer")(params, x, y, 0.0, model_rngs(0))
        expected = _plain_transformer(params, cfg, x, self._tokens(params, cfg, y_hat), causal=True)
        np.testing.assert_allclose(y_hat, expected, atol=2e-5)

    def test_direct_decoder_runs_learned_queries_in_one_pass(self):
        cfg, module = build_model("transformer", "direct")
        params = random_params(module)
        x, y = model_data()
        queries = np.broadcast_to(np.asarray(params["queries"], np.float64), (B, H, cfg.d_model))
        expected = _plain_transformer(params, cfg, x, queries, causal=False)
        y_hat = _forward("transformer", "direct")(params, x, y, 0.0, model_rngs(0))
        np.testing.assert_allclose(y_hat, expected, atol=2e-5)

    def test_extra_features_get_a_separate_target_projection(self):
        c = model_run_config("transformer")
        c.data.features = ("open", "high", "low", "close", "volume")
        cfg = models.make_config(c)
        module = models.build(cfg)
        params = random_params(module, features=5)
        self.assertEqual(params["target_proj"]["kernel"].shape, (C, cfg.d_model))
        self.assertEqual(params["input_proj"]["kernel"].shape, (5, cfg.d_model))
        x, y = model_data(features=5)
        apply = functools.partial(module.apply, train=True, teacher_forcing=1.0, rngs=model_rngs(0))
        chex.assert_shape(jax.eval_shape(apply, {"params": params}, x, y), (B, H, C))


class CellTest(parameterized.TestCase):
    def _cell_params(self, cell, carry, x):
        return cell.init(jax.random.key(0), carry, x)["params"]

    def test_gru_cell_follows_torch_equations(self):
        cfg = models.make_config(model_run_config("gru"))
        cell = gru.GRUCell(5, cfg)
        h, x = np.full((2, 5), 0.3), np.linspace(-1, 1, 6).reshape(2, 3)
        p = jax.tree_util.tree_map(
            lambda a: a + 0.1, self._cell_params(cell, h, x)
        )  # Non-zero biases.
        xi, hh = _dense(p["input"], x), _dense(p["hidden"], h)
        sig = special.expit
        r, z = sig(xi[:, :5] + hh[:, :5]), sig(xi[:, 5:10] + hh[:, 5:10])
        n = np.tanh(xi[:, 10:] + r * hh[:, 10:])
        new_h, _ = cell.apply(
            {"params": p}, jnp.asarray(h, jnp.float32), jnp.asarray(x, jnp.float32)
        )
        np.testing.assert_allclose(new_h, (1 - z) * n + z * h, atol=1e-6)

    def test_lstm_cell_follows_torch_equations(self):
        cfg = models.make_config(model_run_config("lstm"))
        cell = lstm.LSTMCell(5, cfg)
        c, h, x = np.full((2, 5), -0.2), np.full((2, 5), 0.3), np.linspace(-1, 1, 6).reshape(2, 3)
        p = jax.tree_util.tree_map(lambda a: a + 0.1, self._cell_params(cell, (c, h), x))
        g = _dense(p["input"], x) + _dense(p["hidden"], h)
        sig = special.expit
        new_c = sig(g[:, 5:10]) * c + sig(g[:, :5]) * np.tanh(g[:, 10:15])
        (got_c, got_h), _ = cell.apply(
            {"params": p}, (jnp.float32(c), jnp.float32(h)), jnp.float32(x)
        )
        np.testing.assert_allclose(got_c, new_c, atol=1e-6)
        np.testing.assert_allclose(got_h, sig(g[:, 15:]) * np.tanh(new_c), atol=1e-6)


class RegistryTest(parameterized.TestCase):
    @parameterized.parameters(*NAMES)
    def test_make_config_is_frozen_and_complete(self, name):
        run = model_run_config(name, tiny=False)
        cfg = models.make_config(run)
        self.assertEqual(
            (cfg.name, cfg.lookback, cfg.horizon, cfg.num_features, cfg.num_targets),
            (name, 30, 10, 4, 4),
        )
        self.assertEqual(
            (cfg.dropout, cfg.dtype, cfg.precision),
            (run.model.dropout, "float32", jax.lax.Precision.DEFAULT),
        )
        with self.assertRaises(AttributeError):
            cfg.dropout = 0.5
        hash(cfg)  # Usable as a static jit argument.
        run.dtype, run.matmul_precision = "bfloat16", "highest"
        cfg = models.make_config(run)
        self.assertEqual(
            (cfg.compute_dtype, cfg.precision), (jnp.bfloat16, jax.lax.Precision.HIGHEST)
        )

    def test_unknown_name_and_missing_field_are_named(self):
        run = model_run_config("gru")
        run.model.name = "gruu"
        with self.assertRaisesRegex(ValueError, "config.model.name='gruu'"):
            models.make_config(run)
        run = model_run_config("lstm")
        del run.model["attention_heads"]
        with self.assertRaisesRegex(ValueError, "config.model.attention_heads is missing"):
            models.make_config(run)

    @parameterized.parameters(*NAMES)
    def test_wrong_window_shapes_are_rejected(self, name):
        module = build_model(name)[1]
        params = {"params": random_params(module)}
        x, y = model_data()
        with self.assertRaisesRegex(ValueError, "inputs x have shape"):
            jax.eval_shape(module.apply, params, x[..., :3])
        with self.assertRaisesRegex(ValueError, "targets y have shape"):
            jax.eval_shape(module.apply, params, x, y[:, :2])


if __name__ == "__main__":
    absltest.main()
