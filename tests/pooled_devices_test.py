"""The pooled model (train.share=pooled) trained data-parallel over 4 devices equals one device.

A subprocess with 4 XLA host devices (the flag must be set before jax starts) trains
tiny_config's 3 series pooled on a 1-device mesh (K=3) and on a 4-device mesh (K=4: one
coin per device, the last device holding only a padded coin), and checks there that the
params are replicated and that each step's only cross-device traffic is its all-reduce.
The two runs must agree on every epoch's losses and on the final params up to float
summation order (losses rtol 1e-5, params CROSS_PROGRAM): on 4 devices each step's objective and gradient are 4 partial sums
added by the all-reduce instead of one sum over all windows (float32, about 1e-7 apart),
and the 3 epochs' Adam updates carry that on. The MSE objective keeps that growth small
(MAE's sign gradient would grow it; docs/design.md).
"""

import numpy as np

from tests import helpers
from tests.helpers import CROSS_PROGRAM

EPOCHS = 3
METRICS = ("train_loss", "val_loss", "stop_val_loss", "best_val_loss", "val_gain_se")
# The attention pooling's score bias: a softmax does not change when every score shifts,
# so its true gradient is 0 and its computed one rounding noise, which Adam scales up to
# steps of about the learning rate. Its value then depends on summation order alone
# (about 2e-5 apart here) and changes no forecast: the losses above compare the rest.
SHIFT_INVARIANT = "['attention']['score']['bias']"

_RUNS = r"""
import re, sys
import jax, numpy as np
from cpbjax import models, sharding
from cpbjax.config import schema as config_lib
from cpbjax.training import epoch_spec
from cpbjax.training.group import GroupTrainer, coin_keys
from tests import helpers

assert jax.device_count() == 4, jax.devices()
config = helpers.pooled_config()
config.train.loss = "mse"
config = config_lib.validate(config)
module = models.build(models.make_config(config))
preps = list(helpers.tiny_preps())
out = {}
for n, k in ((1, 3), (4, 4)):
    trainer = GroupTrainer(epoch_spec.make_spec(config, module), k, sharding.coin_mesh(jax.devices()[:n]))
    arrays = trainer.stack(preps)
    state = trainer.init_state(coin_keys(0, range(k)), arrays)
    epoch = trainer.lowered_epoch(state, arrays).compile()  # run_epoch's program, compiled once
    history = []
    for _ in range(EPOCHS):
        state, metrics = epoch(state, arrays)
        history.append(jax.device_get(metrics))
    for name in METRICS:
        out[f"{name}{n}"] = np.stack([m[name][:3] for m in history])
    for path, leaf in jax.tree_util.tree_flatten_with_path(jax.device_get(state.params))[0]:
        out[f"param{n}" + jax.tree_util.keystr(path)] = leaf[0]
        for c in range(1, k):  # replicated: every coin, on every device, holds the same
            np.testing.assert_array_equal(leaf[c], leaf[0])
leaf = jax.tree.leaves(state.params)[0]
assert leaf.sharding.spec == jax.sharding.PartitionSpec("coins"), leaf.sharding
assert len(leaf.sharding.device_set) == 4, leaf.sharding
hlo = epoch.as_text()
ops = re.findall(r"= \S+ (all-reduce|all-gather|all-to-all|collective-permute|reduce-scatter)"
                 r"(?:-start)?\(.*?op_name=\"([^\"]*)\"", hlo)
# Per step (in the scan's while loop): the all-reduces of the window count and of the
# objective and gradient. Per epoch, outside it: the all-gathers of the shared view and of
# the val sums. Nothing else crosses devices.
in_loop = {op for op, name in ops if "/while/" in name}
per_epoch = {op for op, name in ops if "/while/" not in name}
assert in_loop == {"all-reduce"} and per_epoch == {"all-gather"}, ops
np.savez(sys.argv[1], **out)
""".replace("EPOCHS", str(EPOCHS)).replace("METRICS", repr(METRICS))


def test_pooled_over_four_devices_equals_one_device(tmp_path):
    out = str(tmp_path / "runs.npz")
    helpers.run_on_host_devices(_RUNS, out)
    with np.load(out) as z:
        for name in METRICS:
            assert np.isfinite(z[f"{name}1"]).all(), name
            np.testing.assert_allclose(z[f"{name}4"], z[f"{name}1"], rtol=1e-5, err_msg=name)
        params = [f[len("param1") :] for f in z.files if f.startswith("param1")]
        assert len(params) == 12 and SHIFT_INVARIANT in params, params
        for name in params:
            if name != SHIFT_INVARIANT:
                np.testing.assert_allclose(z[f"param4{name}"], z[f"param1{name}"], **CROSS_PROGRAM)
        # Training moved the model, so the equality is not of two untrained models.
        assert np.all(z["train_loss1"][-1] < z["train_loss1"][0])
