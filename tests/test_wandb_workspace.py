"""scripts/wandb_workspace.py builds the sweep's W&B workspace offline (never saved here: no network)."""

import json

import pytest

from reporting.wandb_workspace import build_workspace
from runlog.tasks import TASKS, write_task
from scripts.wandb_workspace import main


@pytest.fixture(scope="module")
def workspace():
    return build_workspace("my-team", "normlab", "sweep-42", n_enc_layers=2, n_dec_layers=3, task=TASKS["g2p"])


def panel_metrics(section) -> list[list[str]]:
    return [list(getattr(p, "y", None) or p.metrics) for p in section.panels]


def test_sections_and_panels(workspace) -> None:
    assert (workspace.entity, workspace.project) == ("my-team", "normlab")
    sections = {s.name: s for s in workspace.sections}
    stability = ["Attention max logit per block", "Spectral norm per block", "Output logits and optimizer state"]
    g2p = "PER / WER / 1-ref PER / 1-ref WER"  # closest-reference, then first-reference scores (data/metrics.py)
    assert list(sections) == ["Loss", g2p, "Residual RMS per block", "Gradient norm per block", *stability]
    assert panel_metrics(sections["Loss"]) == [["train/loss"], ["val/loss"]]
    tests = ["test/per", "test/wer", "test/per_1ref", "test/wer_1ref"]
    assert panel_metrics(sections[g2p]) == [["val/per"], ["val/wer"], ["val/per_1ref"], ["val/wer_1ref"], tests]
    blocks = ["enc.0", "enc.1", "dec.0", "dec.1", "dec.2"]
    assert panel_metrics(sections["Residual RMS per block"]) == [[f"act/{b}.out/rms"] for b in blocks]
    assert panel_metrics(sections["Gradient norm per block"]) == [[f"grad/{b}/norm"] for b in blocks]
    assert all(p.log_y for p in sections["Residual RMS per block"].panels)


def test_stability_sections(workspace) -> None:
    sections = {s.name: s for s in workspace.sections}
    attn = [["attn/enc.0.self_attn/max_logit"], ["attn/enc.1.self_attn/max_logit"]]
    attn += [[f"attn/dec.{i}.self_attn/max_logit", f"attn/dec.{i}.cross_attn/max_logit"] for i in range(3)]
    assert panel_metrics(sections["Attention max logit per block"]) == attn
    assert [p.title for p in sections["Attention max logit per block"].panels][:3] == [
        "enc.0 attention max logit", "enc.1 attention max logit", "dec.0 attention max logit"]  # fmt: skip
    spectra = panel_metrics(sections["Spectral norm per block"])
    # the gate's matrix too (model.attn_gate): a series a run without a gate leaves empty, as the QK-Clip panels
    enc = ["self_attn.q", "self_attn.k", "self_attn.v", "self_attn.out", "self_attn.gate", "ffn.in", "ffn.out"]
    dec = [*enc[:5], "cross_attn.q", "cross_attn.k", "cross_attn.v", "cross_attn.out", "cross_attn.gate", *enc[5:]]
    assert spectra[1] == [f"weight/enc.1.{m}/sigma_max" for m in enc]  # no cross-attention in an encoder block
    assert spectra[4] == [f"weight/dec.2.{m}/sigma_max" for m in dec] and len(spectra) == 5
    assert all(p.log_y for p in sections["Spectral norm per block"].panels)
    assert panel_metrics(sections["Output logits and optimizer state"]) == [
        ["out/logz"],
        ["out/max_logit"],
        ["optim/below_eps"],
        ["optim/qk_clip_count"],
        ["optim/qk_clip_min_factor"],
    ]
    assert all(p.groupby_aggfunc == "mean" and p.groupby_rangefunc == "minmax" for s in workspace.sections for p in s.panels)


def test_runset_filtered_to_group_and_grouped_by_norm(workspace) -> None:
    runset = workspace.runset_settings
    assert [g.name for g in runset.groupby] == ["norm.placement", "norm.kind", "norm.impl"]
    # the view W&B would receive: group filter on the run's group, nested config keys for grouping
    view = json.dumps(workspace._to_model().model_dump(by_alias=True, exclude_none=True))
    assert '{"key": {"section": "run", "name": "group"}, "op": "=", "value": "sweep-42"' in view
    assert (
        '"grouping": [{"section": "config", "name": "norm.value.placement"}, {"section": "config", "name": "norm.value.kind"}, '
        '{"section": "config", "name": "norm.value.impl"}]' in view
    )


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        build_workspace("e", "p", "", 2, 2, TASKS["g2p"])
    with pytest.raises(ValueError, match=">= 0"):
        build_workspace("e", "p", "g", -1, 2, TASKS["g2p"])


def test_main_without_save_prints_outline(capsys: pytest.CaptureFixture) -> None:
    assert main(["--entity", "e", "--project", "p", "--group", "g", "--n-enc-layers", "1", "--n-dec-layers", "1"]) == 0
    out = capsys.readouterr().out
    assert "normlab sweep g: e/p" in out and "Residual RMS per block (2): enc.0 out RMS, dec.0 out RMS" in out


def rms_panels(out: str) -> str:
    return next(line for line in out.splitlines() if line.strip().startswith("Residual RMS per block"))


def test_layer_counts_come_from_a_runs_config(tmp_path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "sweep" / "norm=pre_ln,seed=0"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("model:\n  n_enc_layers: 2\n  n_dec_layers: 4\n")
    (run / "status.json").write_text("{}")
    assert main(["--entity", "e", "--project", "p", "--group", "g", "--run-dir", str(tmp_path / "sweep")]) == 0
    assert rms_panels(capsys.readouterr().out) == (
        "  Residual RMS per block (6): enc.0 out RMS, enc.1 out RMS, dec.0 out RMS, dec.1 out RMS, dec.2 out RMS, dec.3 out RMS"
    )
    assert main(["--entity", "e", "--project", "p", "--group", "g", "--run-dir", str(run), "--n-dec-layers", "1"]) == 0
    assert rms_panels(capsys.readouterr().out).startswith("  Residual RMS per block (3): ")  # the flag overrides the config
    assert main(["--entity", "e", "--project", "p", "--group", "g"]) == 0  # no run: the default config's model (small: 3+3)
    assert rms_panels(capsys.readouterr().out).startswith("  Residual RMS per block (6): enc.0 out RMS, enc.1 out RMS, enc.2")
    assert main(["--entity", "e", "--project", "p", "--group", "g", "--run-dir", str(tmp_path / "none")]) == 1
    assert capsys.readouterr().err == f"wandb_workspace: error: no such directory: {str(tmp_path / 'none')!r}\n"


def task_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.strip().startswith(("PER", "BLEU")))


def test_the_task_section_comes_from_the_runs_task_json(tmp_path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model:\n  n_enc_layers: 1\n  n_dec_layers: 1\n")
    (run / "status.json").write_text("{}")
    assert main(["--entity", "e", "--project", "p", "--group", "g", "--run-dir", str(run)]) == 0
    vals, tests = "val/per, val/wer, val/per_1ref, val/wer_1ref", "test/per and test/wer and test/per_1ref and test/wer_1ref"
    assert task_line(capsys.readouterr().out) == f"  PER / WER / 1-ref PER / 1-ref WER (5): {vals}, {tests}"  # no task.json: G2P
    write_task(run, TASKS["translation"])
    assert main(["--entity", "e", "--project", "p", "--group", "g", "--run-dir", str(run)]) == 0
    assert task_line(capsys.readouterr().out) == "  BLEU / chrF (3): val/bleu, val/chrf, test/bleu and test/chrf"
