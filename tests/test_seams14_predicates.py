"""One set of input predicates (hybrid/cliutil.py: is_integer, is_finite, in_range, check_number) behind the typed
configs, and every config's int and float fields refusing a bool, a NaN and an infinity.

The field test reads each config's fields from the dataclass itself, so a field added later is covered without a
new line here; a config class added later is caught by the static test at the bottom, which asks that every
dataclass under hybrid/ that validates its input in __post_init__ is listed below (or exempt, with the reason)."""

from __future__ import annotations

import ast
import dataclasses
import functools
import glob
import math
import os

import pytest

from hybrid.cliutil import check_number, in_range, is_finite, is_integer, number_kind


# --- the predicates -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value, integer, finite", [
    (3, True, True), (0, True, True), (-2, True, True), (10**400, True, True),  # an int is finite however large
    (True, False, False), (False, False, False),  # a bool is neither: True is an int to Python only
    (2.0, False, True), (1e308, False, True), (math.nan, False, False), (math.inf, False, False),
    (-math.inf, False, False), ("3", False, False), (None, False, False),
])
def test_is_integer_and_is_finite_refuse_bools_nan_and_infinity(value, integer, finite):
    assert is_integer(value) is integer
    assert is_finite(value) is finite


@pytest.mark.parametrize("value, low, high, low_open, high_open, inside", [
    (0, 0, None, False, False, True), (0, 0, None, True, False, False), (1, 0, 1, False, False, True),
    (1, 0, 1, False, True, False), (-1, 0, None, False, False, False), (5, None, 4, False, False, False),
    (5, None, None, False, False, True),
])
def test_in_range_takes_open_and_closed_ends(value, low, high, low_open, high_open, inside):
    assert in_range(value, low, high, low_open, high_open) is inside


@pytest.mark.parametrize("kwargs, kind", [
    ({"integer": True, "low": 1}, "a positive integer"), ({"integer": True, "low": 0}, "an integer >= 0"),
    ({"integer": True}, "an integer"), ({}, "a finite number"), ({"low": 0, "low_open": True}, "a finite number > 0"),
    ({"low": 0, "high": 1, "high_open": True}, "a finite number in [0, 1)"),
    ({"low": 0, "high": 1, "low_open": True}, "a finite number in (0, 1]"),
])
def test_number_kind_says_the_type_and_range_in_words(kwargs, kind):
    assert number_kind(**kwargs) == kind


def test_check_number_is_one_line_naming_the_field_the_range_and_the_value():
    with pytest.raises(ValueError) as e:
        check_number("--gpus", True, 1, integer=True)
    assert str(e.value) == "--gpus must be a positive integer, got True"
    with pytest.raises(ValueError) as e:  # as a JSON file wrote it
        check_number("gpu.hbm_tbps", math.nan, 0, low_open=True, show=lambda v: "NaN")
    assert str(e.value) == "gpu.hbm_tbps must be a finite number > 0, got NaN"
    with pytest.raises(ValueError) as e:
        check_number("--simulated-dp-bandwidth", -1.0, 0, note=" (GB/s; 0: off)")
    assert str(e.value) == "--simulated-dp-bandwidth must be a finite number >= 0 (GB/s; 0: off), got -1.0"
    check_number("--lr", 0, 0)  # an int where a float is asked for is a number
    check_number("n", 10**400, 1, integer=True)  # no OverflowError from math.isfinite


# --- every typed config's int and float fields ----------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _configs() -> dict:
    """One valid instance of each typed config that validates its fields (dataclasses.replace re-runs
    __post_init__ on a copy with one field changed)."""
    from hybrid.compress.powersgd import PowerSGDConfig
    from hybrid.data.text import BatchSpec
    from hybrid.generate.decode import SamplingConfig
    from hybrid.mesh import ParallelDims
    from hybrid.moe.parallel import ExpertLayout
    from hybrid.pipeline.simulate import Costs
    from hybrid.planner.calibrate import CalibrationConfig
    from hybrid.planner.hardware import hardware
    from hybrid.planner.layout import Cluster, Layout, Workload
    from hybrid.planner.slowlink import Method, MethodConfig, SlowLink
    from hybrid.train_step import OptimizerConfig
    from hybrid.zero.config import ZeroConfig
    from models.config import load_config
    return {c.__class__.__name__: c for c in (
        OptimizerConfig(), ZeroConfig(), ParallelDims(), Layout(), Cluster(8, hardware("a100-80g")),
        Workload(load_config("tiny-gpt2"), global_batch=8, seq_length=32,
                 fp32_grads=False), MethodConfig(Method.STREAMING, fragments=2),
        SlowLink(1.0), ExpertLayout(ParallelDims(dp=2)), CalibrationConfig(), Costs(),
        SamplingConfig(temperature=1.0), PowerSGDConfig(rank=2), BatchSpec(8, 1, 32, 2),
        hardware("cpu").with_overrides(compute_units=2, memory_bytes=64e9, elementwise_tbps=0.05, fp8_tflops=1.0,
                                       flash_efficiency=0.5, inter_dc_gbps=1.0, inter_dc_latency_s=0.01))}


# dataclasses whose __post_init__ raises ValueError but are not in _configs(), and why
EXEMPT = {
    "Shard": "the planner's shard of a checked Layout",
    "GPTSamples": "built from a checked BatchSpec and an indexed dataset",
}
# what each field's type must refuse: a bool for an int (True is 1 to Python), a float for an int, NaN and the
# infinities for a float (NaN fails no `< low` test, inf passes every `>= low` one), and a bool for a float
BAD = {"int": (True, False, 2.5), "float": (math.nan, math.inf, -math.inf, True)}


def _number_fields(config) -> list[tuple[str, str]]:
    """(field, "int" or "float") for each field annotated int, float, or either `| None`."""
    out = []
    for f in dataclasses.fields(config):
        kind = (f.type if isinstance(f.type, str) else f.type.__name__).split(" | ")[0]
        if kind in BAD:
            out.append((f.name, kind))
    return out


def _cases() -> list:
    return [pytest.param(name, field, bad, id=f"{name}.{field}={bad!r}")
            for name, config in _configs().items() for field, kind in _number_fields(config) for bad in BAD[kind]]


@pytest.mark.parametrize("name, field, bad", _cases())
def test_every_config_field_refuses_a_bool_for_a_number_nan_and_infinity(name, field, bad):
    config = _configs()[name]
    with pytest.raises(ValueError) as e:
        dataclasses.replace(config, **{field: bad})
    message = str(e.value)
    assert "\n" not in message and str(bad).lower() in message.lower(), message  # one line, naming the value


def test_the_field_test_covers_each_config_and_its_number_fields():
    """A config whose fields were all left out (a renamed annotation style, say) would make the test above vacuous."""
    configs = _configs()
    assert all(_number_fields(c) for c in configs.values()), [n for n, c in configs.items() if not _number_fields(c)]
    assert len(_cases()) > 100


def _validating_dataclasses() -> set[str]:
    """Names of the dataclasses under hybrid/ whose __post_init__ raises ValueError (read statically)."""
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hybrid")
    names = set()
    for path in glob.glob(os.path.join(root, "**", "*.py"), recursive=True):
        with open(path) as f:
            tree = ast.parse(f.read())
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            if not any("dataclass" in ast.unparse(d) for d in cls.decorator_list):
                continue
            post = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__post_init__"]
            if post and ("ValueError" in ast.unparse(post[0]) or "check_number" in ast.unparse(post[0])):
                names.add(cls.name)
    return names


def test_every_validating_dataclass_is_in_the_field_test_or_exempt_with_a_reason():
    """A new typed config that checks its input is added to _configs() (its fields then checked automatically) or to
    EXEMPT with the reason; an exempt name that no longer exists is dropped."""
    found = _validating_dataclasses()
    covered = set(_configs())
    assert not found - covered - set(EXEMPT), f"add to _configs() or EXEMPT: {sorted(found - covered - set(EXEMPT))}"
    assert not set(EXEMPT) - found, f"stale in EXEMPT: {sorted(set(EXEMPT) - found)}"
    assert covered <= found, f"in _configs() but not validating: {sorted(covered - found)}"


# --- the scripts' --out check ---------------------------------------------------------------------------------------
def test_check_out_skips_a_flag_not_given_and_refuses_an_empty_name(one_line, tmp_path):
    """bench_tp.py, bench_pipeline.py, plot_schedule.py and bench_checkpoint.py call the parser's check_out in place of
    their own try / check_output_file / p.error: None (no --out) is skipped; `--out ""` (an unset shell variable) is
    the one line check_output_file gives, not a report written nowhere."""
    from hybrid.cliutil import OneLineParser
    p = OneLineParser(prog="bench_x.py")
    p.check_out("--out", None)
    p.check_out("--out", str(tmp_path / "table.md"))
    assert one_line(lambda: p.check_out("--out", "")) == "bench_x.py: error: --out: give a file name"
    assert one_line(lambda: p.check_out("--out", str(tmp_path))) == \
        f"bench_x.py: error: --out {str(tmp_path)!r} is a directory; give a file name"
