"""An on-disk cache of built data (parsed, encoded splits and their vocabularies).

A new process (each job of a sweep, each resumed run) then loads in a fraction of a second what took it
seconds to parse and encode. An entry is named by a fingerprint of everything that determines it (the
source data's bytes, the settings, the library versions, the source text of the modules that build it),
so an edit to any of them makes a new entry instead of reusing a stale one.

An entry is ``HEADER``, the SHA-256 (hex) of the pickled payload, a newline, then the payload: a byte changed
on disk (a bad disk or copy, an edit) fails the digest check and the entry is rebuilt, rather than the run
training on altered data that still unpickles.
"""

import hashlib
import inspect
import pickle
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import TypeVar

from runlog.atomic import atomic_write

T = TypeVar("T")
HEADER = b"normlab-cache-v1\n"  # then 64 hex digits of the payload's SHA-256, a newline, the payload


def fingerprint(parts: Iterable[bytes | str]) -> str:
    """SHA-256 (hex, 16 chars) of ``parts``, each length-prefixed so that no two part lists collide."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8") if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()[:16]


def source_text(*defined: Callable | type | ModuleType) -> list[str]:
    """The text of the source files that define ``defined`` (functions, classes, modules), as fingerprint parts.
    Raises TypeError for one defined in no Python file (a built-in)."""
    return [Path(_source_file(obj)).read_text(encoding="utf-8") for obj in defined]


def _source_file(obj: Callable | type | ModuleType) -> str:
    if (path := inspect.getsourcefile(obj)) is None:
        raise TypeError(f"{obj!r} is defined in no Python source file")
    return path


def cached(path: Path | None, build: Callable[[], T]) -> T:
    """``build()``, pickled at ``path``, or loaded from it when a previous process stored it there.

    ``path`` None: no cache. An entry whose payload differs from its SHA-256 (altered, cut short, or written
    before entries held one) or that cannot be unpickled (written by another Python) is built again and
    replaced, with one warning on stderr; a cache that cannot be written (a read-only home) only costs the
    speed-up, with one warning. The write is atomic, so the jobs of a parallel sweep may race to store one entry.
    """
    if path is None:
        return build()
    if path.is_file():
        try:
            if (payload := _verified(path.read_bytes())) is not None:
                return pickle.loads(payload)
            _warn(f"data cache entry {path} fails its SHA-256 check (altered or cut short); rebuilding it")
        except Exception as e:  # any read or unpickling failure means: rebuild
            _warn(f"data cache entry {path} is unreadable ({type(e).__name__}); rebuilding it")
    value = build()
    payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    entry = HEADER + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda f: f.write(entry))
    except OSError as e:
        _warn(f"cannot write the data cache {path} ({e}); the data will be built again next run")
    return value


def _verified(data: bytes) -> bytes | None:
    """The payload of the entry ``data``, or None when its header or SHA-256 does not match."""
    digest, payload = data[len(HEADER) : len(HEADER) + 64], data[len(HEADER) + 65 :]
    if not data.startswith(HEADER) or hashlib.sha256(payload).hexdigest().encode() != digest:
        return None
    return payload


def _warn(message: str) -> None:
    print(f"normlab: warning: {message}", file=sys.stderr)
