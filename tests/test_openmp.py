"""train.py has torch's OpenMP threads sleep while they wait (OMP_WAIT_POLICY=PASSIVE) unless the user chose."""

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

# libgomp prints its settings at start-up with OMP_DISPLAY_ENV=VERBOSE; GOMP_SPINCOUNT is how long a waiting thread
# spins before it sleeps: 0 under PASSIVE, 300000 when the policy is unset, 30000000000 under ACTIVE.
SHOW = f"import sys; sys.path.insert(0, {str(ROOT)!r}); import train, torch; torch.ones(64, 64) @ torch.ones(64, 64)"


def spincount(policy: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | {"OMP_DISPLAY_ENV": "VERBOSE"}
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    out = subprocess.run([sys.executable, "-c", SHOW], env=env, capture_output=True, text=True, check=True)
    (line,) = [x for x in out.stderr.splitlines() if "GOMP_SPINCOUNT" in x]
    return line.split("=")[1].strip().strip("'")


@pytest.mark.parametrize(("policy", "expected"), [(None, "0"), ("ACTIVE", "30000000000")])
def test_waiting_threads_sleep_unless_the_user_set_a_policy(policy, expected):
    assert spincount(policy) == expected
