"""Round 15: the hardware profile's fields (`hybrid plan --hardware FILE`, written by `hybrid calibrate`) checked by
Hardware's own rules (hybrid/planner/hardware.py FIELD_RULES, through hybrid/cliutil.py's check_number): a bool, NaN,
an infinity, a negative or an out-of-range value in any numeric field is one line naming the file, the key and the
fix, before the search. (Hardware's dataclass itself is now in tests/test_seams14_predicates.py's field test.)"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from hybrid.cli import main as hybrid_main

pytestmark = pytest.mark.usefixtures("one_process")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = os.path.join(ROOT, "hybrid", "planner", "data", "h200_calibrated.json")
PLAN = ["plan", "--model", "tiny-gpt2", "--gpus", "4", "--global-batch-size", "16", "--seq-length", "128"]


def _profile(tmp_path, key: str, value) -> str:
    with open(SHIPPED, encoding="utf-8") as f:
        profile = json.load(f)
    profile["hardware"][key] = value
    path = tmp_path / "hw.json"
    path.write_text(json.dumps(profile))  # NaN / Infinity written as JSON's extension, as Python's json reads them
    return str(path)


@pytest.mark.parametrize("key, value, kind", [
    ("hbm_tbps", True, "a finite number > 0"),              # a bool was 1.0 TB/s
    ("intra_node_gbps", -5.0, "a finite number > 0"),
    ("gpus_per_node", 2.5, "a positive integer"),
    ("compute_efficiency", 1.5, "a finite number in (0, 1]"),  # took, and failed as "--compute-efficiency" (a flag)
    ("eager_clock", 0, "a finite number in (0, 1]"),
    ("overlap_slowdown", 0.5, "a finite number >= 1"),        # overlap that speeds compute up
    ("kernel_overhead_s", float("nan"), "a finite number >= 0"),
    ("inter_dc_latency_s", float("inf"), "a finite number >= 0"),
    ("intra_latency_s", 0, "a finite number > 0"),             # a measured latency is never 0
    ("compute_units", False, "a positive integer"),
])
def test_a_bad_profile_field_is_one_line_naming_the_file_the_key_and_the_fix(key, value, kind, tmp_path, one_line,
                                                                                monkeypatch):
    import hybrid.planner.cli as plan_cli
    monkeypatch.setattr(plan_cli, "search", lambda *a, **k: pytest.fail("the profile is checked before the search"))
    path = _profile(tmp_path, key, value)
    line = one_line(lambda: hybrid_main(PLAN + ["--hardware", path]))
    assert line == (f"hybrid plan: error: --hardware {path}: hardware.{key} must be {kind}, got {json.dumps(value)}; "
                    f"correct it, or re-run `hybrid calibrate --out {path}`")


def test_every_number_field_of_hardware_has_a_rule():
    """A field added to Hardware without a rule would be checked by nothing (KeyError-free: __post_init__ walks the
    rules, so the field would simply be skipped)."""
    from hybrid.planner.hardware import FIELD_RULES, NULLABLE_FIELDS, Hardware
    names = {f.name for f in dataclasses.fields(Hardware)} - {"name", "flash_rates"}
    assert names == set(FIELD_RULES)
    assert set(NULLABLE_FIELDS) <= names


def test_the_shipped_profiles_and_presets_meet_the_rules():
    from hybrid.planner.calibrate import load_hardware
    from hybrid.planner.hardware import GpuKind, hardware
    assert load_hardware(SHIPPED).peak_tflops > 0
    for kind in GpuKind:
        assert hardware(kind).peak_tflops > 0
