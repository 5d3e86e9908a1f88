"""The fixed-seed runs that pin normlab's numbers, and a comparison of two ``metrics.jsonl`` files.

    python -m tests.reference.expected_metrics write             # regenerate tests/expected/tiny_full.jsonl
    python -m tests.reference.expected_metrics compare A B       # A, B: metrics.jsonl files or run dirs
    python -m tests.reference.expected_metrics compare A B --exact

``write`` trains :data:`TINY_FULL` (a tiny model, 20 steps, ``telemetry=full``: every statistic at
every step) and keeps every logged value except the timing fields (:data:`TIMING`); run it only
when a change is meant to alter numbers, and say so in the commit. ``tests/test_expected_metrics.py``
checks a fresh run against that file. ``compare`` is how a refactor is checked bit for bit on one
machine (``--exact``); float32 kernels differ across CPUs (AVX2 vs AVX-512 paths, thread count),
so the test allows a small relative tolerance instead.
"""

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = ROOT / "tests" / "expected" / "tiny_full.jsonl"
TINY_FULL = ["model=tiny", "trainer=smoke", "logger=none", "telemetry=full", "seed=0"]
TIMING = ("perf/", "mem/")  # wall-clock and allocator readings: differ from run to run


def run_tiny_full(run_dir: Path) -> Path:
    """Train :data:`TINY_FULL` into ``run_dir`` in this process; returns its ``metrics.jsonl``."""
    from hydra import compose, initialize_config_dir

    from train import train

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=TINY_FULL)
    train(cfg, run_dir)
    return run_dir / "metrics.jsonl"


def load(path: Path) -> list[dict[str, float]]:
    """The records of a ``metrics.jsonl`` (or of ``<run dir>/metrics.jsonl``) without timing fields.

    Raises:
        FileNotFoundError: no such file.
    """
    path = path / "metrics.jsonl" if path.is_dir() else path
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [{k: v for k, v in row.items() if not k.startswith(TIMING)} for row in rows]


# What float32 kernels of different CPUs move the tiny run's values by (tests/test_expected_metrics.py says where
# they were measured); a real change of behaviour moves them by far more.
CROSS_CPU = {"rtol": 2e-3, "atol": 5e-5}


def differences(
    a: list[dict], b: list[dict], rtol: float = 0.0, atol: float = 0.0, counts: dict[str, float] | None = None
) -> list[str]:
    """Where ``b`` differs from ``a``: a record count, a key set or a value outside
    ``|x - y| <= atol + rtol * |x|`` (NaN equals NaN); empty when they agree. ``counts``: keys whose
    values count discrete events (a decoded word, an Adam entry below eps), each with the absolute
    difference allowed instead."""
    counts = counts or {}
    if len(a) != len(b):
        return [f"{len(a)} records vs {len(b)}"]
    out = []
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x.keys() != y.keys():
            out.append(
                f"record {i} (step {x.get('step')}): keys differ: only in A {sorted(x.keys() - y.keys())[:5]}, "
                f"only in B {sorted(y.keys() - x.keys())[:5]}"
            )
            continue
        for k, u in x.items():
            v = y[k]
            if not (_close(u, v, 0.0, counts[k]) if k in counts else _close(u, v, rtol, atol)):
                out.append(f"step {x.get('step')} {k}: {u!r} vs {v!r}")
    return out


def _close(u: float, v: float, rtol: float, atol: float) -> bool:
    if isinstance(u, float) and math.isnan(u):
        return isinstance(v, float) and math.isnan(v)
    return abs(u - v) <= atol + rtol * abs(u)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("write", help=f"regenerate {EXPECTED.relative_to(ROOT)}")
    cmp = sub.add_parser("compare", help="compare two metrics.jsonl files (timing fields aside)")
    cmp.add_argument("a", type=Path)
    cmp.add_argument("b", type=Path)
    cmp.add_argument(
        "--exact", action="store_true", help=f"bit for bit (default: rtol {CROSS_CPU['rtol']:g}, atol {CROSS_CPU['atol']:g})"
    )
    args = parser.parse_args(argv)
    if args.cmd == "write":
        with tempfile.TemporaryDirectory() as tmp:
            rows = load(run_tiny_full(Path(tmp)))
        EXPECTED.parent.mkdir(parents=True, exist_ok=True)
        EXPECTED.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        print(f"wrote {EXPECTED} ({len(rows)} records, {sum(len(r) for r in rows)} values)")
        return 0
    a, b = load(args.a), load(args.b)
    tol = {} if args.exact else CROSS_CPU
    diff = differences(a, b, **tol)
    n = sum(len(r) for r in a)
    print(
        f"{n} values in {len(a)} records: "
        + ("identical" if args.exact and not diff else "agree" if not diff else f"{len(diff)} differ")
    )
    for line in diff[:20]:
        print("  " + line)
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
