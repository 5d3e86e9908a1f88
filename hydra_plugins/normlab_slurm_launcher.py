"""``hydra/launcher=slurm``'s launcher (``conf/hydra/launcher/slurm.yaml``): hydra-submitit-launcher's SLURM
launcher whose start-up failures stop with one line (the checks: ``training.slurm``). It lives here because
Hydra instantiates launchers of the ``hydra_plugins`` namespace package only; the repository root is on the path of
``train.py`` and, through PYTHONPATH, of its SLURM jobs, which unpickle it."""

import sys
from collections.abc import Sequence
from typing import Any

from hydra.core.utils import JobReturn
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as SubmititSlurmLauncher

from training.slurm import missing_error, submit_error, timing_error


class SlurmLauncher(SubmititSlurmLauncher):
    """Checks its timing when Hydra sets it up, and that SLURM is there and takes the sweep when it launches; exits
    with ``normlab: error: <one line>`` otherwise. A job that fails once submitted raises as before."""

    def setup(self, **kwargs: Any) -> None:
        if error := timing_error(self.params):
            sys.exit(f"normlab: error: {error}")
        super().setup(**kwargs)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        if error := missing_error():
            sys.exit(f"normlab: error: {error}")
        from submitit.core.utils import FailedJobError  # as the launcher does: imported at launch, not at discovery

        try:
            return super().launch(job_overrides, initial_job_idx)
        except FailedJobError as e:
            if (error := submit_error(e)) is None:
                raise
            sys.exit(f"normlab: error: {error}")
