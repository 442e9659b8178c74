"""The planner's price of Streaming DiLoCo's overlap (`--diloco-fragment-sync-delay` tau, hybrid/planner/slowlink.py):
of each fragment's outer sync only max(0, t_fragment - tau x t_inner) stays on the step.

The expectation is built from the planner's parts the overlap does not touch -- the step without its DP term
(search.evaluate), the replica's traffic inside the site and the blocking link time (link_time, checked against
the runtime's ledger in tests/test_planner_slowlink.py) -- with the overlap's arithmetic written out here, at a
link where tau = 1 hides part of a fragment's sync and tau = 2 all of it."""

from __future__ import annotations

import dataclasses
import re

import pytest

from hybrid.planner import Cluster, Layout, hardware
from hybrid.planner import slowlink
from hybrid.planner.layout import Workload, ZeroStage
from hybrid.planner.model import ActivationProfile, Precision
from hybrid.planner.search import evaluate
from hybrid.planner.slowlink import Method, MethodConfig, SlowLink
from models import load_config

H, K = 12, 4  # a fragment synced every H / K = 3 inner steps: tau in {0, 1, 2}


def _setup():
    work = Workload(load_config("gpt2"), global_batch=64, seq_length=1024, precision=Precision.BF16,
                    activations=ActivationProfile.BF16_FLASH)
    cluster = Cluster(gpus=16, hw=hardware("a100-80g"))
    layout = Layout(tp=1, pp=1, dp=16, micro_batch=4, zero=ZeroStage.OPTIMIZER)
    return work, cluster, layout


def _streaming(tau: int) -> MethodConfig:
    return MethodConfig(Method.STREAMING, inner_steps=H, fragments=K, replicas=2, fragment_sync_delay=tau)


def test_overlap_leaves_each_fragment_sync_minus_tau_inner_steps_on_the_step():
    work, cluster, layout = _setup()
    plan = evaluate(work, cluster, layout)
    local = plan.time.total - plan.time.dp_comm
    probe = slowlink.link_time(work, cluster, layout, _streaming(0), SlowLink(1.0))
    inner = local + probe.intra  # one inner step: the planner's step without DP + the replica's own DP traffic
    # a bandwidth at which one fragment's sync takes 1.5 inner steps (latency 0: link time ~ 1 / bandwidth)
    gbps = (probe.cross * H / K) / (1.5 * inner)
    link = SlowLink(gbps)
    blocking = slowlink.link_time(work, cluster, layout, _streaming(0), link)
    fragment = blocking.cross * H / K
    assert fragment == pytest.approx(1.5 * inner, rel=1e-9)
    comp = slowlink.compress_seconds(work, cluster, layout, _streaming(0))
    steps = {}
    for tau in (0, 1, 2):
        lt, c, step, _ = slowlink.price(work, cluster, layout, _streaming(tau), link, evaluate)
        assert (lt.intra, lt.cross, lt.cross_bytes, c) == (blocking.intra, blocking.cross, blocking.cross_bytes, comp)
        steps[tau] = step
        hidden = min(fragment, tau * inner)  # the part of each fragment's sync under tau inner steps
        assert lt.exposed == pytest.approx((K / H) * (fragment - hidden), rel=1e-9, abs=1e-15)
        assert step == pytest.approx(local + blocking.intra + (K / H) * (fragment - hidden) + comp, rel=1e-9)
    assert steps[0] == pytest.approx(local + blocking.intra + blocking.cross + comp, rel=1e-12)  # tau 0: blocking
    assert steps[0] > steps[1] > steps[2] == pytest.approx(inner + comp, rel=1e-9)  # tau 2 hides it all


def test_bad_sync_delay_is_refused_naming_the_flag():
    for tau in (-1, H // K, True):
        with pytest.raises(ValueError, match=r"--diloco-fragment-sync-delay must be an integer in \[0, H / K\)"):
            _streaming(tau)
    with pytest.raises(ValueError, match="--diloco-fragment-sync-delay applies to DiLoCo, not powersgd"):
        MethodConfig(Method.POWERSGD, fragment_sync_delay=1)


PLAN = ["--model", "gpt2-xl", "--gpus", "16", "--gpu", "a100-80g", "--global-batch-size", "64", "--seq-length",
        "1024", "--pipeline-model-parallel-size", "1", "--tensor-model-parallel-size", "1", "--zero-stage", "1",
        "--inter-dc-bandwidth", "0.125", "--diloco-inner-steps", str(H), "--diloco-fragments", str(K)]


def _streaming_row(argv: list[str], capsys) -> list[str]:
    from hybrid.planner import cli
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    return next(line for line in out.splitlines() if line.strip().startswith("streaming")).split()


def test_plan_prices_the_streaming_row_with_the_flag_and_refuses_a_bad_one(capsys):
    """`hybrid plan --diloco-fragment-sync-delay 2`: the streaming row names tau and its step is shorter than the
    blocking one's (1 Gbit/s: a gpt2-xl fragment's sync is longer than an inner step); tau >= H / K: one line."""
    blocking = _streaming_row(PLAN, capsys)
    overlapped = _streaming_row(PLAN + ["--diloco-fragment-sync-delay", "2"], capsys)
    assert blocking[:5] == ["streaming", "H", str(H), "K", str(K)] and blocking[5] != "tau"
    assert overlapped[:7] == ["streaming", "H", str(H), "K", str(K), "tau", "2"]
    b, o = _columns(blocking), _columns(overlapped)
    assert o["link"] == b["link"] and o["step"] < b["step"]
    from hybrid.planner import cli
    code = cli.main(PLAN + ["--diloco-fragment-sync-delay", "3"])
    err = capsys.readouterr().err
    assert code == 2 and "--diloco-fragment-sync-delay must be an integer in [0, H / K) = [0, 3)" in err \
        and err.count("\n") == 1, err


def _columns(words: list[str]) -> dict[str, float]:
    """link s and step s of a printed row: the two numbers before the speed-up ("1.23x")."""
    at = next(i for i, w in enumerate(words) if re.fullmatch(r"[\d.]+x", w))
    return {"link": float(words[at - 2]), "step": float(words[at - 1])}


def test_overlap_field_defaults_keep_every_other_method_blocking():
    """exposed == cross for every method without tau (the priced step is unchanged for them)."""
    work, cluster, layout = _setup()
    link = SlowLink(0.125, 0.01)
    for method in slowlink.methods_from(4, H, K):
        lay = dataclasses.replace(layout, zero=method.zero_stages()[0])
        lt, comp, step, _ = slowlink.price(work, cluster, lay, method, link, evaluate)
        plan = evaluate(work, cluster, lay)
        assert lt.exposed == lt.cross
        assert step == pytest.approx(plan.time.total - plan.time.dp_comm + lt.intra + lt.cross + comp, rel=1e-12)
