"""``validate`` warns where long prompts rest on a profile that ignores prefill compute (issue: physics)."""

from __future__ import annotations

from fleetopt.optimizer import api


def test_calibrated_units_on_long_contexts_are_flagged(repo_root):
    inst = api.load(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml")  # A100 / H100 seed units, 64K windows
    warnings = api.summarize_instance(inst)["warnings"]
    assert len(warnings) == len(inst.gpus) == 2
    assert all("ignores prefill compute" in w and "65,536" in w for w in warnings)


def test_a_measured_profile_and_short_windows_are_not(repo_root):
    fitted = api.load(repo_root / "instances" / "h100_8b_fitted.yaml")
    assert fitted.gpus[0].profile.prefill_a_s > 0
    assert api.summarize_instance(fitted)["warnings"] == []
    short = api.load(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml", ["pools.max_context=8192"])
    assert api.summarize_instance(short)["warnings"] == []
