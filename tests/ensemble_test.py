"""Tests of model.ensemble (cpbjax/models/ensemble.py): members trained as one program.

References: each member as a model of its own (its slice of the stacked params, state
and optimizer state, run through the same trainer with ensemble=1), and the members'
forecasts averaged by hand. That the untrained ensemble is the band exactly and that the
band refit moves its forecasts as the shifted model's forward pass: levers_test and
band_refit_test, parametrized by the ensemble.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cpbjax
from cpbjax import models, sharding
from cpbjax import workdir as workdir_lib
from cpbjax.config import schema as config_lib
from cpbjax.config_rules import ConfigError
from cpbjax.models import ensemble as ensemble_lib
from cpbjax.score import evaluate
from cpbjax.training import checkpoint, epoch_spec
from cpbjax.training.group import GroupTrainer, coin_keys
from tests import helpers

SIZE = 3  # members of the ensembles tested


def _member(tree, m: int, like=None):
    """Member m of a stacked [K, Y, ...] pytree (a GroupState's params or Optax state), in
    the tree structure of `like` (one model's, without the "members" level) when given."""
    leaves = [np.asarray(a)[:, m] for a in jax.tree.leaves(tree)]
    return jax.tree.unflatten(jax.tree.structure(tree if like is None else like), leaves)


def _members_alone(config):
    """(ensemble trainer, the same config with ensemble=1's trainer), on tiny_preps' series."""
    mesh = sharding.coin_mesh(jax.devices()[:1])
    trainers = []
    for members in (SIZE, 1):
        c = config.copy_and_resolve_references()
        c.model.ensemble = members
        c = config_lib.validate(c)
        module = models.build(models.make_config(c))
        trainers.append(
            GroupTrainer(epoch_spec.make_spec(c, module), len(helpers.POOLED_NAMES), mesh)
        )
    return trainers


def _config(kind: str):
    """The 3-series test config (pooled or per series), no dropout (a member's dropout key
    under nn.vmap is not the one alone), and a gradient clip so small that it binds on
    every step: members clipped together would not train as alone."""
    c = helpers.pooled_config() if kind == "pooled" else helpers.tiny_config()
    c.model.dropout, c.train.grad_clip = 0.0, 1e-3
    return config_lib.validate(c)


@pytest.mark.parametrize("kind", ["series", "pooled"])
def test_an_epoch_trains_each_member_as_that_member_alone(kind):
    config = _config(kind)
    ensemble, alone = _members_alone(config)
    arrays = ensemble.stack(list(helpers.tiny_preps()))
    keys = coin_keys(0, range(len(helpers.POOLED_NAMES)))
    state0 = jax.device_get(ensemble.init_state(keys, arrays))
    state, metrics = jax.device_get(ensemble.run_epoch(jax.device_put(state0), arrays))
    like = jax.device_get(alone.init_state(keys, arrays))  # one model's tree structure
    train_losses = []
    for m in range(SIZE):
        member0 = state0.replace(
            params=_member(state0.params, m, like.params),
            opt_state=_member(state0.opt_state, m, like.opt_state),
            best_params=_member(state0.best_params, m, like.params),
        )
        member, member_metrics = jax.device_get(alone.run_epoch(jax.device_put(member0), arrays))
        got = _member(state.params, m, like.params)
        helpers.assert_trees_close(got, member.params, **helpers.CROSS_PROGRAM)
        train_losses.append(member_metrics["train_loss"])
    # The members started apart (their own init keys) and trained: not a copy of one model.
    first, second, untrained = (
        jax.tree.leaves(_member(tree, m))
        for tree, m in ((state.params, 0), (state.params, 1), (state0.params, 0))
    )
    assert not all(np.allclose(a, b) for a, b in zip(first, second, strict=True))
    assert not all(np.allclose(a, b) for a, b in zip(first, untrained, strict=True))
    # The reported train loss is the members' mean.
    np.testing.assert_allclose(metrics["train_loss"], np.mean(train_losses, axis=0), rtol=1e-5)


def test_the_forecast_is_the_mean_of_the_members_forecasts():
    c = helpers.tiny_config()
    c.model.ensemble = SIZE
    cfg = models.make_config(config_lib.validate(c))
    ensemble, member = models.build(cfg), models.REGISTRY[cfg.name][0](cfg)
    x = jnp.asarray(helpers.random_window(np.random.default_rng(0), cfg), jnp.float32)
    params = ensemble.init(jax.random.key(1), x)["params"]
    y_hat = ensemble.apply({"params": params}, x)
    alone = [
        member.apply({"params": jax.tree.map(lambda a, m=m: a[m], params[ensemble_lib.MEMBERS])}, x)
        for m in range(SIZE)
    ]
    np.testing.assert_allclose(y_hat, np.mean(alone, axis=0), rtol=1e-5, atol=1e-7)
    assert not np.allclose(alone[0], alone[1])  # each member its own init


@pytest.mark.parametrize("value", [0, -1, 65])
def test_a_bad_ensemble_size_is_a_config_error(value):
    c = helpers.tiny_config()
    c.model.ensemble = value
    with pytest.raises(ConfigError, match=r"model\.ensemble"):
        config_lib.validate(c)


def test_a_trained_ensemble_saves_the_members_its_test_split_scored(tmp_path):
    """A pooled ensemble run end to end: each series' saved model holds the members, and
    scored again (its band refit on train+val already in it) it scores test as the run did;
    its exported model card says it is an ensemble."""
    c = helpers.pooled_config()
    c.model.ensemble, c.train.epochs = 2, 3
    c = config_lib.validate(c)
    results = cpbjax.train(c, str(tmp_path))
    module, (L, H) = models.build(models.make_config(c)), (c.data.lookback, c.data.horizon)
    assert sorted(results["series"]) == sorted(helpers.POOLED_NAMES)
    for prep in helpers.tiny_preps():
        saved = workdir_lib.series_model(str(tmp_path), prep.name)
        params, _ = checkpoint.load_series_model(saved)
        assert {a.shape[0] for a in jax.tree.leaves(params[ensemble_lib.MEMBERS])} == {2}
        again = evaluate.evaluate_model(
            module, params, prep, evaluate.EvalSpec(L, H, refit_band=True)
        ).entry
        for col in ("high", "low", "close"):
            got = again["test"]["columns"][col]["mae"]
            want = results["series"][prep.name]["test"]["columns"][col]["mae"]
            assert got == pytest.approx(want, rel=1e-6)
    for folder in cpbjax.export(str(tmp_path)).values():
        with open(f"{folder}/README.md") as f:
            assert "the mean forecast of 2 members trained together" in f.read()
