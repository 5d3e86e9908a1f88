"""wandb's local transaction log of a run (``wandb/*run-*/run-*.wandb``), read back as its protobuf records: what wandb
sent (online) or will sync (offline)."""

from pathlib import Path


def wandb_records(path: Path) -> list:
    """The protobuf records (``wandb_internal_pb2.Record``) of a run's ``.wandb`` file (online or offline).

    The file is wandb's transaction log: a 7-byte header (``:W&B``, magic, version), then LevelDB
    log-format blocks of 32 KiB, each record a 7-byte header (crc32, length, type: 1 full, 2 first,
    3 middle, 4 last) and its bytes (format as written by wandb-core ``internal/leveldb``)."""
    from wandb.proto import wandb_internal_pb2

    data, records, pending, pos = path.read_bytes(), [], b"", 7
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if (left := 32768 - pos % 32768) < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if pos + 7 + length > len(data):  # still being written
            break
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            records.append(wandb_internal_pb2.Record.FromString(pending))
            pending = b""
    return records
