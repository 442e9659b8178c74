"""Round 13's mutation pass (the rest of round 11's prepared queue, mutation6's .mut/, re-anchored on HEAD): each
test here kills a mutant that the fast tier let live, shown failing on the mutant and passing on HEAD. In-process, no
process group, < 1 s each.

The mutation ids (L19, ...) are those of the queue's modules; the report of branch mutation13 lists them all."""

from __future__ import annotations

import torch


# --- L19: ZeRO-1/2's step all-gathers parameters at the parameter width, not the gradient width ----------------------
def test_zero_step_ledger_moves_gradients_at_grad_bytes_and_parameters_at_param_bytes():
    """After the last backward ZeRO-1 reduce-scatters the gradients (Workload.grad_bytes: 4 under --fp32-grads) and
    all-gathers the updated bf16 parameters (param_bytes: 2); ZeRO-2 only all-gathers. The mutant pricing the
    all-gather at grad_bytes doubled it under --fp32-grads; every test called the ledger with the defaults, where
    the two widths are equal."""
    from hybrid.planner import ZeroStage
    from hybrid.planner.predicted_comm import dp_step_ledger
    psi = 1000  # parameters on the rank: one bucket
    one = dp_step_ledger(psi, ZeroStage.OPTIMIZER, 4, grad_bytes=4, param_bytes=2)
    assert one == {"all_gather@dp": {"calls": 1, "bytes": 2 * psi}, "reduce_scatter@dp": {"calls": 1, "bytes": 4 * psi}}
    assert dp_step_ledger(psi, ZeroStage.GRADIENTS, 4, 4, 2) == {"all_gather@dp": {"calls": 1, "bytes": 2 * psi}}
    assert dp_step_ledger(psi, ZeroStage.NONE, 4, 4, 2) == {"all_reduce@dp": {"calls": 1, "bytes": 4 * psi}}


# --- PP4: per pair of ranks, receives are posted in the sender's order -------------------------------------------
def test_receives_of_one_sender_are_moved_earlier_into_its_send_order():
    """schedules._in_sender_order gives each receive the smallest gap of it and the later sends of the same pair
    (suffix minimum): the receiver then posts them in send order, as NCCL matches point-to-point messages. No
    schedule built today (every kind, pp 2-8, v 1-3, m 1-24: compared action for action) places a later send's
    receive earlier, so the mutant that kept each receive's own gap built the same lists and lived; a placement
    that needs the reorder must still get it. Two sends of rank 0 to rank 1, the second's receive placed first."""
    from hybrid.pipeline.schedules import Action, Op, _in_sender_order, _Message, _rank_list
    first = _Message(Action(Op.SEND_ACT, 0, peer=1), Action(Op.RECV_ACT, 0, peer=0), sender=0, producer=0, gap=3)
    second = _Message(Action(Op.SEND_ACT, 1, peer=1), Action(Op.RECV_ACT, 1, peer=0), sender=0, producer=1, gap=1)
    placed = {m.producer: m.gap for m in _in_sender_order([second, first])}
    assert placed == {0: 1, 1: 1}  # the first send's receive moved up to the second's batch
    order = [Action(Op.FORWARD, i) for i in range(3)]
    got = [a for a in _rank_list(1, order, _in_sender_order([second, first])) if a.op is Op.RECV_ACT]
    assert [a.microbatch for a in got] == [0, 1]  # posted in send order


# --- TP8: gather_from_tp's backward keeps this rank's slice of the gradient -----------------------------------------
class _PairTP:
    """Rank 1 of a 2-rank TP group without processes: all_gather puts a stand-in for rank 0's piece first."""
    name, size, rank = "tp", 2, 1

    def all_gather(self, x, dim):
        return torch.cat([torch.full_like(x, -1.0), x], dim=dim)


def test_gather_from_tp_backward_gives_each_rank_the_gradient_of_its_own_columns():
    """ColumnParallelLinear(gather_output=True) all-gathers Y = [Y_0, Y_1] along the hidden dim; the gradient of
    rank i's Y_i is dY[..., i C/t:(i + 1) C/t]. No model gathers its output (every column layer feeds a row layer),
    so the fast tier never ran this backward: the mutant handing every rank rank 0's slice lived."""
    from hybrid.tp.mappings import gather_from_tp
    x = torch.randn(2, 3, 4, requires_grad=True)  # (B, T, C/t) on rank 1
    y = gather_from_tp(x, _PairTP())  # (B, T, C)
    assert torch.equal(y[..., 4:], x)
    dy = torch.randn(2, 3, 8)
    y.backward(dy)
    assert torch.equal(x.grad, dy[..., 4:])


# --- FT2, FT4: the guard names the first non-finite gradient in model order, with any optimizer -------------------
def test_nan_guard_names_the_first_bad_gradient_in_model_order_for_a_plain_optimizer():
    """NanGuard.first_non_finite: a ZeRO optimizer's flat shards are checked at once, and anything else (no flat
    units: a plain torch optimizer) parameter by parameter -- `_all_finite` says False when it has
    no shards, so the caller looks closer. The mutant saying True there let a plain optimizer's NaN gradients
    through as finite (FT4). The mutant naming the last bad parameter instead of the first lived too (FT2): the
    fault hook writes NaN into the first parameter's gradient only, so min and max agree. Here two gradients go
    bad, and the optimizer holds the parameters in reverse model order."""
    from torch import nn

    from hybrid.fault.nan_guard import NanGuard
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))  # model order: 0.weight, 0.bias, 1.weight, 1.bias
    opt = torch.optim.SGD(list(model.parameters())[::-1], lr=0.1)  # the optimizer's order reversed
    guard = NanGuard(None, model, max_skipped=3)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    assert guard.first_non_finite(torch.tensor(1.0), opt) is None
    model[1].weight.grad[0, 0] = float("nan")
    model[0].bias.grad[1] = float("inf")
    assert guard.first_non_finite(torch.tensor(1.0), opt) == "gradient of 0.bias"
    assert guard.first_non_finite(torch.tensor(float("nan")), opt) == "loss"


# --- FT8: a peer inside the stuck op whose heartbeat is older than the threshold is named as stopped ---------------
def _hb_state(rank, seq, t, pending=()):
    """A rank's published watchdog state (hybrid/fault/watchdog.py), as tests/test_fault_hang.py builds it."""
    return {"rank": rank, "t": t, "iteration": 5, "microbatch": 1, "phase": "backward", "idle": 9.0, "seq": seq,
            "done": {}, "p2p": {}, "pending": list(pending)}


def test_hang_verdict_names_an_arrived_peer_whose_heartbeat_is_just_past_the_threshold():
    """verdict(): the peers that did start the stuck op but stopped heart-beating more than `stale_after` ago are
    named after the missing ones (a rank that died inside the collective). The mutant waiting for twice the
    threshold lived: the fast verdict tests have no arrived-but-silent peer, and the SIGSTOP job's stopped rank
    is the missing one. Rank 1 arrived, silent 4 s (> 3 s); rank 3 arrived, beating; rank 2 never arrived."""
    from hybrid.fault.watchdog import verdict
    ar = {"group": "dp", "ranks": [0, 1, 2, 3], "op": "all_reduce", "seq": 4, "iteration": 5, "microbatch": 1,
          "phase": "backward", "p2p": [], "started": 91.0}
    states = {0: _hb_state(0, {"dp": 4}, 100.0, [ar]), 1: _hb_state(1, {"dp": 4}, 96.0),
              2: _hb_state(2, {"dp": 3}, 99.5), 3: _hb_state(3, {"dp": 4}, 99.5)}
    line = verdict(0, states, now=100.0, stale_after=3.0)
    assert "; not arrived: rank 2 (" in line, line
    assert line.split("; stopped heart-beating: ")[1].startswith("rank 1 (no heartbeat for 4.0s"), line
    assert "rank 3" not in line, line


# --- MT2, MT4, MT7: the metrics file's consumed samples, memory peak over ranks and evaluation splits ----------------
def test_metrics_record_consumed_samples_the_highest_ranks_peak_and_the_test_split(tmp_path, monkeypatch):
    """RunMetrics.log_interval writes Megatron's consumed_samples (iteration x global batch: the samples the
    iterations so far consumed) and the memory peak as the max over ranks beside the per-rank list; write_eval
    files the final 'test set' loss under 'lm loss test'. The mutant writing (iteration - 1) G lived the fast
    tests of test_data_metrics, test_plot_run and test_step_split (MT2); with one rank, peaks[0] is the max (MT7);
    a run without the final evaluation has no test split (MT4). Two ranks' peaks stand in for the gather; the records are read back from the
    JSON-lines file."""
    import json
    from types import SimpleNamespace

    from hybrid.metrics import loop as metrics_loop
    from hybrid.metrics.peak_memory import CPU_MEASURE
    from hybrid.metrics.writer import MetricsWriter
    from models import load_config
    monkeypatch.setattr(metrics_loop, "gather_peaks", lambda device, group: [10, 30])  # rank 1 peaks higher
    path = tmp_path / "metrics.jsonl"
    m = metrics_loop.RunMetrics(load_config("tiny-gpt2"), 32, 4, 2, "none", None, None, 10, torch.device("cpu"),
                                CPU_MEASURE, MetricsWriter(None, str(path), True))
    line = m.log_interval(3, 0.5, 2.0, 1e-4, SimpleNamespace(grad_norm=1.0, loss_scale=None), 0)
    m.write_eval(10, {"validation set": 2.0, "test set": 3.0})
    m.close()
    step, final = (json.loads(x) for x in path.read_text().splitlines())
    assert step["iteration"] == 3 and step["consumed_samples"] == 12 and " | consumed samples 12 | " in line
    assert step[CPU_MEASURE.key] == 30 and step[CPU_MEASURE.key + "_per_rank"] == [10, 30]
    assert final["lm loss validation"] == 2.0 and final["lm loss test"] == 3.0, final


# --- N8, N9 (round 12's OneLineParser): --flag=value is a known flag; a prefix is never expanded --------------------
def test_one_line_parser_takes_flag_equals_value_and_refuses_a_prefix_above_its_sub_commands(capsys):
    """parse_known_args refuses unknown --flags by the name before '=' (`--lr=0.1` is --lr; the mutant comparing the
    whole token refused it), and allow_abbrev=False keeps argparse from expanding `--verb` to `--verbose` where that
    check is skipped: a parser with sub-commands (the mutant allowing abbreviations took `--verb` there). The input
    tests give every value as a separate word and no top-level flag beside a sub-command."""
    import pytest

    from hybrid.cliutil import OneLineParser
    p = OneLineParser(prog="x")
    p.add_argument("--lr", type=float)
    assert p.parse_args(["--lr=0.1"]).lr == 0.1
    top = OneLineParser(prog="hybrid")
    top.add_argument("--verbose", action="store_true")
    top.add_subparsers(dest="cmd").add_parser("models")
    assert top.parse_args(["--verbose", "models"]).verbose
    with pytest.raises(SystemExit):
        top.parse_args(["--verb", "models"])
    assert "error: unrecognized arguments: --verb" in capsys.readouterr().err  # named, not taken as --verbose
