"""The pre-flight memory check of an epoch program (cpbjax/training/memory.py), without training.

The driver's use of it (a run that cannot fit stops before its first epoch; the checked
program is the one the epochs run) is tested on a real run in tests/api_test.py.
"""

import logging

import jax
import jax.numpy as jnp
import pytest

from cpbjax.config import schema as config_lib
from cpbjax.config_rules import ConfigError
from cpbjax.training import memory

F32 = jnp.float32
MIB = 2**20


def _compiled(fn, *shapes, donate=()):
    args = [jax.ShapeDtypeStruct(s, F32) for s in shapes]
    return jax.jit(fn, donate_argnums=donate).lower(*args).compile()


def test_a_donated_output_needs_no_memory_beyond_its_input():
    kept = memory.epoch_need(_compiled(lambda s: s * 2 + 1, (1024, 1024)), devices=1)
    donated = memory.epoch_need(_compiled(lambda s: s * 2 + 1, (1024, 1024), donate=(0,)), 1)
    assert kept.per_device == 1024 * 1024 * 4  # a new output buffer of the array's size
    assert donated.per_device == 0  # written in place of the donated input


def test_the_need_holds_what_the_backward_pass_keeps_and_grows_with_the_batch():
    def grad(w, x):  # keeps both tanh activations, [N, 256] each, for the backward pass
        return jax.grad(lambda w: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w)))(w)

    n = 1024
    small = memory.epoch_need(_compiled(grad, (256, 256), (n, 256)), 1).per_device
    large = memory.epoch_need(_compiled(grad, (256, 256), (4 * n, 256)), 1).per_device
    assert small >= 2 * n * 256 * 4
    assert 3 * small < large <= 4 * small + 256 * 256 * 4


def test_the_cpu_devices_share_the_hosts_ram_and_an_accelerator_has_its_own():
    need = memory.Need(per_device=3 * MIB, devices=2)
    assert need.on("cpu") == 6 * MIB and need.on("gpu") == 3 * MIB


def test_host_memory_reads_meminfo_in_bytes(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683640 kB\nMemFree: 1 kB\nMemAvailable:    9870000 kB\n")
    assert memory.host_memory(str(meminfo)) == (24683640 * 1024, 9870000 * 1024)
    meminfo.write_text("MemTotal:       24683640 kB\n")  # an old kernel: no MemAvailable
    assert memory.host_memory(str(meminfo)) is None
    assert memory.host_memory(str(tmp_path / "absent")) is None


class _Device:
    def __init__(self, stats):
        self.stats = stats

    def memory_stats(self):
        return self.stats


def test_device_memory_is_the_tightest_devices_limit_and_free_bytes():
    roomy = _Device({"bytes_limit": 80 * MIB, "bytes_in_use": 10 * MIB})
    busy = _Device({"bytes_limit": 80 * MIB, "bytes_in_use": 50 * MIB})
    assert memory.device_memory([roomy, busy]) == (80 * MIB, 30 * MIB)
    assert memory.device_memory([roomy, _Device(None)]) is None  # the CPU backend


def test_check_stops_a_program_larger_than_the_pool_and_names_the_fix():
    need = memory.Need(per_device=3 * 2**30, devices=2)
    with pytest.raises(memory.DoesNotFit) as e:
        memory.check("group-000", need, "cpu", (4 * 2**30, 4 * 2**30), "lower train.batch_size")
    message = str(e.value)
    assert message == (
        "group-000: one epoch needs about 6.00 GiB beyond its data, more than the 4.00 GiB "
        "of this host's RAM: lower train.batch_size"
    )
    assert isinstance(e.value, ConfigError)  # so launch.py exits 2 with it
    memory.check("group-000", need, "gpu", (4 * 2**30, 4 * 2**30), "-")  # 3 GiB per device


def test_check_warns_when_the_program_exceeds_only_the_free_memory(caplog):
    need = memory.Need(per_device=3 * 2**30, devices=1)
    with caplog.at_level(logging.INFO):
        memory.check("group-001", need, "gpu", (8 * 2**30, 2 * 2**30), "the fix")
        memory.check("group-002", need, "gpu", (8 * 2**30, 6 * 2**30), "the fix")
        memory.check("group-003", need, "gpu", None, "the fix")
    lines = {
        r.getMessage().split(":")[0]: r for r in caplog.records if "one epoch" in r.getMessage()
    }
    assert lines["group-001"].levelno == logging.WARNING
    assert (
        "more than the 2.00 GiB of one gpu device's memory free now"
        in lines["group-001"].getMessage()
    )
    assert "the fix" in lines["group-001"].getMessage()
    assert lines["group-002"].levelno == logging.INFO  # fits: said, not warned
    assert lines["group-003"].levelno == logging.INFO  # capacity unknown: the need alone


def test_the_fix_names_the_fields_of_the_training_mode():
    train = config_lib.base_config().train
    train.batch_size, train.share = 128, "pooled"
    assert memory.remedy(train, 40) == (
        "lower train.batch_size (128 windows per coin per step), take the gradient in "
        "smaller chunks of coins (train.pooled_chunk, 40 of 40 now), or train one model per "
        "series (train.share='series')"
    )
    train.pooled_chunk = 8
    assert "(train.pooled_chunk, 8 of 40 now)" in memory.remedy(train, 40)
    # On 4 devices each holds 10 of the 40 coins; a chunk splits those.
    assert "(train.pooled_chunk, 8 of the 10 coins each device holds now)" in memory.remedy(
        train, 40, 4
    )
    train.pooled_chunk = 16  # more than a device holds: one chunk of all of them
    assert "(train.pooled_chunk, 10 of the 10 coins each device holds now)" in memory.remedy(
        train, 40, 4
    )
    train.share = "series"
    assert "train.group_size (8 coins per program)" in memory.remedy(train, 8)
