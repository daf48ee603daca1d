"""Tests for cpbjax.report.tensorboard: framing, wire format, and TensorBoard's own reader."""

import glob
import os
import re
import socket
import struct
import time

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.compat.tensorflow_stub import pywrap_tensorflow

from cpbjax.config import schema as config
from cpbjax.config_rules import ConfigError
from cpbjax.report import tensorboard

SERIES = ["BTCUSDT-1h", "ETHUSDT-15m"]


def _record(epoch, train, val, best, **extra):
    return {
        "group": "group-000",
        "epoch": epoch,
        "series": SERIES,
        "train_loss": train,
        "val_loss": val,
        "best_val_loss": best,
        "lr": 0.001,
        "active": [True, False],
        "seconds": 1.5,
        **extra,
    }


# Epoch 1: ETH's val loss is None (non-finite in metrics.jsonl), val_gain_se present.
RECORD_1 = _record(
    1,
    [0.5, 0.25],
    [0.1, None],
    [0.1, None],
    val_gain_se=[0.002, None],
    pooled_val_loss=0.125,
)
# Every scalar TensorBoard must hold for RECORD_1 (float32, as simple_value stores it).
EXPECTED_1 = {
    "train_loss/BTCUSDT-1h": 0.5,
    "train_loss/ETHUSDT-15m": 0.25,
    "val_loss/BTCUSDT-1h": 0.1,
    "best_val_loss/BTCUSDT-1h": 0.1,
    "val_gain_se/BTCUSDT-1h": 0.002,
    "lr": 0.001,
    "active_series": 1.0,
    "epoch_seconds": 1.5,
    "pooled_val_loss": 0.125,
}


# ---- an independent reader: TFRecord framing and protobuf wire format, written plainly ----


def _crc32c_bitwise(data: bytes) -> int:
    """CRC-32C one bit at a time (no table), to check the framing independently."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = ((crc >> 1) ^ 0x82F63B78) if crc & 1 else (crc >> 1)
    return crc ^ 0xFFFFFFFF


def _masked(data: bytes) -> int:
    crc = _crc32c_bitwise(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) % 2**32


def _read_records(path: str) -> list[bytes]:
    with open(path, "rb") as f:
        buf = f.read()
    records, i = [], 0
    while i < len(buf):
        header = buf[i : i + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", buf[i + 8 : i + 12])
        assert header_crc == _masked(header), f"bad length CRC at byte {i}"
        data = buf[i + 12 : i + 12 + length]
        (data_crc,) = struct.unpack("<I", buf[i + 12 + length : i + 16 + length])
        assert data_crc == _masked(data), f"bad data CRC at byte {i}"
        records.append(data)
        i += 16 + length
    return records


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _fields(buf: bytes) -> list[tuple[int, int, object]]:
    """(field number, wire type, raw value) of every field of one message."""
    out, i = [], 0
    while i < len(buf):
        key, i = _read_varint(buf, i)
        field, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, i = _read_varint(buf, i)
        elif wire_type == 2:
            n, i = _read_varint(buf, i)
            value, i = buf[i : i + n], i + n
        else:
            size = {1: 8, 5: 4}[wire_type]
            value, i = buf[i : i + size], i + size
        out.append((field, wire_type, value))
    return out


def _decode_event(buf: bytes) -> dict:
    """Event{1 wall_time double, 2 step int64, 3 file_version, 5 summary, 7 session_log}."""
    event = {"step": 0, "values": {}}
    for field, wire_type, value in _fields(buf):
        if (field, wire_type) == (1, 1):
            event["wall_time"] = struct.unpack("<d", value)[0]
        elif (field, wire_type) == (2, 0):
            event["step"] = value
        elif (field, wire_type) == (3, 2):
            event["file_version"] = value.decode()
        elif (field, wire_type) == (5, 2):
            for value_field, _, summary_value in _fields(value):
                assert value_field == 1
                parts = {f: (w, v) for f, w, v in _fields(summary_value)}
                assert parts[1][0] == 2 and parts[2][0] == 5, parts
                tag = parts[1][1].decode()
                assert tag not in event["values"], f"tag {tag} twice in one event"
                event["values"][tag] = struct.unpack("<f", parts[2][1])[0]
        elif (field, wire_type) == (7, 2):
            event["session_status"] = dict((f, v) for f, _, v in _fields(value))[1]
        else:
            raise AssertionError(f"unexpected Event field {field} (wire type {wire_type})")
    return event


def _event_files(workdir: str, group: str = "group-000") -> list[str]:
    return sorted(glob.glob(os.path.join(workdir, "tb", group, "events.out.tfevents.*")))


def _float32(values: dict) -> dict:
    return {tag: float(np.float32(v)) for tag, v in values.items()}


# ---- tests ----


def test_crc32c_published_vectors():
    assert tensorboard.crc32c(b"123456789") == 0xE3069283
    assert tensorboard.crc32c(bytes(32)) == 0x8A9136AA
    assert tensorboard.crc32c(b"\xff" * 32) == 0x62A8AB43  # RFC 3720 B.4
    assert tensorboard.crc32c(b"") == 0
    for data in (b"123456789", bytes(range(256)), b"brain.Event:2"):
        assert tensorboard.masked_crc32c(data) == pywrap_tensorflow.masked_crc32c(data)


def test_events_decode_to_the_record(tmp_path):
    log = tensorboard.TensorBoardLog(str(tmp_path))
    before = time.time()
    log.start_group("group-000", 0)
    log.append(RECORD_1)
    # Raw NaN / inf / beyond-float32 values (not just None) are skipped too.
    log.append(_record(2, [float("nan"), 0.2], [float("inf"), 1e40], [0.1, 0.3]))
    after = time.time()
    log.close()
    log.close()  # idempotent

    (path,) = _event_files(str(tmp_path))
    host = re.escape(socket.gethostname())
    assert re.fullmatch(rf"events\.out\.tfevents\.\d{{10}}\.{host}", os.path.basename(path))
    events = [_decode_event(r) for r in _read_records(path)]
    assert len(events) == 4
    assert events[0]["file_version"] == "brain.Event:2" and events[0]["step"] == 0
    assert events[1]["session_status"] == 1 and events[1]["step"] == 1  # START
    assert [e["step"] for e in events[2:]] == [1, 2]
    assert events[2]["values"] == _float32(EXPECTED_1)
    assert events[3]["values"] == _float32(
        {
            "train_loss/ETHUSDT-15m": 0.2,
            "best_val_loss/BTCUSDT-1h": 0.1,
            "best_val_loss/ETHUSDT-15m": 0.3,
            "lr": 0.001,
            "active_series": 1,
            "epoch_seconds": 1.5,
        }
    )
    for event in events:
        assert before <= event["wall_time"] <= after


def test_tensorboard_reader_reads_the_same_scalars(tmp_path):
    log = tensorboard.TensorBoardLog(str(tmp_path))
    log.start_group("group-000", 0)
    log.append(RECORD_1)
    log.append(_record(2, [0.4, 0.2], [0.09, 0.3], [0.09, 0.3]))
    log.close()

    acc = event_accumulator.EventAccumulator(os.path.join(tmp_path, "tb", "group-000"))
    acc.Reload()
    eth_later = {"val_loss/ETHUSDT-15m", "best_val_loss/ETHUSDT-15m"}  # None in epoch 1
    assert set(acc.Tags()["scalars"]) == set(EXPECTED_1) | eth_later
    for tag, value in _float32(EXPECTED_1).items():
        assert acc.Scalars(tag)[0].step == 1 and acc.Scalars(tag)[0].value == value, tag
    eth_val = acc.Scalars("val_loss/ETHUSDT-15m")
    assert [(e.step, e.value) for e in eth_val] == [(2, float(np.float32(0.3)))]
    assert [e.step for e in acc.Scalars("lr")] == [1, 2]


@pytest.mark.parametrize("checkpoint", [0, 2])
def test_resume_purges_the_killed_runs_later_epochs(tmp_path, checkpoint):
    killed = tensorboard.TensorBoardLog(str(tmp_path))
    killed.start_group("group-000", 0)
    for epoch in (1, 2, 3, 4):  # killed after epoch 4; its last checkpoint is `checkpoint`
        killed.append(_record(epoch, [1.0, 0.5], [10.0 * epoch, 0.5], [1.0, 0.5]))
    killed.close()

    resumed = tensorboard.TensorBoardLog(str(tmp_path))
    resumed.start_group("group-000", checkpoint)
    for epoch in range(checkpoint + 1, 6):
        resumed.append(_record(epoch, [1.0, 0.5], [20.0 * epoch, 0.5], [1.0, 0.5]))
    resumed.close()

    _, second = _event_files(str(tmp_path))  # the resumed run's file sorts last
    start = _decode_event(_read_records(second)[1])
    assert start["session_status"] == 1 and start["step"] == checkpoint + 1
    acc = event_accumulator.EventAccumulator(os.path.join(tmp_path, "tb", "group-000"))
    acc.Reload()
    points = [(e.step, e.value) for e in acc.Scalars("val_loss/BTCUSDT-1h")]
    expected = [(e, (10.0 if e <= checkpoint else 20.0) * e) for e in range(1, 6)]
    assert points == expected


def test_torn_final_record_is_tolerated(tmp_path):
    log = tensorboard.TensorBoardLog(str(tmp_path))
    log.start_group("group-000", 0)
    for epoch in (1, 2, 3):
        log.append(_record(epoch, [0.1 * epoch, 0.5], [0.5, 0.5], [0.5, 0.5]))
    log.close()
    (path,) = _event_files(str(tmp_path))
    os.truncate(path, os.path.getsize(path) - 7)  # SIGKILL in the middle of epoch 3's write

    acc = event_accumulator.EventAccumulator(path)
    acc.Reload()
    assert [e.step for e in acc.Scalars("train_loss/BTCUSDT-1h")] == [1, 2]


def test_new_file_sorts_after_a_newer_named_one(tmp_path):
    directory = tmp_path / "tb" / "group-001"
    directory.mkdir(parents=True)
    future = int(time.time()) + 1000  # e.g. a file from before the clock was set back
    (directory / f"events.out.tfevents.{future:010d}.otherhost").write_bytes(b"")
    log = tensorboard.TensorBoardLog(str(tmp_path))
    log.start_group("group-001", 0)
    log.close()
    names = sorted(os.listdir(directory))
    assert len(names) == 2 and names[1].startswith(f"events.out.tfevents.{future + 1:010d}.")


def test_bad_input_raises_naming_the_fault(tmp_path):
    log = tensorboard.TensorBoardLog(str(tmp_path))
    with pytest.raises(ValueError, match="group-000.*start_group"):
        log.append(RECORD_1)
    with pytest.raises(ValueError, match=r"'\.\./x'"):
        log.start_group("../x", 0)
    with pytest.raises(ValueError, match="start_epoch=-1"):
        log.start_group("group-000", -1)
    log.start_group("group-000", 0)
    with pytest.raises(ValueError, match="group-000 epoch 1: val_loss"):
        log.append({**RECORD_1, "val_loss": [0.1]})
    with pytest.raises(ValueError, match="'group-001'"):
        log.append({**RECORD_1, "group": "group-001"})
    log.close()


def test_config_flag_defaults_off_and_is_validated():
    c = config.load(os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs/gru.py"))
    assert c.logging.tensorboard is False
    with c.ignore_type():
        c.logging.tensorboard = "yes"
    with pytest.raises(ConfigError, match="logging.tensorboard='yes'"):
        config.validate(c)
