"""docs/results.md read once, split into its sections, and a preset's swept values."""

import re

from tests.helpers.config import ROOT, compose_conf

DOCS = ROOT / "docs"
PAGE = (DOCS / "results.md").read_text(encoding="utf-8")


def sections() -> list[str]:
    """The page cut before each ``## `` heading: the summary above the first, then one text per section."""
    return re.split(r"\n(?=## )", PAGE)


def sweep_params(experiment: str) -> dict[str, list[str]]:
    """The swept keys of ``+experiment=<experiment>`` and their values."""
    params = compose_conf(f"+experiment={experiment}", hydra=True).hydra.sweeper.params
    return {key: str(value).split(",") for key, value in params.items()}
