"""How far today's code lands from the results page: one committed cell per section, re-run.

    python -m scripts.provenance docs/results/provenance_cells.yaml --runs /work/runs/prov \\
        --rerun-commit deaf845 --out docs/results/provenance.csv

reads the spec (a YAML list, one entry per section: ``section, folder, runs_commit, runs_commit_source, csv, key,
arm, metric`` and, for a cell that was re-run, ``run_dir`` below ``--runs`` and the ``command`` that made it; ``note``
optional) and writes one row per entry (``analysis.provenance.FIELDS``): the committed value, the re-run's, their
difference and the arm's seed-to-seed sd. A re-run's metric is read with the function its section's CSV was written
with: ``test/per`` (``Run.final``, as ``scripts.report`` and ``scripts.report_batch_vs_layer``), ``final_val_loss``
(``analysis.lrs.final_loss_of``, as ``scripts.report_lrs`` and ``scripts.report_regime``), ``max_attn_logit``
(``analysis.lrs.last_max_logit``), ``per_run[LABEL]`` of ``depth_growth.csv`` (``analysis.depth.growth`` at the
run's first or last telemetry step, as ``analysis.depth.growth_rows``). A benchmark's cell (``run_dir`` a CSV) is read
from the CSV ``scripts.bench norms --csv`` wrote. Paths in ``csv`` are below ``--docs`` (default: the repository's docs/).
Exit status 2 with one line on a missing file or a bad spec entry.
"""

import argparse
import sys
from pathlib import Path

import yaml

from analysis.csvs import write_csv
from analysis.provenance import FIELDS, row
from reporting.provenance import DOCS, READERS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="provenance", description="committed cells beside their re-runs")
    parser.add_argument("spec", type=Path, metavar="SPEC", help="the YAML list of cells (docs/results/provenance_cells.yaml)")
    parser.add_argument("--runs", type=Path, required=True, help="the folder holding each entry's run_dir")
    parser.add_argument("--rerun-commit", required=True, help="the commit the re-runs used")
    parser.add_argument("--docs", type=Path, default=DOCS, help="the folder the entries' csv paths start from")
    parser.add_argument("--out", type=Path, required=True, help="the CSV to write")
    args = parser.parse_args(argv)
    try:
        entries = yaml.safe_load(args.spec.read_text(encoding="utf-8"))
        if not isinstance(entries, list):
            raise ValueError(f"{args.spec}: a YAML list of entries expected, got {type(entries).__name__}")
        rows = [row(e, args.docs, args.runs, READERS, args.rerun_commit) for e in entries]
        write_csv(args.out, FIELDS, rows)
    except (OSError, ValueError, yaml.YAMLError) as e:
        print(f"provenance: error: {e}", file=sys.stderr)
        return 2
    print(f"{args.out}: {len(rows)} cells, {sum(r[8] is not None for r in rows)} re-run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
