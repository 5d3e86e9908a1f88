"""Reading and comparing finished runs, offline: what ``scripts/report.py`` and ``scripts/wandb_workspace.py`` share.

- ``runs``: the :class:`~analysis.runs.Run` record of one run directory;
- ``load``: run directories -> runs (never failing on a bad run), and the task they are of (``runlog.tasks``);
- ``variants``: runs -> variants (runs that differ only in the seed);
- ``stats``: a variant's mean curve with its min-max or standard-error band, mean ± standard error;
- ``params``: a variant's (or LR family's) parameter counts and their ratio to a baseline's;
- ``paired``: variants vs a baseline variant, seed by seed (paired t test, noise floor), the rows of summary.csv;
- ``panels``: variants -> the report's charts as plain data (nothing here draws);
- ``stability``: variants -> the report's stability charts (max logit, log Z, spectral norm, kurtosis), the same way;
- ``depth``: variants -> the rows of the report's depth_profile.csv and depth_growth.csv (residual RMS growth with depth);
- ``lrs``: runs -> LR families and their LR sensitivity (Wortsman et al. 2023), per seed and across seeds;
- ``lr_panels``: an LR study -> the report's LR-sensitivity charts, the same way;
- ``csvs``: writing the report's CSVs.
"""
