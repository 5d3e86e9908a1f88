"""Every list of kinds in README.md and docs/ names exactly the kinds the records (model/kinds.py) give it (the
records are the one list, and a new kind's record shows which doc rows it must join); the placement lists are the
placement records (model/placements.py); docs/norms.md names every ``norm.*`` key."""

import re
from dataclasses import fields

from model.kinds import ATTENTION_NORM_KINDS, NORM_KIND_RECORDS, NORM_KINDS, kinds_where
from model.norm_config import NormConfig
from model.placements import PLACEMENTS
from tests.helpers.config import ROOT


def _named(cell: str) -> list[str]:
    """The kind names a table cell or sentence mentions, in order (any case: ``DyT`` names ``dyt``)."""
    text = re.sub(r"\]\([^)]*\)", "]", cell)  # a link's target is not a mention
    return [w.lower() for w in re.findall(r"[A-Za-z_0-9]+", text) if w.lower() in NORM_KIND_RECORDS]


def _row(text: str, key: str) -> list[str]:
    (row,) = [line for line in text.splitlines() if line.startswith(f"| {key} |")]
    return row.split(" | ")


def test_the_readme_s_lists_of_kinds_are_the_records():
    readme = (ROOT / "README.md").read_text()
    assert re.findall(r"`(\w+)`", _row(readme, "`norm.kind`")[1]) == list(NORM_KINDS)
    assert re.findall(r"`(\w+)`", _row(readme, "`norm.qk`, `norm.v`")[1]) == list(ATTENTION_NORM_KINDS)
    assert _named(_row(readme, "`norm.eps`, `norm.bias`")[2].split("drops the shift of")[1]) == list(kinds_where(shift=True))
    assert _named(_row(readme, "`norm.decoder_batch_stats`")[2]) == list(kinds_where(reads_batch=True))


def test_docs_norms_lists_of_kinds_are_the_records():
    text = (ROOT / "docs" / "norms.md").read_text()
    table = text.split("## Norm kinds")[1].split("\n\n| key |")[0]
    assert {r for r in re.findall(r"^\| `(\w+)` \|", table, re.M)} == set(NORM_KINDS)
    assert set(_named(_row(text, "`norm.eps`")[2].split("unused by")[1])) == set(kinds_where(eps=False))
    assert set(_named(_row(text, "`norm.bias`")[2].split("`false` drops it")[0])) == set(kinds_where(shift=True))
    assert _named(_row(text, "`norm.decoder_batch_stats`")[2]) == list(kinds_where(reads_batch=True))
    native = re.search(r"`native` exists only for ([^(]*)\(", text).group(1)
    assert set(_named(native)) == {k.name for k in NORM_KIND_RECORDS.values() if k.native}
    bounded = set(kinds_where(bounded=True))
    assert set(_named(re.search(r"the bounded kinds (.*?)\s+are rejected", text, re.S).group(1))) == bounded
    assert set(_named(re.search(r"ends with the norm rejects (.*?);", text, re.S).group(1))) == bounded


def test_telemetry_docs_saturation_row_names_the_bounded_kinds():
    text = (ROOT / "docs" / "telemetry.md").read_text()
    assert set(_named(_row(text, "`saturation`")[1])) == set(kinds_where(bounded=True))


def test_the_placement_lists_are_the_placement_records():
    readme, norms = ((ROOT / p).read_text() for p in ("README.md", "docs/norms.md"))
    assert re.findall(r"`(\w+)`", _row(readme, "`norm.placement`")[1]) == list(PLACEMENTS)
    table = norms.split("| `norm.placement` |")[1].split("\n\n")[0]
    assert re.findall(r"^\| `(\w+)` \|", table, re.M) == list(PLACEMENTS)


def test_docs_norms_names_every_norm_key():
    text = (ROOT / "docs" / "norms.md").read_text()
    assert [f.name for f in fields(NormConfig) if f"`norm.{f.name}`" not in text] == []
    knobs = [f"norm.knobs.{k.name}.{f.name}" for k in NORM_KIND_RECORDS.values() if k.knobs for f in fields(k.knobs)]
    assert len(knobs) >= 2 and [key for key in knobs if f"| `{key}` |" not in text] == []  # a row each
