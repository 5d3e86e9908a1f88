"""docs/results.md's verdicts, written from the claims files (:mod:`analysis.claims`, :mod:`analysis.verdicts`).

The page holds generated blocks between ``<!-- verdicts: KEY -->`` and ``<!-- /verdicts -->``: KEY ``summary`` is
the summary table (one row per section with a block, its verdicts; the finding is the section's heading), any other
KEY is the ``section`` of a claims file under docs/results/ (its block: how many comparisons each family has, then a
table of its claims with n, the mean difference, the plain and the Holm-corrected interval, m and the verdict).
:func:`render_page` rewrites every block; what lies outside them is kept as it is.
"""

import re
from pathlib import Path

from analysis.claims import ClaimsError, ClaimsFile, load_claims
from analysis.verdicts import Verdict, judge

BLOCK = re.compile(r"(<!-- verdicts: (\S+) -->\n)(.*?)(<!-- /verdicts -->)", re.S)
SUMMARY = "summary"
COLUMNS = (
    "claim",
    "statement",
    "source",
    "metric",
    "contrast",
    "n",
    "mean difference",
    "{ci}",
    "Holm-corrected CI",
    "m",
    "verdict",
)


def find_claims(root: Path) -> list[ClaimsFile]:
    """Every ``claims.yaml`` under ``root``, loaded (sorted by path).

    Raises:
        ClaimsError: a file that does not load, or two files with one ``section``.
    """
    files = [load_claims(p) for p in sorted(root.rglob("claims.yaml"))]
    sections = [f.section for f in files]
    for f in files:
        if sections.count(f.section) > 1:
            raise ClaimsError(f"{f.path}: section {f.section!r} is also another claims file's; valid: one file per section")
    return files


def render_page(text: str, root: Path) -> tuple[str, list[str]]:
    """(``text`` with every verdicts block rewritten, the keys of the blocks that changed).

    Raises:
        ClaimsError: a block whose key is no claims file's section, a claims file without a block on the page,
            a block given twice, or any error of :func:`analysis.verdicts.judge`.
    """
    files = {f.section: f for f in find_claims(root)}
    keys = [m.group(2) for m in BLOCK.finditer(text)]
    for key in keys:
        if key != SUMMARY and key not in files:
            raise ClaimsError(f"docs/results.md: block 'verdicts: {key}' has no claims file; valid: {', '.join(files)}")
        if keys.count(key) > 1:
            raise ClaimsError(f"docs/results.md: block 'verdicts: {key}' appears {keys.count(key)} times; valid: once")
    for section, f in files.items():
        if section not in keys:
            raise ClaimsError(f"{f.path}: no block '<!-- verdicts: {section} -->' on docs/results.md; add one")
    verdicts = {s: judge(f, root) for s, f in files.items()}
    blocks = {s: section_block(files[s], verdicts[s], root) for s in files}
    blocks[SUMMARY] = summary_block(text, files, verdicts, root)
    changed = [m.group(2) for m in BLOCK.finditer(text) if m.group(3) != blocks[m.group(2)]]
    return BLOCK.sub(lambda m: m.group(1) + blocks[m.group(2)] + m.group(4), text), changed


def section_block(claims: ClaimsFile, verdicts: list[Verdict], root: Path) -> str:
    """A section's block: where its claims are and when they were written, each family's size, the table."""
    link = _link(claims, root)
    if claims.reference is not None and not claims.claims:
        return f"Reference point, no verdict ({link}): {claims.reference}\n"
    families = {v.claim.family: v.m for v in verdicts}
    sizes = "; ".join(f"family `{f}`: {m} comparison{'s' * (m != 1)}" for f, m in families.items())
    seeds = ", ".join(map(str, claims.seeds))
    if all(c.contrast is None for c in claims.claims):
        head = f"From {link} (written {claims.written}): no per-seed rows, so no interval and no Holm correction.\n\n"
    else:
        head = (
            f"Computed by `python -m scripts.verdicts` from {link} (written {claims.written}; seeds {seeds}; "
            f"alpha {claims.alpha:g}). {sizes[0].upper()}{sizes[1:]}; Holm-corrected within each family.\n\n"
        )
    ci = f"{100 * (1 - claims.alpha):g} % CI"
    header = [c.format(ci=ci) for c in COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in _row(v)) + " |" for v in verdicts]
    return head + "\n".join(lines) + "\n"


def summary_block(text: str, files: dict[str, ClaimsFile], verdicts: dict[str, list[Verdict]], root: Path) -> str:
    """The summary table: one row per section with a block (in page order), from :func:`summary_row`."""
    rows = [summary_row(text, files[k], verdicts[k], root) for k in (m.group(2) for m in BLOCK.finditer(text)) if k != SUMMARY]
    return "\n".join(["| finding | claims | computed verdict of each claim (metric) |", "|---|---|---|", *rows]) + "\n"


def summary_row(text: str, claims: ClaimsFile, verdicts: list[Verdict], root: Path) -> str:
    """A section's summary row: its heading (linked), its claims file (linked), each claim's id, metric and verdict
    (the verdict's first words: the section's block gives the rest)."""
    block = next((m for m in BLOCK.finditer(text) if m.group(2) == claims.section), None)
    if block is None:
        raise ClaimsError(f"{claims.path}: no block '<!-- verdicts: {claims.section} -->' on docs/results.md; add one")
    heading = _heading(text, block.start())
    if claims.reference is not None and not claims.claims:
        result = "reference point: no claim, no verdict"
    else:
        result = "; ".join(f"`{v.claim.id}` ({v.claim.metric or 'no per-seed metric'}): {v.word.split(':')[0]}" for v in verdicts)
    return f"| [{heading}](#{_slug(heading)}) | {_link(claims, root)} | {_cell(result)} |"


def page_blocks(text: str) -> dict[str, str]:
    """key -> the text of each verdicts block of ``text`` (between its two markers)."""
    return {m.group(2): m.group(3) for m in BLOCK.finditer(text)}


def _row(v: Verdict) -> list[str]:
    c = v.claim
    plain = "—" if v.plain is None else _interval(v.plain)
    corrected = "—" if v.corrected is None or v.level is None else f"{_interval(v.corrected)} at {100 * (1 - v.level):.4g} %"
    mean = "—" if v.mean is None else _number(v.mean)
    return [
        f"`{c.id}`",
        c.claim,
        c.source,
        "—" if c.metric is None else f"`{c.metric}`",
        _contrast_text(c),
        str(v.n),
        mean,
        plain,
        corrected,
        str(v.m),
        v.word,
    ]


def _contrast_text(c) -> str:
    if c.contrast is None:
        return "—"
    text = _one(c.contrast, c.csv)
    return text if c.minus is None else f"({text}) − ({_one(c.minus, c.csv)})"


def _one(contrast, csv: str) -> str:
    """``arm`` − ``baseline`` (or − the number), then `` at `` the setting both share."""
    skip = tuple(k for k, _ in contrast.at)
    other = f"{contrast.against:g}" if contrast.baseline is None else f"`{contrast.baseline.label(csv, skip)}`"
    at = f" at `{' '.join(f'{k}={v}' for k, v in contrast.at)}`" if contrast.at else ""
    return f"`{contrast.arm.label(csv, skip)}` − {other}{at}"


def _interval(ci: tuple[float, float]) -> str:
    return f"[{_number(ci[0])}, {_number(ci[1])}]"


def _number(x: float) -> str:
    """Three significant digits (trailing zeros kept), signed: a difference."""
    return f"{x:+#.3g}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _link(claims: ClaimsFile, root: Path) -> str:
    rel = claims.path.relative_to(root).as_posix()
    return f"[{rel}](results/{rel})"


def _heading(text: str, position: int) -> str:
    """The ``## `` heading above ``position`` in ``text``."""
    headings = re.findall(r"^## (.+)$", text[:position], re.M)
    if not headings:
        raise ClaimsError("docs/results.md: a verdicts block above the first section heading; valid: inside a section")
    return headings[-1]


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading (as tests/test_docs.py checks it)."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")
