"""Round 15's new-user pass, the flags of other tools: each now gets where its setting lives here, not a near
spelling that misleads nor "see --help" -- and `hybrid checkpoint inspect` answers for the layouts it could not ask
about.

1. train.py: DeepSpeed-Ulysses' --sequence-parallel-size got "did you mean --sequence-parallel?" (Megatron's TP
   sequence parallelism, another thing); Megatron-DeepSpeed's --moe-expert-parallel-size got "did you mean
   --context-parallel-size?"; Megatron-core's MoE router flags (--moe-layer-freq, --moe-router-pre-softmax, ...)
   said only "see --help".
2. hybrid convert --target-expert-parallel-size (Megatron's MoE saver flag) got "did you mean
   --target-pipeline-parallel-size?"; hybrid generate's transformers-style flags (--max-length, --do-sample,
   --num-beams) and --iteration said "see --help".
3. hybrid checkpoint inspect had no --context-parallel-size (its own help says dp = world / (tp x cp x pp)) and no
   --expert-model-parallel-size: an MoE checkpoint's "can it load at ep 3?" got "did you mean
   --pipeline-model-parallel-size?". Both now asked with the trainer's rules, in train.py's words.

In this process (conftest's `one_line`); nothing is trained or loaded."""

from __future__ import annotations

import pytest

from hybrid.checkpoint.inspect import Target, loadable_at
from hybrid.cli import main as hybrid_main
from hybrid.testing_inputs import python_environment
from hybrid.train.main import validate

pytestmark = pytest.mark.usefixtures("one_process")


# --- 1. train.py --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flag, hint", [
    ("--sequence-parallel-size", "--context-parallel-size N --cp-comm-type a2a"),
    ("--ds-sequence-parallel-size", "--context-parallel-size N --cp-comm-type a2a"),
    ("--ulysses-degree", "--context-parallel-size N --cp-comm-type a2a"),
    ("--moe-expert-parallel-size", "train.py's flag is --expert-model-parallel-size"),
    ("--ep-size", "train.py's flag is --expert-model-parallel-size"),
    ("--moe-layer-freq", "write decoder_sparse_step / mlp_only_layers (Qwen2-MoE"),
    ("--moe-router-pre-softmax", "the router's softmax order is the model's"),
    ("--moe-router-dtype", "the routing math already runs in fp32"),
    ("--moe-router-topk-scaling-factor", "not implemented"),
    ("--moe-input-jitter-eps", "router input jitter is not implemented"),
    ("--moe-token-drop-policy", "dropped by lowest probability"),
    ("--moe-router-num-groups", "group-limited routing"),
    ("--moe-router-group-topk", "group-limited routing"),
])
def test_train_other_tools_flags_name_where_their_setting_lives(flag, hint, one_line):
    line = one_line(lambda: validate(["--model", "tiny-mixtral", flag, "2"]))
    assert line.startswith(f"train.py: error: unrecognized arguments: {flag}; {flag}: ") and hint in line, line
    assert "did you mean" not in line and "see --help" not in line


def test_train_megatron_sequence_parallel_itself_is_still_taken(monkeypatch):
    """The hint is for the unknown spelling only: --sequence-parallel at tp 2 runs as before."""
    python_environment(monkeypatch, world=2)
    with pytest.raises(SystemExit, match="RANK is not set"):  # every check passed; the launch check is last
        validate(["--model", "tiny-llama", "--tensor-model-parallel-size", "2", "--sequence-parallel",
                  "--micro-batch-size", "1", "--global-batch-size", "1"])


# --- 2. hybrid convert and hybrid generate ---------------------------------------------------------------------------
@pytest.mark.parametrize("flag", ["--target-expert-parallel-size", "--target-expert-model-parallel-size"])
def test_convert_target_ep_says_experts_are_split_on_load(flag, tmp_path, one_line):
    line = one_line(lambda: hybrid_main(["convert", str(tmp_path / "src"), str(tmp_path / "dst"), flag, "2"]))
    assert line.startswith(f"hybrid convert: error: unrecognized arguments: {flag}; {flag}: experts are stored "
                           f"whole and train.py's --load splits them over any --expert-model-parallel-size")
    assert "did you mean" not in line


@pytest.mark.parametrize("argv, hint", [
    (["--max-length", "10"], "give --max-new-tokens N"),
    (["--do-sample"], "give --temperature T > 0 to sample"),
    (["--num-beams", "4"], "beam search is not implemented"),
    (["--num-return-sequences", "2"], "another --seed"),
    (["--repetition-penalty", "1.2"], "not implemented"),
    (["--iteration", "2"], "give SRC as the checkpoint's iter_NNNNNNN directory"),
])
def test_generate_transformers_style_flags_name_what_to_give(argv, hint, tmp_path, one_line):
    line = one_line(lambda: hybrid_main(["generate", str(tmp_path), "--prompt", "Hi"] + argv))
    assert line.startswith("hybrid generate: error: unrecognized arguments: ") and hint in line, line
    assert "see --help" not in line and "did you mean" not in line


# --- 3. hybrid checkpoint inspect: cp and ep ---------------------------------------------------------------------------
def _train_line(world: int, argv: list[str], monkeypatch) -> str:
    """train.py's own verdict on the layout: its line, without the prefix."""
    python_environment(monkeypatch, world=world)
    with pytest.raises(SystemExit) as e:
        validate(argv + ["--micro-batch-size", "1", "--global-batch-size", str(world)])
    return str(e.value.code).removeprefix("train.py: error: ")


@pytest.mark.parametrize("model, world, cp, ep", [
    ("tiny-mixtral", 6, 1, 3),    # 3 ranks of experts do not divide 8 experts
    ("tiny-mixtral", 4, 1, 3),    # nor 3 the 4 ranks of the stage
    ("tiny-mixtral", 4, 2, 8),    # EP 8 does not divide the stage's cp 2 x dp 2 ranks
    ("tiny-gpt2", 4, 1, 2),       # EP for a dense model
    ("tiny-gpt2", 4, 3, 1),       # CP not dividing the world
])
def test_inspect_cp_and_ep_refused_as_train_py_refuses_them(model, world, cp, ep, monkeypatch):
    ok, why = loadable_at({"model": model}, Target(1, 1, world, cp, ep))
    flags = ["--model", model, "--context-parallel-size", str(cp), "--expert-model-parallel-size", str(ep)]
    assert not ok and why == _train_line(world, flags, monkeypatch)


@pytest.mark.parametrize("model, world, cp, ep, dp", [("tiny-mixtral", 4, 1, 4, 4), ("tiny-gpt2", 4, 2, 1, 2),
                                                      ("tiny-mixtral", 8, 1, 2, 8), ("tiny-mixtral", 4, 2, 2, 2),
                                                      ("tiny-mixtral", 8, 2, 4, 4)])
def test_inspect_cp_and_ep_train_py_takes_are_loadable_with_their_dp(model, world, cp, ep, dp):
    ok, why = loadable_at({"model": model}, Target(1, 1, world, cp, ep))
    assert ok and why.startswith(f"dp {dp};"), why
    assert Target(1, 1, world, cp, ep).describe() == (f"at tp 1{f' x cp {cp}' if cp > 1 else ''} x pp 1"
                                                      f"{f' (ep {ep})' if ep > 1 else ''} on {world} ranks")


@pytest.mark.parametrize("flag", ["--context-parallel-size", "--expert-model-parallel-size"])
def test_inspect_cp_or_ep_without_a_world_is_one_line(flag, tmp_path, one_line):
    line = one_line(lambda: hybrid_main(["checkpoint", "inspect", str(tmp_path), flag, "2"]))
    assert line == (f"hybrid checkpoint inspect: error: {flag} needs --world-size N (the ranks the run would be "
                    f"launched on)")
