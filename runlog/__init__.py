"""What a run directory holds, on the ground floor: metric names and their parsing
(:mod:`runlog.metric_names`), status states (:mod:`runlog.status`), renamed config keys
(:mod:`runlog.renames`), atomic writes (:mod:`runlog.atomic`), the lock that keeps one run at a time in a
run dir (:mod:`runlog.lock`) and each task's metric spec, a run's ``task.json`` (:mod:`runlog.tasks`).

Standard library only, so ``data/``, ``model/``, ``training/``, ``analysis/`` and ``scripts/`` all
read the same contract without importing torch or each other.
"""
