"""bench_zero.py's per-rank phase split (PhaseClock, phase_split, phase_table): the arithmetic the docs/zero.md
profile of ZeRO 1-2 against DDP is read from. Pure functions on synthetic marks: no processes, no model (the
bench's --quick smoke run, tests/test_bench_smoke.py, runs the clock inside real ZeRO and DDP steps)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))

import bench_zero as B  # noqa: E402

# (name, wall, process CPU, main-thread CPU): a step of 1.0 s wall whose communication thread worked 0.2 s
MARKS = [("start", 10.0, 5.0, 3.0),
         ("forward", 10.2, 5.2, 3.2),       # 0.2 wall, all of it main-thread compute
         ("backward", 10.7, 5.6, 3.5),      # 0.5 wall, 0.4 CPU (0.1 of it the comm thread's), 0.1 idle
         ("AdamW", 10.8, 5.7, 3.6),
         ("backward", 11.0, 5.8, 3.6)]      # a second span of a name adds to the first: 0.2 wall, 0.1 CPU


def test_phases_add_up_to_the_step_and_a_repeated_name_sums_its_spans():
    split = B.phase_split(MARKS)
    assert list(split) == ["forward", "backward", "AdamW"]
    assert split["forward"] == pytest.approx((0.2, 0.2, 0.2))
    assert split["backward"] == pytest.approx((0.7, 0.5, 0.3))
    assert split["AdamW"] == pytest.approx((0.1, 0.1, 0.1))
    total = [sum(v[k] for v in split.values()) for k in range(3)]
    assert total == pytest.approx([MARKS[-1][k] - MARKS[0][k] for k in (1, 2, 3)])


def test_median_over_steps_per_phase():
    steps = [{"forward": (1.0, 0.5, 0.5)}, {"forward": (3.0, 1.5, 0.5)}, {"forward": (2.0, 2.5, 0.5)}]
    assert B.median_phases(steps) == {"forward": (2.0, 1.5, 0.5)}
    assert B.median_phases([]) == {}


def test_clock_marks_each_step_from_its_start():
    clock = B.PhaseClock()
    for _ in range(2):
        clock.mark("start")
        clock.mark("forward")
        clock.end_step()
    assert len(clock.steps) == 2 and all(list(s) == ["forward"] for s in clock.steps)
    assert clock.marks == []  # the next step's first span does not reach back into this one
    wall, cpu, main = clock.steps[0]["forward"]
    assert wall >= 0 and cpu >= 0 and main >= 0


def test_phase_table_gives_idle_as_wall_above_process_cpu_and_a_step_row_that_sums_the_phases(monkeypatch):
    monkeypatch.setattr(B, "ROWS", [("hybrid ZeRO-1", None, "1", None)])
    split = B.phase_split(MARKS)
    repeats = [[{"phases": [split, split]}], [{"phases": [split, split]}]]
    lines = B.phase_table(repeats, range(1))
    rows = {(c[2], int(c[1])): c for c in (line.strip("|").split(" | ") for line in lines[2:])}
    assert len(rows) == 2 * 4  # 3 phases + the step, for each of the 2 ranks
    back = rows[("backward", 0)]
    assert [float(x) for x in back[3:]] == pytest.approx([700.0, 500.0, 300.0, 200.0])
    fwd = rows[("forward", 1)]
    assert float(fwd[6]) == 0.0  # wall == CPU: no idle
    step = rows[("step", 1)]
    assert [float(x) for x in step[3:6]] == pytest.approx([1000.0, 800.0, 600.0])
    assert float(step[6]) == pytest.approx(200.0)


def test_steps_are_timed_back_to_back_from_start_to_start_with_one_barrier(monkeypatch):
    """Round 11: no barrier inside the timed run (a barrier before each step gave work a step left in flight --
    ZeRO 1-2's parameter all-gathers -- untimed time to finish), each step timed from its start to the next
    step's start; the gap between steps (here 1 s of the harness's own) is in the interval, as in a training loop."""
    now = {"wall": 0.0, "cpu": 0.0}
    barriers = []

    class Clock:
        @staticmethod
        def perf_counter():
            return now["wall"]

        @staticmethod
        def process_time():
            return now["cpu"]
    monkeypatch.setattr(B, "time", Clock)
    monkeypatch.setattr(B.dist, "barrier", lambda: barriers.append(now["wall"]))

    def step(it):  # step `it` runs 10 + it s, 2 s of it on the CPU; then 1 s between steps
        now["wall"] += 10 + it
        now["cpu"] += 2
        if it < 3:
            now["wall"] += 1

    cpu: list[float] = []
    args = type("Args", (), {"warmup": 1, "steps": 3})
    assert B._time_steps(step, args, cpu) == [12.0, 13.0, 13.0]  # steps 1, 2 (+ the gaps), and 3 to its end
    assert cpu == [2.0, 2.0, 2.0]
    assert barriers == [0.0]  # once, before the first (warm-up) step
