"""The flags end at the entry point: `hybrid.train.args.run_config` reads the argparse Namespace and returns one
frozen `RunConfig` (hybrid/train/config.py) whose every part -- the layout, the model, each feature's config -- is a
frozen dataclass whose docstring names each of its fields; the Namespace it was given is left as it was (the
checks work on a copy), and no Namespace travels into the run."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json

import pytest

from hybrid.train.args import parse_args, run_config
from hybrid.train.config import RunConfig

ARGVS = {
    "defaults": ([], 1),
    "layout + zero + bf16": (["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                              "--zero-stage", "3", "--bf16", "--global-batch-size", "8"], 8),
    "moe": (["--model", "tiny-mixtral", "--expert-model-parallel-size", "2"], 2),
    "context parallel": (["--model", "tiny-llama", "--context-parallel-size", "2"], 2),
}


def _configs(obj, path: str = "run"):
    """(path, dataclass instance) for `obj` and every dataclass of hybrid's (hybrid/, models/) reachable through its
    fields and sequences. A foreign object a config carries is not walked: ModelConfig.hf caches the transformers
    config of a preset once something asked for it (a transformers dataclass, not ours to freeze)."""
    if type(obj).__module__.split(".")[0] not in ("hybrid", "models") and not isinstance(obj, (list, tuple, dict)):
        assert not isinstance(obj, argparse.Namespace), f"{path} is an argparse Namespace"
        return
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        yield path, obj
        for f in dataclasses.fields(obj):
            yield from _configs(getattr(obj, f.name), f"{path}.{f.name}")
    elif isinstance(obj, (list, tuple)):
        for i, x in enumerate(obj):
            yield from _configs(x, f"{path}[{i}]")
    elif isinstance(obj, dict):
        for k, x in obj.items():
            yield from _configs(x, f"{path}[{k!r}]")
    else:
        assert not isinstance(obj, argparse.Namespace), f"{path} is an argparse Namespace"


def _run(case: str, tmp_path) -> tuple[RunConfig, dict, argparse.Namespace]:
    argv, world = ARGVS[case]
    ds = tmp_path / "ds.json"  # a DeepSpeed config too: its keys are applied to the checks' copy, never the caller's
    ds.write_text(json.dumps({"gradient_clipping": 1.0}))
    args = parse_args(argv + ["--deepspeed-config", str(ds)])
    before = copy.deepcopy(vars(args))
    return run_config(args, world=world), before, args


@pytest.mark.parametrize("case", list(ARGVS))
def test_run_config_leaves_the_namespace_as_it_was(case, tmp_path):
    run, before, args = _run(case, tmp_path)
    assert vars(args) == before
    assert run.optimizer is not None and dict(run.flags)["deepspeed_config"] is not None


@pytest.mark.parametrize("case", list(ARGVS))
def test_every_part_of_the_run_config_is_frozen_and_documents_its_fields(case, tmp_path):
    run, _, _ = _run(case, tmp_path)
    seen = {type(c): p for p, c in _configs(run)}
    assert len(seen) >= 12, sorted(t.__name__ for t in seen)
    for t, path in seen.items():
        assert t.__dataclass_params__.frozen, f"{path}: {t.__module__}.{t.__name__} is not frozen"
        missing = [f.name for f in dataclasses.fields(t) if f.name not in (t.__doc__ or "")]
        assert not missing, f"{t.__module__}.{t.__name__}: no docstring line for {missing}"
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.training = None
    if case == "moe":
        assert run.moe is not None and type(run.moe) in seen
