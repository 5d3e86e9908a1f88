"""What a run directory holds, on the ground floor: metric names and their parsing
(:mod:`runlog.metric_names`), status states (:mod:`runlog.status`), renamed config keys
(:mod:`runlog.renames`) and atomic writes (:mod:`runlog.atomic`).

Standard library only, so ``data/``, ``model/``, ``training/``, ``analysis/`` and ``scripts/`` all
read the same contract without importing torch or each other.
"""
