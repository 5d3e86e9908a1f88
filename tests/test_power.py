"""analysis.power against reference values (G*Power's one-sample t test, a closed-form chi-square quantile) and a
simulation; scripts.seeds_needed on the committed pilot (finding (a), seeds 0-2) and the seed count of its preset."""

import math

import numpy as np
import pytest
import yaml
from scipy import stats

from analysis.power import paired_t_power, pairs_needed, plan, sd_upper_limit
from scripts import seeds_needed
from tests.helpers.config import ROOT

PILOT = ROOT / "docs" / "results" / "lr_sensitivity" / "lrs_seeds.csv"


def test_power_matches_gpower_reference_values():
    # G*Power 3 (Faul et al. 2007), t test, one sample / matched pairs, two tails, alpha 0.05:
    # d = 1, n = 10 -> power 0.8031; d = 0.5 at power 0.8 -> n = 34.
    assert paired_t_power(1.0, 1.0, 10) == pytest.approx(0.8031, abs=5e-5)
    assert pairs_needed(0.5, 1.0) == 34
    assert paired_t_power(0.5, 1.0, 33) < 0.8 <= paired_t_power(0.5, 1.0, 34)


def test_power_matches_a_simulated_paired_t_test():
    rng = np.random.default_rng(0)
    delta, sd, n, trials = 0.289, 0.388, 17, 20_000
    diffs = rng.normal(delta, sd, size=(trials, n))
    p = stats.ttest_1samp(diffs, 0.0, axis=1).pvalue
    rate = float(np.mean(p < 0.05))
    expected = paired_t_power(delta, sd, n)
    assert abs(rate - expected) < 4 * math.sqrt(expected * (1 - expected) / trials)


def test_sd_upper_limit_is_the_chi_square_bound():
    # 2 dof: the chi-square cdf is 1 - exp(-x/2), so its 0.2 quantile is -2 ln 0.8.
    assert sd_upper_limit(1.0, 2, 0.8) == pytest.approx(math.sqrt(2 / (-2 * math.log(0.8))))
    assert sd_upper_limit(0.5, 10, 0.8) > 0.5 > sd_upper_limit(0.5, 10, 0.2)


@pytest.mark.parametrize(("call", "match"), [
    (lambda: paired_t_power(0.3, 0.0, 5), "sd > 0"),
    (lambda: paired_t_power(0.3, 1.0, 1), "n >= 2"),
    (lambda: pairs_needed(0.0, 1.0), "delta != 0"),
    (lambda: sd_upper_limit(1.0, 0), "df >= 1"),
    (lambda: plan([0.2]), "at least two"),
    (lambda: plan([0.2, 0.2, 0.2]), "not all equal"),
])  # fmt: skip
def test_bad_input_says_what_is_wrong(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_the_pilot_of_finding_a_asks_for_the_seeds_its_preset_runs(capsys, tmp_path):
    out_csv = tmp_path / "seeds_needed.csv"
    assert seeds_needed.main([str(PILOT), "--family", "post_ln", "--baseline", "pre_ln", "--out", str(out_csv)]) == 0
    committed = ROOT / "docs" / "results" / "lr_sensitivity_seeds" / "seeds_needed.csv"  # the plan on docs/results.md
    assert out_csv.read_text() == committed.read_text()
    out = capsys.readouterr().out
    assert "0: 0.366, 1: 0.079, 2: 0.421" in out
    assert "sd 0.183 (2 dof)" in out and "upper limit 0.388" in out
    assert "6 with the sd as estimated, 17 at its upper limit" in out
    preset = yaml.safe_load((ROOT / "conf" / "experiment" / "lr_sensitivity_seeds.yaml").read_text())
    new_seeds = [int(s) for s in str(preset["hydra"]["sweeper"]["params"]["seed"]).split(",")]
    assert sorted([0, 1, 2, *new_seeds]) == list(range(17))  # seeds 0-2 reused from the pilot


def test_an_unknown_family_names_the_families(capsys):
    assert seeds_needed.main([str(PILOT), "--family", "post_lnx", "--baseline", "pre_ln"]) == 2
    err = capsys.readouterr().err
    assert "family 'post_lnx': no family fits" in err and "norm.placement=post norm.kind=layernorm" in err


def test_a_csv_with_the_wrong_columns_is_one_line_naming_the_file_and_the_columns(capsys, tmp_path):
    summary = tmp_path / "summary.csv"  # a report's other CSV, given by mistake: no family, no lrs
    summary.write_text("variant,seed,per\npre_ln,0,0.2\n")
    assert seeds_needed.main([str(summary), "--family", "post_ln", "--baseline", "pre_ln"]) == 2
    assert capsys.readouterr().err == (f"seeds_needed: error: {summary}: missing column(s) family, lrs; expected family, "
                                       f"seed, lrs (the file has variant, seed, per)\n")  # fmt: skip
