"""TensorBoard event files of the per-epoch scalars, written without TensorFlow.

An event file is a TFRecord stream of `Event` protobufs. We only ever write three small
messages (a file version, a SessionLog START and a Summary of scalars), so both the
framing and the protobuf wire format are written by hand here: that keeps TensorFlow,
and TensorBoard's own writer with its protobuf and grpcio (about 54 MB), out of cpbjax's
dependencies. The format is TensorFlow's
(tensorflow/core/lib/io/record_writer.cc, tensorflow/core/util/event.proto);
tests/tensorboard_test.py reads the files back with TensorBoard's own reader.

Layout: one TensorBoard run per group, `<workdir>/tb/<group>/events.out.tfevents.*`.
"""

from __future__ import annotations

import math
import numbers
import os
import re
import socket
import struct
import time

from cpbjax import writers

TB_DIR = "tb"
FILE_VERSION = b"brain.Event:2"
# Field numbers of Event's oneof `what` that we write (6 is the deprecated log_message).
_FILE_VERSION_FIELD, _SUMMARY_FIELD, _SESSION_LOG_FIELD = 3, 5, 7
_SESSION_START = 1  # SessionLog{SessionStatus status = 1}: START
_FLOAT32_MAX = 3.4028234663852886e38
_EVENTS_RE = re.compile(r"^events\.out\.tfevents\.(\d+)\.")


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)  # reflected Castagnoli poly
        table.append(crc)
    return tuple(table)


_CRC32C_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of `data`, as TFRecord framing uses it."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC: rotated and offset so CRCs of CRCs do not collide."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(data: bytes) -> bytes:
    """One TFRecord: length, CRC of the length, data, CRC of the data (little endian)."""
    length = struct.pack("<Q", len(data))
    return (
        length
        + struct.pack("<I", masked_crc32c(length))
        + data
        + struct.pack("<I", masked_crc32c(data))
    )


def _varint(n: int) -> bytes:
    n &= 0xFFFFFFFFFFFFFFFF  # int64 fields: negatives are their 10-byte two's complement
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


def _bytes_field(field: int, payload: bytes) -> bytes:
    return _key(field, 2) + _varint(len(payload)) + payload


def _event(wall_time: float, step: int, body: bytes) -> bytes:
    """Event{double wall_time = 1; int64 step = 2; ...body (the oneof `what`)}."""
    return _key(1, 1) + struct.pack("<d", wall_time) + _key(2, 0) + _varint(step) + body


def _summary(scalars: list[tuple[str, float]]) -> bytes:
    """Event.summary: Summary{repeated Value value = 1}, Value{tag = 1; simple_value = 2}."""
    values = b"".join(
        _bytes_field(1, _bytes_field(1, tag.encode()) + _key(2, 5) + struct.pack("<f", value))
        for tag, value in scalars
    )
    return _bytes_field(_SUMMARY_FIELD, values)


def _writable(value) -> bool:
    """None, NaN, inf and values beyond float32 are skipped, never written."""
    return value is not None and math.isfinite(value) and abs(value) <= _FLOAT32_MAX


def _scalars(record: dict) -> list[tuple[str, float]]:
    """(tag, value) pairs of one metrics.jsonl record, per series and per group."""
    series = record["series"]
    pairs = [
        ("lr", record["lr"]),
        ("active_series", sum(record["active"])),
        ("epoch_seconds", record["seconds"]),
    ]
    if record.get("pooled_val_loss") is not None:  # train.share=pooled
        pairs.append(("pooled_val_loss", record["pooled_val_loss"]))
    optional = ("val_gain_se",) if "val_gain_se" in record else ()
    for field in ("train_loss", "val_loss", "best_val_loss", *optional):
        values = record.get(field)
        if values is None or len(values) != len(series):
            raise ValueError(
                f"metrics record of {record['group']} epoch {record['epoch']}: {field}={values!r}"
                f" is not one value per series ({len(series)})"
            )
        pairs += [(f"{field}/{name}", value) for name, value in zip(series, values, strict=True)]
    return [(tag, float(value)) for tag, value in pairs if _writable(value)]


def _new_file_name(directory: str) -> str:
    """`events.out.tfevents.<seconds>.<host>`, named to sort after every earlier file.

    TensorBoard reads a run's files in name order and the resume purge depends on that
    order, so the seconds are bumped past the newest existing file's (two starts within
    one second, or a clock set back); this also means no earlier file is ever reopened.
    """
    taken = [int(m.group(1)) for m in map(_EVENTS_RE.match, os.listdir(directory)) if m]
    seconds = max([int(time.time())] + [t + 1 for t in taken])
    return f"events.out.tfevents.{seconds:010d}.{socket.gethostname()}"


class TensorBoardLog:
    """Writes each group's epoch scalars as one TensorBoard run under `<workdir>/tb/<group>/`.

    Tags: `train_loss/<series>`, `val_loss/<series>`, `best_val_loss/<series>`,
    `val_gain_se/<series>` (when present), `lr`, `active_series`,
    `epoch_seconds`, `pooled_val_loss` (train.share=pooled); the step is the epoch. Every
    `append` is flushed and fsynced, so a SIGKILL loses nothing appended.
    Call `close()` in a `finally`.
    """

    def __init__(self, workdir: str):
        self._root = os.path.join(workdir, TB_DIR)
        self._group: str | None = None
        self._file = None

    def start_group(self, group: str, start_epoch: int) -> None:
        """Opens a new event file for `group`, whose epochs after `start_epoch` follow.

        The file starts with a SessionLog START at step start_epoch + 1: TensorBoard then
        drops the points at that step and later from earlier files (a killed run's epochs
        that are re-run after resuming from its checkpoint, or after a restart from zero).

        Args:
          group: the group name, e.g. "group-000" (one path component).
          start_epoch: the last epoch already done (0 for a fresh start).

        Raises:
          ValueError: a group name that is not one plain path component, or a negative
            or non-integer start_epoch.
        """
        if not re.fullmatch(r"[\w.-]+", group) or group in (".", ".."):
            raise ValueError(f"TensorBoard group {group!r} is not a plain directory name")
        if not isinstance(start_epoch, numbers.Integral) or start_epoch < 0:
            raise ValueError(f"start_epoch={start_epoch!r} of {group} is not an integer >= 0")
        self.close()
        directory = os.path.join(self._root, group)
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, _new_file_name(directory))
        self._file = open(path, "xb")  # noqa: SIM115 (held open across epochs until close)
        self._group = group
        writers.fsync_dir(directory)
        now = time.time()
        session_start = _bytes_field(_SESSION_LOG_FIELD, _key(1, 0) + _varint(_SESSION_START))
        self._write(
            _event(now, 0, _bytes_field(_FILE_VERSION_FIELD, FILE_VERSION)),
            _event(now, int(start_epoch) + 1, session_start),
        )

    def append(self, record: dict) -> None:
        """Writes one metrics.jsonl record as one event at step = its epoch.

        None (non-finite) values are skipped, so a diverged coin's curve just ends.

        Args:
          record: {"group", "epoch", "series", "train_loss", "val_loss", "best_val_loss",
            "lr", "active", "seconds"} and optionally "val_gain_se" and
            "pooled_val_loss", as the driver writes it.

        Raises:
          ValueError: the record's group is not the one opened by `start_group`, or a
            per-series field does not have one value per series.
        """
        if self._file is None or record.get("group") != self._group:
            raise ValueError(
                f"TensorBoard record of group {record.get('group')!r} but the open group is"
                f" {self._group!r}: call start_group first"
            )
        self._write(_event(time.time(), int(record["epoch"]), _summary(_scalars(record))))

    def close(self) -> None:
        """Closes the open event file, if any; safe to call twice."""
        if self._file is not None:
            self._file.close()
        self._file, self._group = None, None

    def _write(self, *events: bytes) -> None:
        self._file.write(b"".join(tfrecord(event) for event in events))
        self._file.flush()
        os.fsync(self._file.fileno())
