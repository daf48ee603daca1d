"""Tests of the optional multi-task head (config.model.aux_targets) across its modules.

Config fields and validation, the aux targets `windows.prepare_series` computes (against
a plain loop), their leakage and saved statistics, the models' aux head, and the
training objective and compiled epoch with aux targets on. With aux targets off, the
other test files check that nothing changed (parameter counts, trainings, results).
"""

import functools
import math
import statistics

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from cpbjax import models, sharding, writers
from cpbjax.config import schema as config_lib
from cpbjax.config_rules import ConfigError
from cpbjax.data import auxiliary, stacking, windows
from cpbjax.modes import plan
from cpbjax.training import batching, epoch_spec, group, step
from tests import helpers

AUX = ("bb_position", "realized_vol")
H = helpers.H  # the windows tests' horizon
H_M = helpers.MODEL_H  # the model tests' horizon
# Programs here compile at XLA's -O0, in a third of the time; what the tests check does not
# depend on code generation (the other model and train tests run the default level).
O0 = {"xla_backend_optimization_level": 0}


def _compile(fn, *args):
    """fn jitted and compiled at -O0 for args' shapes."""
    return jax.jit(fn).lower(*args).compile(O0)


# ---------------------------------------------------------------------------------------
# Config.


def test_defaults_are_off_and_validate():
    c = config_lib.load("configs/gru.py")
    assert (c.model.aux_targets, c.model.aux_weight) == ((), 0.1)
    c.model.aux_targets = AUX
    config_lib.validate(c)


@pytest.mark.parametrize(
    "field, value, match",
    [
        (
            "aux_targets",
            ("bb_position", "rsi"),
            r"model.aux_targets='rsi'.*bb_position, realized_vol",
        ),
        ("aux_targets", ("realized_vol", "realized_vol"), "no repeated entries"),
        ("aux_targets", None, "a tuple of auxiliary target names"),
        ("aux_weight", -0.5, r"model.aux_weight=-0.5.*>= 0"),
        ("aux_weight", float("nan"), "model.aux_weight=nan"),
    ],
)
def test_bad_aux_fields_are_named(field, value, match):
    c = config_lib.load("configs/gru.py")
    c.model[field] = value
    with pytest.raises(ConfigError, match=match):
        config_lib.validate(c)


def test_realized_vol_needs_two_returns():
    c = config_lib.load("configs/gru.py")
    c.model.aux_targets, c.data.horizon = ("realized_vol",), 1
    with pytest.raises(ConfigError, match=r"data.horizon=1.*realized_vol"):
        config_lib.validate(c)
    c.model.aux_targets = ("bb_position",)
    config_lib.validate(c)


def test_the_config_accepts_exactly_the_defined_aux_targets():
    c = helpers.tiny_config()
    c.model.aux_targets = tuple(auxiliary.FUNCTIONS)
    config_lib.validate(c)
    c.model.aux_targets = ("bb_position", "not_a_target")
    with pytest.raises(ConfigError, match="not_a_target"):
        config_lib.validate(c)


# ---------------------------------------------------------------------------------------
# Targets on the host.


def _bands_position(close, g):
    """Bollinger position of row g from the 20 closes up to it (population std, 2 sigma)."""
    window = close[g - 19 : g + 1]
    mid, sd = statistics.fmean(window), statistics.pstdev(window)
    lower, upper = mid - 2 * sd, mid + 2 * sd
    return 0.5 if upper == lower else (close[g] - lower) / (upper - lower)


def _reference_raw(series, prep, names, ends):
    """Raw aux targets of `ends` from the raw candles, one window at a time."""
    close = series.ohlcv[:, 3].tolist()
    offset = len(series.ohlcv) - len(prep.ohlc)  # kept rows are the newest ones
    rows = []
    for t in ends:
        g = offset + int(t)
        row = []
        for name in names:
            if name == "realized_vol":
                rets = [math.log(close[g + i] / close[g + i - 1]) for i in range(1, H + 1)]
                row.append(statistics.pstdev(rets))
            else:
                row.append(_bands_position(close, g + H))
        rows.append(row)
    return np.array(rows)


def _reference_aux(series, prep, names, kind):
    """(all ends, their expected aux rows, the RMS of the train windows' OHLC targets).

    Aux rows are z-scored with their train windows' statistics, then scaled by that RMS.
    """
    ends = np.concatenate([prep.ends[s] for s in windows.SPLITS])
    raw = _reference_raw(series, prep, names, ends)
    n = len(prep.ends["train"])
    _, y = helpers.reference_windows(
        series, prep, ("open", "high", "low", "close"), kind, prep.ends["train"]
    )
    rms = math.sqrt(float(np.mean(y**2)))
    return ends, (raw - raw[:n].mean(axis=0)) / raw[:n].std(axis=0) * rms, rms


@pytest.mark.parametrize("kind", ["last_close"])
def test_aux_targets_match_a_plain_loop(kind):
    series = helpers.make_series(missing=(150, 300))  # gaps: rows, not times, index candles
    prep = windows.prepare_series(series, helpers.data_config(normalization=kind), aux_targets=AUX)
    ends, expected, rms = _reference_aux(series, prep, AUX, kind)
    assert prep.aux.shape == (len(prep.inputs), 2) and prep.aux.dtype == np.float32
    np.testing.assert_allclose(prep.aux[ends], expected, rtol=1e-5, atol=1e-6)
    unused = np.setdiff1d(np.arange(len(prep.aux)), ends)
    assert not prep.aux[unused].any()  # rows that end no window hold nothing
    # On the train windows each aux target has the OHLC targets' RMS, so the MSEs compare.
    train_rms = np.sqrt(np.mean(prep.aux[prep.ends["train"]].astype(np.float64) ** 2, axis=0))
    np.testing.assert_allclose(train_rms, [rms, rms], rtol=1e-5)


def test_without_aux_targets_nothing_changes():
    series, cfg = helpers.make_series(), helpers.data_config()
    plain = windows.prepare_series(series, cfg)
    aux = windows.prepare_series(series, cfg, aux_targets=AUX)
    assert plain.aux.shape == (len(plain.inputs), 0)
    assert not any(key.startswith("aux") for key in plain.norm)
    # The history before the kept candles covers the bands' warm-up: the same windows.
    for field in ("inputs", "targets", "anchor", "open_time_ms"):
        np.testing.assert_array_equal(getattr(plain, field), getattr(aux, field))
    for split in windows.SPLITS:
        np.testing.assert_array_equal(plain.ends[split], aux.ends[split])


def test_bb_position_warmup_is_dropped_not_filled():
    series = helpers.make_series(n=300)
    cfg = helpers.data_config()  # OHLC inputs alone need no warm-up
    plain = windows.prepare_series(series, cfg)
    prep = windows.prepare_series(series, cfg, aux_targets=("bb_position",))
    assert len(plain.inputs) == 300 and len(prep.inputs) == 300 - 19
    ends, expected, _ = _reference_aux(series, prep, ("bb_position",), "last_close")
    np.testing.assert_allclose(prep.aux[ends], expected, rtol=1e-5, atol=1e-6)


def _train_aux(prep):
    return prep.ends["train"], prep.aux[prep.ends["train"]]


@pytest.mark.parametrize("kind", ["last_close"])
def test_later_candles_do_not_leak_into_training_aux_targets(kind):
    cfg = helpers.data_config(normalization=kind)
    series = helpers.make_series(missing=(150, 300))
    prep = windows.prepare_series(series, cfg, aux_targets=AUX)
    offset = len(series.ohlcv) - len(prep.ohlc)
    boundary = offset + prep.ends["train"][-1] + H + 1  # first candle no training window reads
    changed = windows.prepare_series(helpers.perturbed(series, boundary), cfg, aux_targets=AUX)
    for before, after in zip(_train_aux(prep), _train_aux(changed), strict=True):
        np.testing.assert_array_equal(before, after)
    for key in ("aux_targets", "aux_mean", "aux_std"):
        np.testing.assert_array_equal(changed.norm[key], prep.norm[key])
    assert not np.array_equal(prep.aux, changed.aux)  # the change did reach val/test
    # The last training window's targets end at boundary - 1: both aux targets read it.
    touched = windows.prepare_series(helpers.perturbed(series, boundary - 1), cfg, aux_targets=AUX)
    last_before, last_after = _train_aux(prep)[1][-1], _train_aux(touched)[1][-1]
    assert (last_before != last_after).all()


def test_saved_aux_statistics_scale_new_data_by_name():
    cfg = helpers.data_config()
    trained_on, new = helpers.make_series(seed=0), helpers.make_series(seed=7)
    saved = writers.to_jsonable(windows.prepare_series(trained_on, cfg, aux_targets=AUX).norm)
    assert saved["aux_targets"] == list(AUX)  # meta.json keeps the names with the statistics
    reordered = AUX[::-1]
    prep = windows.prepare_series(new, cfg, fitted_norm=saved, aux_targets=reordered)
    ends = np.concatenate([prep.ends[s] for s in windows.SPLITS])
    mean = dict(zip(AUX, saved["aux_mean"], strict=True))
    std = dict(zip(AUX, saved["aux_std"], strict=True))
    raw = _reference_raw(new, prep, reordered, ends)
    expected = (raw - [mean[n] for n in reordered]) / [std[n] for n in reordered]
    np.testing.assert_allclose(prep.aux[ends], expected, rtol=1e-5, atol=1e-6)
    refitted = windows.prepare_series(new, cfg, aux_targets=reordered)
    assert not np.allclose(refitted.aux[ends], prep.aux[ends], atol=1e-3)
    old_model = {k: v for k, v in saved.items() if not k.startswith("aux")}
    with pytest.raises(ValueError, match=r"no statistics of aux targets \['realized_vol'"):
        windows.prepare_series(new, cfg, fitted_norm=old_model, aux_targets=reordered)
    with pytest.raises(ValueError, match="aux targets"):
        windows.prepare_series(new, cfg, aux_targets=("rsi",))


def test_stack_group_carries_aux_and_gathers_by_window_end():
    cfg = helpers.data_config(min_candles=100)
    preps = [
        windows.prepare_series(helpers.make_series(n=n, seed=n), cfg, aux_targets=AUX)
        for n in (360, 150)
    ]
    group = stacking.stack_group(preps, 3, cfg)
    assert group.aux.shape == (3, stacking.padded_sizes(cfg)["T"], 2)
    assert not np.asarray(group.aux[2]).any()
    ends_KB = group.train_ends[:, :7]
    aux_KBA = jax.jit(jax.vmap(stacking.gather_aux))(group.aux, ends_KB)
    for k, prep in enumerate(preps):
        np.testing.assert_array_equal(aux_KBA[k], prep.aux[prep.ends["train"][:7]])
    plain = windows.prepare_series(helpers.make_series(), cfg)
    with pytest.raises(ValueError, match="0 aux targets"):
        stacking.stack_group([preps[0], plain], 3, cfg)
    empty = stacking.stack_group([plain], 2, cfg)  # no aux targets: a zero-width array
    assert empty.aux.shape == (2, stacking.padded_sizes(cfg)["T"], 0)


# ---------------------------------------------------------------------------------------
# Models.

WIDTH = {"transformer": "d_model", "gru": "hidden", "lstm": "hidden"}
# The LSTM's aux head is the GRU's (both are seq2seq.RNNSeq2Seq): compiling it again adds nothing.
SHARED_CODE = ("transformer", "gru")


@functools.cache
def _aux_model(name, decoding="autoregressive"):
    c = helpers.model_run_config(name, decoding, transformer_layers=1)
    c.model.aux_targets = AUX
    cfg = models.make_config(config_lib.validate(c))
    return cfg, models.build(cfg)


class AuxHeadTest(parameterized.TestCase):
    @parameterized.parameters(("transformer", 926_852), ("gru", 334_597), ("lstm", 1_984_772))
    def test_head_adds_one_linear_layer_to_the_reference_count(self, name, reference):
        c = config_lib.load(f"configs/{name}.py:replaced")  # the reference counts' model
        x, y = jnp.zeros((2, 30, 4)), jnp.zeros((2, 10, 4))
        counts = {}
        for aux in ((), AUX):
            c.model.aux_targets = aux
            module = models.build(models.make_config(c))
            counts[aux] = helpers.init_shapes(module, x, y)["params"]
        width = c.model[WIDTH[name]]
        self.assertNotIn("aux_head", counts[()])
        self.assertEqual(counts[AUX]["aux_head"]["kernel"].shape, (width, 2))
        sizes = {a: sum(p.size for p in jax.tree.leaves(t)) for a, t in counts.items()}
        self.assertEqual(sizes, {(): reference, AUX: reference + (width + 1) * 2})

    @parameterized.product(name=SHARED_CODE, decoding=("autoregressive", "direct"))
    def test_forecast_api_is_unchanged(self, name, decoding):
        _, module = _aux_model(name, decoding)
        params = {"params": helpers.random_params(module)}
        x, _ = helpers.model_data()
        plain = jax.eval_shape(module.apply, params, x)
        both = jax.eval_shape(functools.partial(module.apply, return_aux=True), params, x)
        self.assertIsInstance(plain, jax.ShapeDtypeStruct)
        self.assertEqual((plain.shape, plain.dtype), ((helpers.MODEL_B, H_M, 4), jnp.float32))
        self.assertEqual(both[0], plain)
        self.assertEqual((both[1].shape, both[1].dtype), ((helpers.MODEL_B, 2), jnp.float32))
        off = helpers.build_model(name, decoding, transformer_layers=1)[1]
        off_params = {"params": helpers.random_params(off)}
        aux_off = jax.eval_shape(functools.partial(off.apply, return_aux=True), off_params, x)[1]
        self.assertEqual(aux_off.shape, (helpers.MODEL_B, 0))

    @parameterized.parameters(*SHARED_CODE)
    def test_aux_gradient_reaches_head_and_encoder_never_the_decoder(self, name):
        _, module = _aux_model(name)
        params = helpers.random_params(module)
        x, y = helpers.model_data()

        def aux_and_grads(p, y):  # training mode, full teacher forcing: true candles are fed
            def loss(p):
                aux = module.apply(
                    {"params": p},
                    x,
                    y,
                    train=True,
                    teacher_forcing=1.0,
                    return_aux=True,
                    rngs=helpers.model_rngs(0),
                )[1]
                return jnp.mean(aux**2), aux

            return jax.value_and_grad(loss, has_aux=True)(p)

        aux_and_grads = _compile(aux_and_grads, params, y)
        (_, aux), grads = aux_and_grads(params, y)
        for path, g in helpers.param_paths(grads):
            size = float(jnp.max(jnp.abs(g)))
            decoder_side = path.startswith(
                ("decoder", "head_", "output_proj", "attention", "queries", "target_proj")
            )
            if decoder_side:
                self.assertEqual(size, 0.0, path)
            elif not path.endswith(helpers.SHIFT_INVARIANT):
                self.assertGreater(size, 0.0, path)
        self.assertGreater(float(jnp.max(jnp.abs(grads["aux_head"]["kernel"]))), 0.0)
        # The summary comes before decoding: the fed candles never reach the aux forecast.
        np.testing.assert_array_equal(aux, aux_and_grads(params, y + 1.0)[0][1])


# ---------------------------------------------------------------------------------------
# Training.

WEIGHT = 0.3
L_T, H_T = helpers.tiny_config().data.lookback, helpers.tiny_config().data.horizon


def _aux_config():
    c = helpers.tiny_config()
    c.model.aux_targets, c.model.aux_weight = AUX, WEIGHT
    c.train.loss, c.train.loss_scale = "mse", "none"  # the objective the references write out
    return config_lib.validate(c)


def _aux_trainer(config):
    module = models.build(models.make_config(config))
    return group.GroupTrainer(
        epoch_spec.make_spec(config, module),
        helpers.NUM_COINS,
        sharding.coin_mesh(jax.devices()[:1]),
    )


@functools.cache
def _aux_preps():
    preps, skipped = plan.prepare_all(_aux_config())  # the run driver's own preparation
    assert not skipped and all(p.aux.shape[1] == 2 for p in preps)
    return tuple(preps)


@functools.cache
def _epoch_trainer():
    return _aux_trainer(_aux_config())


@functools.cache
def _init_program():
    trainer = _epoch_trainer()
    arrays = trainer.stack(list(_aux_preps()))
    keys = jnp.asarray(group.coin_keys(0, range(4)))
    return trainer._init_jit.lower(keys, arrays).compile(O0)


def _fresh(order):
    """(arrays, fresh GroupState) of the group with the series in `order` (init_state at -O0)."""
    arrays = _epoch_trainer().stack([_aux_preps()[i] for i in order])
    keys = jnp.asarray(group.coin_keys(0, list(order) + [3]))
    return arrays, _init_program()(keys, arrays)


def test_objective_is_ohlc_mse_plus_weighted_aux_mse():
    # Direct decoding (train_test's GRU) never draws teacher forcing: a deterministic forward.
    trainer = _aux_trainer(_aux_config())
    prep = _aux_preps()[1]
    arrays, state = _fresh((0, 1, 2))
    params = jax.tree.map(lambda a: a[1], state.params)
    data = jax.tree.map(lambda a: a[1] if a.ndim > 1 else a, batching.coin_data(arrays))
    ends = jnp.asarray(prep.ends["train"][:32], jnp.int32)
    mask = jnp.arange(32) % 5 != 0  # some windows are padding
    args = (params, batching.SeriesWindows(data, ends), mask, jax.random.key(0))
    objective, ohlc = _compile(functools.partial(step.coin_loss, trainer.spec), *args)(*args)
    # Reference: windows gathered in numpy, MSEs averaged over the valid windows.
    e, m = np.asarray(ends), np.asarray(mask)
    anchor = prep.anchor[e, None, None]
    x = prep.inputs[e[:, None] + np.arange(-L_T + 1, 1)] - anchor * prep.price_mask
    y = prep.targets[e[:, None] + np.arange(1, H_T + 1)] - anchor
    forward = functools.partial(trainer.module.apply, return_aux=True)
    y_hat, aux_hat = _compile(forward, {"params": params}, x)({"params": params}, x)
    ohlc_mse = np.mean((np.asarray(y_hat, np.float64) - y)[m] ** 2)
    aux_mse = np.mean((np.asarray(aux_hat, np.float64) - prep.aux[e])[m] ** 2)
    np.testing.assert_allclose(ohlc, ohlc_mse, rtol=1e-5)
    np.testing.assert_allclose(objective, ohlc_mse + WEIGHT * aux_mse, rtol=1e-5)
    assert WEIGHT * aux_mse > 0.05 * ohlc_mse  # the aux term really is in the objective
    with pytest.raises(ValueError, match="0 aux target columns"):
        no_aux = data._replace(aux_TA=jnp.zeros((data.inputs_TF.shape[0], 0)))
        batching.gather_windows(trainer.spec, no_aux, ends)


def test_epoch_with_aux_trains_the_head_and_keeps_coins_independent():
    trainer, epoch, runs = _epoch_trainer(), None, []
    for order in ((0, 1, 2), (2, 0, 1)):
        arrays, state = _fresh(order)
        fresh = jax.device_get(state.params)
        if epoch is None:  # one program for both placements of the series
            epoch = trainer.lowered_epoch(state, arrays).compile(O0)
        state, metrics = epoch(state, arrays)
        params, metrics = jax.device_get((state.params, metrics))
        assert np.isfinite(metrics["val_loss"][:3]).all() and metrics["active"][:3].all()
        moved = np.abs(params["aux_head"]["kernel"] - fresh["aux_head"]["kernel"]).max(axis=(1, 2))
        assert (moved[:3] > 1e-4).all() and moved[3] == 0  # the padded coin stays frozen
        runs.append((order, params, metrics))
    # A series trains the same in any slot: nothing, aux targets included, crosses coins.
    (a_order, a, a_m), (b_order, b, b_m) = runs
    for slot_a, series in enumerate(a_order):
        slot_b = b_order.index(series)
        helpers.assert_trees_close(
            helpers.coin(a, slot_a), helpers.coin(b, slot_b), **helpers.CROSS_PROGRAM
        )
        np.testing.assert_allclose(a_m["val_loss"][slot_a], b_m["val_loss"][slot_b], rtol=1e-5)
