"""The norm-kind records (model/kinds.py) are the one list of kinds: each record's classes build with what the
record says they take, and its facts are what the built modules do. tests/test_extending.py runs this file on a copy
with docs/extending.md's new kind applied (the docs' lists of kinds: tests/test_kind_docs.py)."""

import dataclasses
import importlib
import inspect

import pytest
import torch
from torch import nn

from model.kinds import NORM_KIND_RECORDS, kinds_where
from model.norms import BoundedNorm, build_norm
from model.placements import PLACEMENTS

RECORDS = list(NORM_KIND_RECORDS.values())


def _class(path: str) -> type:
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.name)
def test_each_record_s_classes_take_exactly_the_arguments_it_lists(record):
    # A config argument the class takes but the record does not pass would silently keep its default (a norm.bias=false
    # or norm.eps ignored); one the class lacks would fail at build time.
    flags = {"eps": record.eps, "bias": record.shift, "alpha_init": record.alpha}
    knobs = {f.name for f in dataclasses.fields(record.knobs)} if record.knobs else set()
    passed = {a for a, on in flags.items() if on} | knobs
    for path in filter(None, (record.custom, record.native)):
        if path == "torch.nn:Identity":  # takes and ignores any argument
            continue
        params = dict(list(inspect.signature(_class(path)).parameters.items())[1:])  # after dim (D)
        required = {n for n, p in params.items() if p.default is inspect.Parameter.empty}
        assert required <= passed <= set(params), (record.name, path, list(params))
        assert set(flags) & set(params) == set(flags) & passed, (record.name, path)


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.name)
def test_each_record_s_facts_are_what_its_modules_do(record):
    for impl in record.impls:
        norm = build_norm(record.name, 16, impl=impl, attention=True)
        names = {n for n, _ in norm.named_parameters()}
        assert ("bias" in names) == record.shift and ("weight" in names) == record.gain, (record.name, impl)
        unshifted = build_norm(record.name, 16, impl=impl, bias=False, attention=True)
        assert "bias" not in dict(unshifted.named_parameters())
        assert isinstance(norm, BoundedNorm) == record.bounded
        if record.alpha:
            assert build_norm(record.name, 16, impl=impl, alpha_init=0.3).alpha.item() == pytest.approx(0.3)
        if record.eps:  # every class that takes eps keeps it (native ones too)
            assert getattr(norm, "eps", None) == 1e-5
    if record.bounded:  # at init (weight 1, bias 0) the bound is 1 (DyT, Derf) or sqrt(D) = 4 (DyISRU), whatever the input
        assert build_norm(record.name, 16)(torch.randn(4, 16) * 1e6).abs().max() <= 4 + 1e-3


def test_unknown_facts_are_refused_naming_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown kind facts \['shifted'\]; valid: .*shift"):
        kinds_where(shifted=True)


def test_the_placements_that_end_a_block_with_the_norm_reject_exactly_the_bounded_kinds():
    assert set(PLACEMENTS["post"].rejects) == set(PLACEMENTS["deepnorm"].rejects) == set(kinds_where(bounded=True))


def test_the_identity_kind_is_torch_s():
    assert isinstance(build_norm("none", 8), nn.Identity)
