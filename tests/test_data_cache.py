"""The on-disk data cache (data/cache.py) and CMUdict's use of it (training/tasks/g2p.py): an entry gives back
exactly what building gave, a change to anything that shapes the data names another entry, and a broken or
unwritable cache costs only the speed-up."""

import hashlib
import os
import pickle
import subprocess
import sys

import pytest

from data import cache
from data.cache import cached, fingerprint, source_text
from data.tokenizer import build_vocab
from tests.helpers.config import ROOT
from training.tasks import g2p

# Run as `python -c BUILD_TOGETHER <dir> <name>` by two processes at once, as by two nodes sharing one home: each
# finds <dir>/cache/k.pkl missing, builds once both are building, and stores a few MB, so that the writes overlap.
BUILD_TOGETHER = f"""
import sys, time
from pathlib import Path
sys.path.insert(0, {str(ROOT)!r})
from data.cache import cached
d, me = Path(sys.argv[1]), sys.argv[2]
def build():
    (d / me).touch()
    while not ((d / "a").exists() and (d / "b").exists()):
        time.sleep(0.005)
    return list(range(10**6))
print(len(cached(d / "cache" / "k.pkl", build)))
"""


def test_fingerprint_parts_are_length_prefixed_and_order_matters():
    assert fingerprint(["ab", "c"]) != fingerprint(["a", "bc"]) != fingerprint(["c", "ab"])
    assert fingerprint([b"ab", "c"]) == fingerprint(["ab", b"c"]) and len(fingerprint([])) == 16


def test_source_text_reads_the_file_that_defines_an_object():
    (text,) = source_text(build_vocab)
    assert "def build_vocab(" in text and text.startswith('"""Vocabularies built with Hugging Face')


def test_an_entry_is_built_once_then_loaded(tmp_path):
    builds = []
    build = lambda: builds.append(1) or {"ids": [[1, 2], [3]]}
    path = tmp_path / "sub" / "k.pkl"
    assert cached(path, build) == cached(path, build) == {"ids": [[1, 2], [3]]} and builds == [1]
    assert cached(None, build) == {"ids": [[1, 2], [3]]} and builds == [1, 1]  # no path: no cache
    assert [p.name for p in path.parent.iterdir()] == ["k.pkl"]  # no temp file left behind


def test_two_processes_storing_one_entry_at_once_both_succeed_and_leave_one_whole_entry(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", BUILD_TOGETHER, str(tmp_path), name], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for name in "ab"]  # fmt: skip
    outs = [proc.communicate(timeout=60) for proc in procs]
    assert outs == [("1000000\n", "")] * 2  # no warning: each stored its own copy without trouble
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["k.pkl"]  # and no temp file is left behind
    assert cached(tmp_path / "cache" / "k.pkl", lambda: pytest.fail("rebuilt")) == list(range(10**6))


def test_an_entry_holds_the_sha256_of_its_payload(tmp_path):
    path = tmp_path / "k.pkl"
    cached(path, lambda: {"ids": [1, 2]})
    payload = pickle.dumps({"ids": [1, 2]}, protocol=pickle.HIGHEST_PROTOCOL)
    assert path.read_bytes() == cache.HEADER + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload


def test_an_entry_with_one_byte_changed_is_rebuilt_saying_so(tmp_path, capsys):
    path = tmp_path / "k.pkl"
    cached(path, lambda: [10, 20, 30])
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01  # the payload's 20 becomes 21: it still unpickles, to other data
    assert pickle.loads(data[data.rindex(b"\x80\x05") :]) == [10, 21, 30]
    path.write_bytes(data)
    assert cached(path, lambda: [4]) == [4]
    warning = f"normlab: warning: data cache entry {path} fails its SHA-256 check (altered or cut short); rebuilding it\n"
    assert capsys.readouterr().err == warning
    assert cached(path, lambda: pytest.fail("rebuilt again")) == [4]  # the rebuilt entry replaced it


@pytest.mark.parametrize("damage", ["cut short", "no digest (an older entry)"])
def test_an_entry_cut_short_or_without_a_digest_is_rebuilt_saying_so(tmp_path, capsys, damage):
    path = tmp_path / "k.pkl"
    cached(path, lambda: [10, 20, 30])
    path.write_bytes(path.read_bytes()[:-3] if damage == "cut short" else pickle.dumps([10, 20, 30]))
    assert cached(path, lambda: [4]) == [4]
    warning = f"normlab: warning: data cache entry {path} fails its SHA-256 check (altered or cut short); rebuilding it\n"
    assert capsys.readouterr().err == warning


def test_an_entry_that_does_not_unpickle_is_rebuilt_saying_so(tmp_path, capsys):
    path = tmp_path / "k.pkl"
    payload = b"\x80\x05not a pickle"  # its digest matches: written whole, by a Python that cannot be read here
    path.write_bytes(cache.HEADER + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
    assert cached(path, lambda: [4]) == [4]
    warning = f"normlab: warning: data cache entry {path} is unreadable (UnpicklingError); rebuilding it\n"
    assert capsys.readouterr().err == warning


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_an_unwritable_cache_costs_only_the_speed_up(tmp_path, capsys):
    tmp_path.chmod(0o500)
    try:
        assert cached(tmp_path / "k.pkl", lambda: [4]) == [4]
    finally:
        tmp_path.chmod(0o700)
    assert capsys.readouterr().err.startswith(f"normlab: warning: cannot write the data cache {tmp_path / 'k.pkl'} (")


def test_a_cache_path_that_is_a_file_costs_only_the_speed_up(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    assert cached(tmp_path / "afile" / "k.pkl", lambda: [4]) == [4]  # as root too: a file cannot hold entries
    assert capsys.readouterr().err.startswith(f"normlab: warning: cannot write the data cache {tmp_path / 'afile' / 'k.pkl'} (")


def test_cmudict_from_the_disk_cache_equals_cmudict_parsed(tmp_path, monkeypatch):
    g2p._g2p_data.cache_clear()
    parsed = g2p._g2p_data(False, None, str(tmp_path))  # a miss: parsed, encoded, stored
    (entry,) = tmp_path.iterdir()
    g2p._g2p_data.cache_clear()  # a new process
    monkeypatch.setattr(g2p, "_build_g2p_data", lambda *_: pytest.fail("built although the entry was on disk"))
    loaded = g2p._g2p_data(False, None, str(tmp_path))
    g2p._g2p_data.cache_clear()
    assert [v.to_str() for v in loaded[:2]] == [v.to_str() for v in parsed[:2]]
    assert loaded[2:] == parsed[2:] and len(loaded[2]["train"]) == len(loaded[4]) > 100_000  # [4]: the train rows' words
    # keep_stress and restored vocabularies name other entries (looked up, not built here)
    vocab_json = (parsed[0].to_str(), parsed[1].to_str())
    keys = {g2p._cache_path(*args, str(tmp_path)) for args in [(False, None), (True, None), (False, vocab_json)]}
    assert entry in keys and len(keys) == 3 and g2p._cache_path(False, None, None) is None
