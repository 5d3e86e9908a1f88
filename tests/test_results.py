"""docs/results.md states no number that this file does not check.

Tables. A results table follows a marker

    <!-- csv: results/<file>.csv key=<column>[,<column>...] -->

whose key columns match the table's first columns (text, exactly); each further column's header names a CSV column in
backticks (e.g. "LRS (`lrs_mean`)"). Every number in such a cell must equal the CSV's value to the number of decimals
shown, or, written with a unit, "24.5 %" or "+6.7 pt" (percentage points), the CSV's fraction times 100 (PER and WER
are stored as fractions); a cell may hold the text "diverged", "did not learn" or "—" where the CSV cell is empty.
A run's set-up follows a marker ``<!-- conf: +experiment=<name> -->``: a two-column table (key, value) whose every
value must be the experiment preset's (a swept key: the sweep's values, comma-separated).

Prose. Every other number on the page (outside code, links, HTML comments and the generated verdict blocks, which
``tests/test_claims.py`` recomputes) must be one of the values the tables of
its own section check (a CSV value or a set-up value; the summary above the first section: any table's), to the
decimals it shows: as it is, as a magnitude (a difference written "0.14
lower"), or, followed by "%" or "points", times 100 (PER is stored as a fraction). An integer without "%" must match
exactly. Only citation forms are exempt: years after a name, arXiv ids, §, Fig., Lemma, issue numbers, model and data
set names, and the confidence level of "95 % CI" (``CITATION``).
"""

import csv
import math
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.helpers.config import compose_conf
from tests.helpers.results import DOCS, PAGE, sections

ROOT = Path(__file__).resolve().parents[1]
TABLE = r"\n+((?:\|.*\|\n)+)"
CSV_MARKER = re.compile(r"<!-- csv: (\S+) key=(\S+) -->" + TABLE)
CONF_MARKER = re.compile(r"<!-- conf: (\+experiment=\w+) -->" + TABLE)
NUMBER = re.compile(r"^[+-]?\d+(?:\.(\d+))?(?:e[+-]?\d+)?$")
PERCENT = re.compile(r"^([+-]?\d+(?:\.\d+)?) (?:%|pt)$")  # a fraction shown x 100: "24.5 %", "+6.7 pt"
EMPTY_CELLS = ("diverged", "did not learn", "—")
# numbers that are names, not measurements: citation years, arXiv ids, sections, figures, issues, models and corpora
CITATION = re.compile(
    r"(?:et al\.,? |[A-Z][\w-]+ |\()(?:19|20)\d\d\b|arXiv \d{4}\.\d{4,5}|§\s?\d+(?:\.\d+)*|Fig\. \d+|Lemma \d+|issue \d+"
    r"|ViT-22B|GPT-2|IWSLT ?1[47]|WMT ?14|De-En|Peri-LN|Mix-LN|\bL\d\b|\(\d\)|95 %\s(?:CI|confidence)"
)
VERDICT_BLOCK = r"<!-- verdicts: \S+ -->.*?<!-- /verdicts -->"  # generated: tests/test_claims_page.py recomputes it
PROSE_NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?(?:e[+-]?\d+)?)(?![\w])(\s?%|\s?points?)?")


def split_rows(body: str) -> list[list[str]]:
    """A markdown table's rows as cells, header first, the separator row dropped."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in body.strip().splitlines()]
    return [rows[0], *rows[2:]]


def csv_tables(text: str = PAGE) -> list[tuple[str, list[str], list[list[str]]]]:
    """(csv path, key columns, table rows) of every ``csv:`` table of ``text``."""
    return [(path, keys.split(","), split_rows(body)) for path, keys, body in CSV_MARKER.findall(text)]


def conf_tables(text: str = PAGE) -> list[tuple[str, list[list[str]]]]:
    """(``+experiment=NAME``, table rows) of every ``conf:`` table of ``text``."""
    return [(experiment, split_rows(body)) for experiment, body in CONF_MARKER.findall(text)]


def csv_values(path: str, keys: list[str], rows: list[list[str]]) -> list[float]:
    """The CSV values behind a ``csv:`` table's number cells, asserting each cell equals its value to the decimals shown."""
    with (DOCS / path).open(encoding="utf-8") as f:
        records = {tuple(r[k] for k in keys): r for r in csv.DictReader(f)}
    header, body = rows[0], rows[1:]
    columns = [re.search(r"`([^`]+)`", h).group(1) for h in header[len(keys) :]]
    assert body, f"{path}: empty table"
    values = []
    for row in body:
        key = tuple(row[: len(keys)])
        assert key in records, f"{path}: no row {key}"
        record = records[key]
        values += [float(record[k]) for k in keys if NUMBER.match(record[k])]
        for column, cell in zip(columns, row[len(keys) :], strict=True):
            value = record[column]
            if cell in EMPTY_CELLS:
                assert value == "" or not math.isfinite(float(value)), f"{path} {row[0]} {column}: {cell} vs {value}"
                continue
            percent = PERCENT.match(cell)
            shown = percent.group(1) if percent else cell
            match = NUMBER.match(shown)
            assert match, f"{path} {row[0]} {column}: {cell!r} is not a number"
            decimals = len(match.group(1) or "")
            where = f"{path} {row[: len(keys)]} {column}"
            scaled = float(value) * (100 if percent else 1)
            assert abs(float(shown) - scaled) <= 0.5 * 10**-decimals + 1e-9, f"{where}: {cell} vs {value}"
            values.append(float(value))
    return values


def conf_values(experiment: str, rows: list[list[str]]) -> list[float]:
    """The numbers of a ``conf:`` table, asserting each value is the preset's (a swept key: its sweep values)."""
    cfg = compose_conf(experiment, hydra=True)
    swept = cfg.hydra.sweeper.params or {}  # a preset that is not a sweep (g2p_wu2021) has none
    values = []
    for key, shown in ((k.strip("`"), v) for k, v in rows[1:]):
        actual = swept[key] if key in swept else OmegaConf.select(cfg, key, throw_on_missing=True)
        assert actual is not None, f"{experiment}: no key {key!r}"
        text = str(actual).lower() if isinstance(actual, bool) else str(actual)  # YAML's spelling: false, not False
        want = [s.strip() for s in text.split(",")]
        got = [s.strip() for s in shown.split(",")]
        assert len(got) == len(want), f"{experiment} {key}: {shown!r} vs {actual!r}"
        for g, w in zip(got, want, strict=True):
            same = g == w or (NUMBER.match(g) and NUMBER.match(w) and float(g) == float(w))
            assert same, f"{experiment} {key}: {shown!r} vs {actual!r}"
            if NUMBER.match(g):
                values.append(float(g))
    return values


def checked_values(text: str) -> list[float]:
    """The values behind the checked tables of ``text``."""
    found = [v for path, keys, rows in csv_tables(text) for v in csv_values(path, keys, rows)]
    return found + [v for experiment, rows in conf_tables(text) for v in conf_values(experiment, rows)]


def prose(text: str) -> str:
    """``text`` without its checked tables, code, HTML comments, link targets and citation forms."""
    text = CONF_MARKER.sub("", CSV_MARKER.sub("", text))
    for pattern in (VERDICT_BLOCK, r"```.*?```", r"`[^`]*`", r"<!--.*?-->", r"\]\([^)]*\)", r"\[results/[^\]]*\]"):
        text = re.sub(pattern, " ", text, flags=re.S)
    return CITATION.sub(" ", text)


def matches(token: str, unit: str | None, values: list[float]) -> bool:
    """Whether a prose number equals a checked value to its decimals (as a magnitude; x100 when followed by % or points)."""
    number = float(token.replace(",", ""))
    decimals = len(token.split(".")[1]) if "." in token and "e" not in token else 0
    tolerance = 0.5 * 10**-decimals + 1e-9 if "." in token or unit else 1e-9
    scales = (100.0,) if unit else (1.0, 100.0) if "." in token else (1.0,)
    return any(abs(number - abs(v) * s) <= tolerance for v in values for s in scales)


def test_results_page_has_marked_tables() -> None:
    assert len(csv_tables()) >= 3 and len(conf_tables()) >= 2


@pytest.mark.parametrize("path, keys, rows", csv_tables(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_number_comes_from_its_csv(path: str, keys: list[str], rows: list[list[str]]) -> None:
    csv_values(path, keys, rows)


@pytest.mark.parametrize("experiment, rows", conf_tables(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_setting_is_the_presets(experiment: str, rows: list[list[str]]) -> None:
    conf_values(experiment, rows)


def test_every_number_in_the_prose_is_a_checked_value_of_its_section() -> None:
    # A section's prose may quote its own tables only (the summary above the first section: any table), so a
    # wrong number rarely matches by chance some other value of the page.
    summary, *rest = sections()
    unchecked = []
    for text, values in ((summary, checked_values(PAGE)), *((t, checked_values(t)) for t in rest)):
        unchecked += unchecked_numbers(text, values)
    assert not unchecked, "numbers in docs/results.md that no checked table of their section holds:\n" + "\n".join(unchecked)


def unchecked_numbers(text: str, values: list[float]) -> list[str]:
    """Each number of ``text``'s prose that matches none of ``values``, with its line."""
    unchecked = []
    for line in prose(text).splitlines():
        for m in PROSE_NUMBER.finditer(line):
            if not matches(m.group(1), m.group(2), values):
                unchecked.append(f"{m.group(0).strip()!r} in: {line.strip()[:110]}")
    return unchecked


def test_the_prose_checker_catches_a_wrong_number() -> None:
    values = [0.289, 0.8076, 3.0, 600.0]
    assert matches("0.289", None, values) and matches("0.29", None, values) and matches("81", " %", values)
    assert matches("28.9", " points", values) and matches("600", None, values) and matches("3", None, values)
    assert not matches("0.288", None, values) and not matches("80", "%", values) and not matches("2", None, values)
    assert not matches("81", None, values)  # a bare integer must match exactly: "81" is not 0.8076
    assert re.sub(r"[\s,]+", " ", CITATION.sub("", "Xiong et al. 2020, arXiv 2002.04745, §3.1")).strip() == "Xiong"


def test_a_percent_cell_is_its_fraction_times_100(tmp_path) -> None:
    (tmp_path / "s.csv").write_text("variant,mean,diff_mean\npost,0.2453,0.0671\n")
    header = ["variant", "PER (`mean`)", "minus pre (`diff_mean`)"]
    assert csv_values(str(tmp_path / "s.csv"), ["variant"], [header, ["post", "24.5 %", "+6.7 pt"]]) == [0.2453, 0.0671]
    for wrong in (["post", "24.6 %", "+6.7 pt"], ["post", "0.2453 %", "+6.7 pt"], ["post", "24.5%", "+6.7 pt"]):
        with pytest.raises(AssertionError):
            csv_values(str(tmp_path / "s.csv"), ["variant"], [header, wrong])
