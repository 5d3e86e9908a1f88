"""What a checkpoint carries to resume a run, piece by piece.

Each stateful piece of a run (the model, the optimizer, every rank's RNG streams, the step, the data position, the
counters, the spike scores, telemetry's power-iteration vectors, the best validation so far) has ``state_dict`` /
``load_state_dict`` and is registered once, under its checkpoint entry, in ``training.run.Run.pieces``;
:func:`save_state` and :func:`load_state` loop over that registry, so checkpointing and resuming cannot disagree
about what a run holds. The design follows torchtitan's checkpointer (``CheckpointManager(states={...})``, every
value ``Stateful``) and lingua's ``TrainState(Stateful)``; the entries stay at the checkpoint's top level, where
every normlab checkpoint has kept them (``training/checkpoint.py``), and what older checkpoints lack is filled in
by ``runlog/migrate.py`` before anything here reads them.
"""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from training import distributed
from training.checkpoint import rng_state, set_rng_state


class Stateful(Protocol):
    """A piece of a run that a checkpoint carries (``torch.distributed.checkpoint.stateful.Stateful``'s methods)."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any, /) -> object: ...


@dataclass
class Field:
    """One plain value of ``owner`` as a piece (``run.step``, ``run.data_position``, ``run.counters``): saved as it
    is, restored through ``restore`` (``tuple`` for the data position, ``dict`` for a copy of the counters)."""

    owner: object
    name: str
    restore: Callable[[Any], Any]

    def state_dict(self) -> Any:
        return getattr(self.owner, self.name)

    def load_state_dict(self, state: Any, /) -> None:
        setattr(self.owner, self.name, self.restore(state))


@dataclass
class RankRngs:
    """Every rank's RNG streams: a list with one :func:`training.checkpoint.rng_state` per rank, rank 0's first.

    :meth:`state_dict` is a collective (it gathers every rank's streams): every rank calls it, on the same steps."""

    device: torch.device
    world: int

    def state_dict(self) -> list[object]:
        return distributed.all_gather_object(rng_state(self.device))

    def load_state_dict(self, state: list[dict[str, Any]], /) -> None:
        """This rank's streams back (``set_rng_state``: with another number of ranks, a warning that the run is not
        bit-exact)."""
        set_rng_state(state, distributed.rank(), self.world, self.device)


def save_state(pieces: dict[str, Stateful | None]) -> dict[str, Any]:
    """``{entry: piece.state_dict()}`` of the registry ``pieces``; a piece the run does not keep (None) is saved as
    None. A collective where a piece's ``state_dict`` is (:class:`RankRngs`): every rank calls it."""
    return {key: None if piece is None else piece.state_dict() for key, piece in pieces.items()}


def load_state(pieces: dict[str, Stateful | None], ckpt: dict[str, Any], source: Path) -> None:
    """Restore each piece of the registry ``pieces`` from its entry of ``ckpt`` (a checkpoint read by
    ``training.checkpoint.load_checkpoint``, so older ones migrated). A piece the run does not keep (None) is
    skipped, and so is an entry of None (written before that piece existed, or by a run that did not keep it):
    that piece keeps the fresh state it was built with.

    Raises:
        ValueError: ``ckpt`` (read from ``source``) lacks an entry the registry names (the message lists them), or an
            entry does not fit its piece (an ``optim=muon`` checkpoint resumed under ``optim=adamw``): the message
            names the entry and the piece's own error.
    """
    if missing := [key for key in pieces if key not in ckpt]:
        raise ValueError(
            f"train.resume: {source} lacks the checkpoint entries {missing}: it was not written by "
            "normlab's save_run (runlog/migrate.py lists what older checkpoints may lack)"
        )
    for key, piece in pieces.items():
        if piece is not None and ckpt[key] is not None:
            try:
                piece.load_state_dict(ckpt[key])
            except (KeyError, ValueError, RuntimeError) as error:
                raise ValueError(
                    f"train.resume: the {key} entry of {source} does not fit this run's {key} "
                    f"({type(error).__name__}: {error}); resume with the settings it was saved with, or start afresh "
                    "with train.resume=null"
                ) from error
