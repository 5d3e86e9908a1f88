"""train.py has torch's OpenMP threads spin briefly before they sleep (GOMP_SPINCOUNT=10000) unless the user chose."""

import os
import subprocess
import sys

import pytest

from tests.helpers.config import ROOT

# libgomp prints its settings at start-up with OMP_DISPLAY_ENV=VERBOSE; GOMP_SPINCOUNT is how long a waiting thread
# spins before it sleeps: 0 under PASSIVE, 300000 when nothing is set, 30000000000 under ACTIVE.
SHOW = f"import sys; sys.path.insert(0, {str(ROOT)!r}); import train, torch; torch.ones(64, 64) @ torch.ones(64, 64)"


def spincount(**chosen: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env |= {"OMP_DISPLAY_ENV": "VERBOSE", **chosen}
    out = subprocess.run([sys.executable, "-c", SHOW], env=env, capture_output=True, text=True, check=True)
    (line,) = [x for x in out.stderr.splitlines() if "GOMP_SPINCOUNT" in x]
    return line.split("=")[1].strip().strip("'")


@pytest.mark.parametrize(("chosen", "expected"), [
    ({}, "10000"),
    ({"OMP_WAIT_POLICY": "ACTIVE"}, "30000000000"),
    ({"OMP_WAIT_POLICY": "PASSIVE"}, "0"),
    ({"GOMP_SPINCOUNT": "500"}, "500"),
])  # fmt: skip
def test_waiting_threads_spin_briefly_unless_the_user_chose(chosen, expected):
    assert spincount(**chosen) == expected
