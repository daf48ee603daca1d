"""How run outputs are written: one atomic_write for whole files, JSON, and metrics.jsonl.

Every file is written so that a crash never leaves a torn one: JSON files go to a
temporary sibling, are fsynced and then `os.replace`d; metrics.jsonl is appended
line by line with an fsync, and a reader ignores a final line without its newline
(the only thing a crash mid-append can leave).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterable

import numpy as np
from absl import logging

from cpbjax import workdir as workdir_lib


def to_jsonable(obj):
    """Converts numpy values, tuples, dataclasses and ConfigDicts to plain JSON types.

    Non-finite floats become None (JSON has no NaN), so `json.dumps(..., allow_nan=False)`
    always succeeds on the result.
    """
    if hasattr(obj, "to_dict"):  # ml_collections.ConfigDict
        obj = obj.to_dict()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = dataclasses.asdict(obj)
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray) or (hasattr(obj, "shape") and hasattr(obj, "dtype")):
        return to_jsonable(np.asarray(obj).tolist())
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if obj is None or isinstance(obj, str):
        return obj
    raise TypeError(f"cannot write {type(obj).__name__} value {obj!r} as JSON")


def fsync_dir(path: str) -> None:
    """Makes a new file's directory entry durable, not just its contents."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# What open() gives a new file (mkstemp's own 0o600 would hide outputs from other users);
# read once at import, as os.umask cannot be read without setting it.
_FILE_MODE = 0o666 & ~_umask()


@contextlib.contextmanager
def naming(path: str):
    """Re-raises an OSError that names no file as the same error naming `path`: a failed
    write, flush or fsync carries no file name, and "no space left on device" should say
    which file it hit."""
    try:
        yield
    except OSError as e:
        if e.filename is not None or e.errno is None:  # named already, or not from the OS
            raise
        raise OSError(e.errno, e.strerror, path) from e


def atomic_write(path: str, data: bytes | str, durable: bool = True) -> None:
    """Writes `data` to `path` so that no reader or crash ever sees a torn file.

    The bytes go to a temporary sibling, are fsynced, get the mode a plain open() would
    give, and replace `path` with os.replace; the directory entry is then fsynced. If
    anything fails before the replace, the previous file at `path` is untouched and the
    temporary file is removed; an OSError naming no file is made to name `path`
    (`naming`). Every file cpbjax writes whole goes through here.

    durable=False skips both fsyncs (about 4 ms each on a plain disk): for a cache whose
    entries carry their own checksum, which the reader checks. A killed run still leaves
    no torn file (the rename is atomic); a power cut may leave a missing or damaged entry,
    which the checksum turns into a miss.
    """
    with naming(path):
        _replace_atomically(path, data, durable)


def _replace_atomically(path: str, data: bytes | str, durable: bool) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    payload = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(directory)


def write_json(path: str, obj) -> None:
    """Writes `obj` as indented JSON to `path` with `atomic_write`."""
    atomic_write(path, json.dumps(to_jsonable(obj), indent=2, allow_nan=False) + "\n")


def read_json(path: str):
    """Reads a JSON file; raises ValueError naming the file if it does not parse."""
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from None


def write_config(workdir: str, config) -> None:
    """Writes the resolved config to <workdir>/config.json."""
    write_json(workdir_lib.config_json(workdir), config)


def write_results(workdir: str, results: dict) -> None:
    """Writes <workdir>/results.json."""
    write_json(workdir_lib.results_json(workdir), results)


class MetricsLog:
    """<workdir>/metrics.jsonl: one JSON object per line, appended with an fsync."""

    def __init__(self, workdir: str):
        self.path = workdir_lib.metrics_jsonl(workdir)

    def records(self) -> list[dict]:
        """All complete lines; a torn final line (no newline) is ignored, and a damaged line
        elsewhere is skipped with a warning naming it (the others are still read)."""
        if not os.path.exists(self.path):
            return []
        with open(self.path) as f:
            lines = f.read().split("\n")
        # The element after the last "\n" is "" for a clean file, a fragment if torn.
        records = []
        for number, line in enumerate(lines[:-1], 1):
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                logging.warning("%s line %d is not valid JSON; skipped", self.path, number)
        return records

    def keep(self, predicate: Callable[[dict], bool]) -> None:
        """Atomically rewrites the file with only the records `predicate` accepts.

        A resumed group calls this to drop the epochs after its checkpoint (they are
        re-run) and any torn line, before appending again.
        """
        kept = [r for r in self.records() if predicate(r)]
        self._write_all(kept)

    def append(self, record: dict) -> None:
        """Appends one record as a line and fsyncs it."""
        line = json.dumps(to_jsonable(record), allow_nan=False) + "\n"
        with naming(self.path), open(self.path, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def _write_all(self, records: Iterable[dict]) -> None:
        lines = [json.dumps(to_jsonable(r), allow_nan=False) + "\n" for r in records]
        atomic_write(self.path, "".join(lines))
