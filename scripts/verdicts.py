"""Write docs/results.md's verdicts from the claims files (``analysis.verdict_page``), or check them.

    python -m scripts.verdicts            # rewrite every <!-- verdicts: KEY --> block of docs/results.md
    python -m scripts.verdicts --check    # exit 1 naming each block whose words differ from the computed ones

Each ``docs/results/<folder>/claims.yaml`` is judged from the CSVs it names (``analysis.verdicts``). Exit status 2
with one line on a claims file, CSV or block that cannot be judged (the line names the file, claim and value).
"""

import argparse
import sys
from pathlib import Path

from analysis.claims import ClaimsError
from analysis.verdict_page import render_page

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="verdicts", description="docs/results.md's verdicts from its claims files")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block differs")
    parser.add_argument("--page", type=Path, default=ROOT / "docs" / "results.md")
    parser.add_argument("--results", type=Path, default=ROOT / "docs" / "results", help="where the claims and CSVs are")
    args = parser.parse_args(argv)
    try:
        text = args.page.read_text(encoding="utf-8")
        new, changed = render_page(text, args.results.resolve())
    except (ClaimsError, OSError) as err:
        print(f"verdicts: {err}", file=sys.stderr)
        return 2
    if args.check:
        for key in changed:
            print(
                f"verdicts: block 'verdicts: {key}' of {args.page} differs from the computed verdicts; "
                "run python -m scripts.verdicts",
                file=sys.stderr,
            )
        return 1 if changed else 0
    args.page.write_text(new, encoding="utf-8")
    print(f"verdicts: {len(changed)} block(s) rewritten in {args.page}: {', '.join(changed) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
