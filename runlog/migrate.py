"""Checkpoints written by older normlab, read as today's: the one place that knows which entries an older
``checkpoint.pt`` (or ``best.pt``) lacks or holds in another form, beside ``renames.py``, which does the same for
configs (a checkpoint's ``config`` goes through it here).

``training.checkpoint.load_checkpoint`` calls :func:`migrate_checkpoint` on every file it reads, so the resume
(``training.state.load_state``) and every other reader see one format. Plain data only (no torch): the values
``torch.load`` returned are moved, never looked into.
"""

from typing import Any

from runlog.renames import with_current_names

# Entries added to checkpoint.pt since its format was fixed, each None in a checkpoint written before it: a piece
# whose entry is None starts afresh on resume (training.state.load_state), as it would have then.
STARTS_AFRESH = (
    "spikes",  # before spike scores: the resumed run's scores cover the steps after the checkpoint only
    "telemetry",  # before the power-iteration vectors were kept: the next sigma_max record starts from a new vector
    "best",  # before trainer.test_checkpoint=best: the best so far starts afresh
)
FIRST_TASK = "g2p"  # the task of every checkpoint written before there were tasks


def migrate_checkpoint(ckpt: dict[str, Any]) -> dict[str, Any]:
    """``ckpt`` (a loaded checkpoint dict) as today's normlab writes it; the input is not modified.

    - ``config`` and ``model_config``'s ``norm``: read with today's key names and added keys
      (:func:`runlog.renames.with_current_names`);
    - ``rng``: a single process's streams (one dict, written before each rank kept its own) become a list of one;
    - ``task``: absent before there were tasks: ``g2p``;
    - each entry of ``STARTS_AFRESH`` it lacks: None.

    Raises:
        KeyError: ``ckpt`` has no ``config`` (no normlab checkpoint ever lacked it).
    """
    out = {**ckpt, "config": with_current_names(ckpt["config"])}
    if isinstance(ckpt.get("model_config"), dict):  # its norm section is the config's (ModelConfig.to_dict)
        out["model_config"] = with_current_names(ckpt["model_config"])
    if isinstance(out.get("rng"), dict):
        out["rng"] = [out["rng"]]
    out.setdefault("task", FIRST_TASK)
    for key in STARTS_AFRESH:
        out.setdefault(key, None)
    return out
