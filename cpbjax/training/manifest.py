"""manifest.json: the sha256 of every file of a saved folder, and the fields that shape it.

Two kinds of folder carry one, written last so that a folder without it is old or
unfinished: a workdir's saved series model (models/<SERIES>/, checkpoint.py) and an export
(export/<SERIES>/, modes/export.py). Each is verified against it before use, so a flipped
bit, an edited field or a folder copied under another series' name is one ValueError
naming the file, never a model that silently forecasts other numbers.

  {"format": 1, "series": "BTCUSDT-1h", "files": {relative path: sha256},
   "fields": {"data.lookback": 64, "model.hidden": 32, ...}}
"""

from __future__ import annotations

import hashlib
import json
import os

from cpbjax import writers
from cpbjax.data.series import INTERVAL_MS

MANIFEST_FILE = "manifest.json"
FORMAT = 1
# data fields that shape the params or what they mean; with them, every model.* field.
SHAPING_DATA_FIELDS = ("features", "lookback", "horizon", "normalization")
# What first_mismatch finds wrong with a file.
MISSING, ADDED, CHANGED = "missing", "added", "changed"


def sha256_file(path: str) -> str:
    """sha256 hex of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_json(obj) -> str:
    """sha256 hex of `obj` as canonical JSON (sorted keys): equal exactly when obj is."""
    text = json.dumps(writers.to_jsonable(obj), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def shaping_fields(config: dict) -> dict:
    """{"data.lookback": 64, "model.hidden": 32, ...}: the fields that shape the params."""
    data, model = config.get("data") or {}, config.get("model") or {}
    fields = {f"data.{k}": data[k] for k in SHAPING_DATA_FIELDS if k in data}
    fields.update({f"model.{k}": v for k, v in model.items()})
    return writers.to_jsonable(fields)


def folder_files(folder: str) -> list[str]:
    """Relative paths ("params/d/1f2e...") of every file under `folder` but its manifest."""
    out = []
    for root, _, names in os.walk(folder):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/")
            if rel != MANIFEST_FILE:
                out.append(rel)
    return sorted(out)


def write(folder: str, series: str, files: list[str], fields: dict, **more) -> None:
    """Writes `folder`'s manifest (atomically): the sha256 of `files`, `fields`, and any
    `more` entries (an export's covariates)."""
    manifest = {
        "format": FORMAT,
        "series": series,
        "files": {name: sha256_file(os.path.join(folder, name)) for name in files},
        "fields": fields,
        **more,
    }
    writers.write_json(os.path.join(folder, MANIFEST_FILE), manifest)


def read(folder: str, kind: str) -> dict | None:
    """`folder`'s manifest, or None without one; checked against the folder's name.

    Raises:
      ValueError: not a manifest of this format, or a folder named after another series
        than its manifest's (a model copied under another series' name).
    """
    path = os.path.join(folder, MANIFEST_FILE)
    if not os.path.exists(path):
        return None
    manifest = writers.read_json(path)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{path} is not a format-{FORMAT} {kind} manifest")
    name = os.path.basename(os.path.normpath(folder))
    _, _, interval = name.rpartition("-")
    if interval in INTERVAL_MS and name != manifest.get("series"):
        raise ValueError(
            f"{path}: the model is of {manifest.get('series')}, but its folder is named "
            f"{name}; name the folder back (or anything that is not a series name)"
        )
    return manifest


def first_mismatch(folder: str, manifest: dict, names) -> tuple[str, str] | None:
    """(name, MISSING | ADDED | CHANGED) of the first of `names` (relative paths) that is
    listed but absent, present but not listed, or whose sha256 differs; None if all match."""
    listed = manifest["files"]
    for name in names:
        exists = os.path.isfile(os.path.join(folder, name))
        if name not in listed:
            if exists:
                return name, ADDED
            continue
        if not exists:
            return name, MISSING
        if sha256_file(os.path.join(folder, name)) != listed[name]:
            return name, CHANGED
    return None


def edited_field(manifest: dict, fields: dict) -> tuple[str, object, object] | None:
    """(field, its value now, its value in the manifest) of the first field that differs
    from the manifest's `fields` (one added or removed counts); None if none does."""
    was = manifest.get("fields") or {}
    for field in [*was, *(f for f in fields if f not in was)]:
        if fields.get(field) != was.get(field):
            return field, fields.get(field), was.get(field)
    return None
