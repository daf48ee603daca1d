"""Every Orbax call of cpbjax: group train-state checkpoints and per-series best models.

Layout under a workdir:
  checkpoints/group-000/<epoch>/     the full train state of one group (Orbax CheckpointManager)
  checkpoints/group-000/digests.json epoch -> digest of every array of that checkpoint
  models/<SYMBOL>-<INTERVAL>/        params/ (Orbax) + meta.json + manifest.json: one
                                     series' best model, loadable alone with `load_series_model`.

Orbax verifies structure and metadata, not the bytes of the arrays: a checkpoint whose
array data was damaged in place restores "successfully". So each save records a digest
of every array (computed on the devices, per coin row, so it does not depend on how the
coins are spread over devices), and a restore that does not reproduce it is treated as
unreadable: the step is deleted and the previous one is tried.

A series model is verified the same way, by its files: its manifest.json (manifest.py,
written last) holds the sha256 of every file and the fields that shape the params, and
`load_series_model` refuses a folder that does not match it (`DamagedModel`, naming the
file, or the meta.json field). A folder without one was saved before manifests: it is
loaded unverified, with one warning per folder.
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
from cpbjax.training import manifest

DIGESTS_FILE = "digests.json"


class DamagedCheckpoint(ValueError):
    """A restored checkpoint whose arrays do not match the digest recorded when it was saved."""


class DamagedModel(ValueError):
    """A saved series model whose folder does not match its manifest; the message names
    the file (and the meta.json field), whose path names the series."""


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
        # Orbax's metadata writes fail naming no file (and an async save's failure may
        # surface at the next save): the error names the checkpoint folder instead.
        with writers.naming(self.directory):
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
        with writers.naming(self.directory):
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
    with _process_local_checkpointer() as checkpointer, writers.naming(path):
        checkpointer.save(os.path.join(tmp, PARAMS_DIR), params)
    writers.write_json(os.path.join(tmp, META_FILE), meta)
    # Last: a folder without a manifest was saved before manifests (or never finished).
    files = manifest.folder_files(tmp)
    manifest.write(tmp, os.path.basename(path), files, model_fields(meta))
    # Replace the whole folder so params and meta always come from the same save.
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)


def load_series_model(path: str):
    """Loads a folder written by `save_series_model`.

    Returns:
      (params, meta): the params pytree (arrays) and the meta dict.

    Raises:
      FileNotFoundError: if `path` has no saved model, naming the path.
      DamagedModel: the folder does not match its manifest (`verify_series_model`).
    """
    path = os.path.abspath(path)
    meta_path = os.path.join(path, META_FILE)
    if not os.path.exists(meta_path):
        raise FileNotFoundError(f"no saved model in {path} (missing {META_FILE})")
    verify_series_model(path)
    meta = writers.read_json(meta_path)
    with _process_local_checkpointer() as checkpointer:
        params = checkpointer.restore(os.path.join(path, PARAMS_DIR))
    return params, meta


def model_fields(meta: dict) -> dict:
    """A series model's manifest fields: the config fields that shape its params (with
    model.baseline), and the sha256 of the rest of meta.json that decides its forecasts
    (normalisation, price mask, fallback columns, each interval_calibration entry: k, ...)."""
    config = meta.get("config")
    fields = manifest.shaping_fields(config if isinstance(config, dict) else {})
    for key in ("norm", "price_mask", "baseline_columns"):
        if key in meta:
            fields[key] = manifest.sha256_json(meta[key])
    calibration = meta.get("interval_calibration")
    for key, value in (calibration if isinstance(calibration, dict) else {}).items():
        fields[f"interval_calibration.{key}"] = manifest.sha256_json(value)
    return fields


# What a series model's file is found to be, by manifest.first_mismatch.
_WRONG = {
    manifest.CHANGED: "sha256 does not match its manifest",
    manifest.MISSING: "is missing (listed in its manifest)",
    manifest.ADDED: "is not in its manifest (added after the save)",
}
DAMAGED_HINT = "the saved model is damaged; retrain or restore it"
# Folders warned of as saved before manifests: once per process, as predict, serve and
# init_from load a model more than once.
_UNVERIFIED_WARNED: set[str] = set()


def verify_series_model(path: str) -> None:
    """Raises DamagedModel (one line naming the file) unless every file of model folder
    `path` matches its manifest, none is missing or added, and the folder bears the
    manifest's series name. A folder without a manifest is warned of once."""
    try:
        found = manifest.read(path, "saved model")
    except ValueError as e:  # not a manifest, or a folder named after another series
        raise DamagedModel(str(e)) from None
    if found is None:
        _warn_unverified(path)
        return
    names = sorted(set(found["files"]) | set(manifest.folder_files(path)))
    wrong = manifest.first_mismatch(path, found, names)
    if wrong is None:
        return
    name, why = wrong
    if name == META_FILE and why == manifest.CHANGED:
        _name_edited_field(os.path.join(path, META_FILE), found)
    raise DamagedModel(f"{os.path.join(path, name)}: {_WRONG[why]} ({DAMAGED_HINT})")


def _name_edited_field(meta_path: str, found: dict) -> None:
    """Raises DamagedModel naming the first manifest field that meta.json changed, if any
    (a meta.json that no longer parses names none)."""
    try:
        meta = writers.read_json(meta_path)
    except ValueError:
        return
    edit = manifest.edited_field(found, model_fields(meta)) if isinstance(meta, dict) else None
    if edit is None:
        return
    field, now, was = edit
    if field.startswith(("data.", "model.")):
        raise DamagedModel(
            f"{meta_path}: {field} is {now!r}, but the model was saved with {was!r} (its "
            "manifest); its params fit only that: restore meta.json or retrain"
        )
    raise DamagedModel(
        f"{meta_path}: {field} is not the one the model was saved with (its manifest); "
        "restore meta.json or retrain"
    )


def _warn_unverified(path: str) -> None:
    """One warning per folder that it has no manifest, and how to have one."""
    if path in _UNVERIFIED_WARNED:
        return
    _UNVERIFIED_WARNED.add(path)
    logging.warning(
        "%s has no %s (saved before cpbjax verified saved models), so it is used "
        "unverified; training the run again into a new --workdir saves it with one",
        path,
        manifest.MANIFEST_FILE,
    )
