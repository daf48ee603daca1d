"""Every Orbax call of cpbjax: group train-state checkpoints and per-series best models.

Layout under a workdir:
  checkpoints/group-000/<epoch>/     the full train state of one group (Orbax CheckpointManager)
  checkpoints/group-000/digests.json epoch -> digest of every array of that checkpoint
  models/<SYMBOL>-<INTERVAL>/        params/ (Orbax) + meta.json: one series' best model,
                                     loadable alone with `load_series_model`.

Orbax verifies structure and metadata, not the bytes of the arrays: a checkpoint whose
array data was damaged in place restores "successfully". So each save records a digest
of every array (computed on the devices, per coin row, so it does not depend on how the
coins are spread over devices), and a restore that does not reproduce it is treated as
unreadable: the step is deleted and the previous one is tried.
"""

from __future__ import annotations

import hashlib
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from cpbjax import sharding, writers

DIGESTS_FILE = "digests.json"


class DamagedCheckpoint(ValueError):
    """A restored checkpoint whose arrays do not match the digest recorded when it was saved."""


def _as_uint32_rows(leaf: jax.Array) -> jax.Array:
    """The bits of a [R, ...] leaf (a scalar as [1]) as uint32 [R, M]."""
    x = leaf[None] if leaf.ndim == 0 else leaf
    if x.dtype == jnp.bool_:
        bits = x.astype(jnp.uint32)
    else:
        unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
        bits = jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)
    return bits.reshape(x.shape[0], -1)


@jax.jit
def _row_hashes(leaves: list) -> list:
    """Two uint32 hashes per row of every leaf, [R, 2] each.

    Rows are reduced separately, so a coin-sharded leaf needs no cross-device collective.
    A flipped bit changes each hash (the weights are odd, so no single-bit change
    vanishes modulo 2**32), and the position weights catch moved values.
    """
    out = []
    for leaf in leaves:
        bits_RM = _as_uint32_rows(leaf)
        idx_M = jnp.arange(bits_RM.shape[1], dtype=jnp.uint32)
        h1 = jnp.sum(bits_RM * (2 * idx_M + 1), axis=1, dtype=jnp.uint32)
        mixed = (bits_RM ^ (idx_M * jnp.uint32(0x9E3779B9))) * jnp.uint32(0x85EBCA6B)
        out.append(jnp.stack([h1, jnp.sum(mixed, axis=1, dtype=jnp.uint32)], axis=1))
    return out


def state_digest(state) -> str:
    """sha256 hex of every array of a pytree, independent of its device layout.

    A collective in a multi-host run (the row hashes are gathered): every process calls it.
    """
    hashes = sharding.to_host(_row_hashes(jax.tree.leaves(state)))
    digest = hashlib.sha256(str(jax.tree.structure(state)).encode())
    for h in hashes:
        digest.update(np.ascontiguousarray(h, np.uint32).tobytes())
    return digest.hexdigest()


META_FILE = "meta.json"
PARAMS_DIR = "params"


class GroupCheckpoints:
    """Saves a group's train state every `every_epochs` epochs and keeps the newest `keep`.

    Orbax writes each checkpoint to a temporary folder and renames it when complete,
    so a process killed mid-save leaves no half checkpoint among the steps.
    """

    def __init__(self, directory: str, every_epochs: int, keep: int):
        self.directory = os.path.abspath(directory)
        self.every_epochs = every_epochs
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, cleanup_tmp_directories=True
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def due(self, epoch: int, force: bool = False) -> bool:
        """Whether `maybe_save` would save step `epoch` (a multiple of every_epochs, or
        `force`, and not saved yet): lets a caller build the state only when needed."""
        return (force or epoch % self.every_epochs == 0) and epoch not in self._manager.all_steps()

    def maybe_save(self, epoch: int, state, force: bool = False) -> bool:
        """Saves `state` as step `epoch` if `due(epoch, force)`.

        The save is asynchronous: it returns once the arrays are copied off the
        device, so the caller may donate `state` to the next epoch.
        """
        if not self.due(epoch, force):
            return False
        digest = state_digest(state)
        self._manager.save(epoch, args=ocp.args.StandardSave(state))
        self._record_digest(epoch, digest)
        return True

    def _digests(self) -> dict:
        path = os.path.join(self.directory, DIGESTS_FILE)
        try:
            return writers.read_json(path) if os.path.exists(path) else {}
        except ValueError:  # a torn or damaged digest file verifies nothing
            logging.warning("%s is not valid JSON; checkpoints are restored unverified", path)
            return {}

    def _record_digest(self, epoch: int, digest: str) -> None:
        """Adds `epoch`'s digest, dropping those of steps Orbax no longer keeps."""
        if not sharding.is_primary():
            return
        kept = {str(s) for s in self._manager.all_steps()} | {str(epoch)}
        digests = {k: v for k, v in self._digests().items() if k in kept}
        digests[str(epoch)] = digest
        writers.write_json(os.path.join(self.directory, DIGESTS_FILE), digests)

    def _verify(self, step: int, state) -> None:
        """Raises DamagedCheckpoint if `state` does not match the digest saved with `step`."""
        expected = self._digests().get(str(step))
        if expected is not None and state_digest(state) != expected:
            raise DamagedCheckpoint("its arrays do not match the digest recorded at save time")

    def restore_latest(self, abstract_state):
        """Restores the newest readable checkpoint into the structure of `abstract_state`.

        Args:
          abstract_state: pytree of jax.ShapeDtypeStruct (with shardings) of the state.

        Returns:
          (state, epoch), or None if there is no checkpoint. A checkpoint that cannot
          be read, or whose arrays fail their digest, is reported with a warning naming its folder, deleted (so training
          can save that epoch again) and the previous one is tried.
        """
        for step in sorted(self._manager.all_steps(), reverse=True):
            try:
                state = self._manager.restore(step, args=ocp.args.StandardRestore(abstract_state))
                self._verify(step, state)
                return state, step
            except Exception as e:  # noqa: BLE001 (Orbax/TensorStore raise many kinds)
                path = os.path.join(self.directory, str(step))
                logging.warning(
                    "checkpoint of epoch %d (%s) is unreadable (%s); deleting it and "
                    "falling back to the previous one",
                    step,
                    path,
                    _reason(e),
                )
                logging.debug("checkpoint %s: %s", path, e)
                self._delete(step, path)
        return None

    def _delete(self, step: int, path: str) -> None:
        try:
            self._manager.delete(step)
        except Exception:  # noqa: BLE001 (a corrupt step may not even delete cleanly)
            shutil.rmtree(path, ignore_errors=True)
        self._manager.reload()

    def close(self) -> None:
        """Waits for a pending save to finish and releases the manager."""
        self._manager.wait_until_finished()
        self._manager.close()


def _reason(error: BaseException) -> str:
    """`error`'s root cause as one line "Type: first line of its text".

    Orbax wraps TensorStore's read errors in a bare Exception whose text is the array
    index and a method's repr ("<bound method pybind11...spec>"); the real reason (e.g.
    "DATA_LOSS: ... Error reading ...") is its __cause__. TensorStore's own messages
    run to dozens of lines, so only the first line is kept.
    """
    while error.__cause__ is not None:
        error = error.__cause__
    first = (str(error).strip().splitlines() or [""])[0][:300]
    return f"{type(error).__name__}: {first}"


def _process_local_checkpointer() -> ocp.StandardCheckpointer:
    """A checkpointer for host arrays that this process alone reads or writes.

    Orbax's default waits at barriers for every process of a multi-host run; a series
    model is saved by process 0 alone, which would then wait forever.
    """
    me = jax.process_index()
    options = ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me})
    return ocp.StandardCheckpointer(multiprocessing_options=options)


def save_series_model(path: str, params, meta: dict) -> None:
    """Writes one series' params (Orbax) and meta.json into folder `path`, replacing it.

    Args:
      path: e.g. <workdir>/models/BTCUSDT-1h.
      params: the Flax params pytree of ONE coin (host or device arrays).
      meta: JSON-able facts needed to use the params alone (model and data config,
        normalisation, num_params, ...).
    """
    path = os.path.abspath(path)
    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    with _process_local_checkpointer() as checkpointer:
        checkpointer.save(os.path.join(tmp, PARAMS_DIR), params)
    writers.write_json(os.path.join(tmp, META_FILE), meta)
    # Replace the whole folder so params and meta always come from the same save.
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)


def load_series_model(path: str):
    """Loads a folder written by `save_series_model`.

    Returns:
      (params, meta): the params pytree (arrays) and the meta dict.

    Raises:
      FileNotFoundError: if `path` has no saved model, naming the path.
    """
    path = os.path.abspath(path)
    meta_path = os.path.join(path, META_FILE)
    if not os.path.exists(meta_path):
        raise FileNotFoundError(f"no saved model in {path} (missing {META_FILE})")
    meta = writers.read_json(meta_path)
    with _process_local_checkpointer() as checkpointer:
        params = checkpointer.restore(os.path.join(path, PARAMS_DIR))
    return params, meta
