"""Dump every planned number the pipeline simulation feeds, for a byte-for-byte before/after diff of a change that
must not move any of them (e.g. a faster schedule simulation):

    python scripts/planner_dump.py > before.txt   # on the old code
    python scripts/planner_dump.py > after.txt    # on the new code
    cmp before.txt after.txt

It writes repr() of every published run's full evaluation (published_more.evaluate: the Plan with its layout,
step terms, memory; repr gives floats to the last bit), every all_rows() FamilyRow, and `hybrid plan --json` for a
dozen CLI plans (1F1B, interleaved, ZB-H1 / ZBV twins, CP, MoE, scans)."""

from __future__ import annotations

import contextlib
import io
import sys

CLI_PLANS = [
    ["--model", "gpt2-xl", "--gpus", "16", "--global-batch-size", "64"],
    ["--model", "llama-3-70b", "--gpus", "64", "--global-batch-size", "512", "--gpu", "h100-80g",
     "--pipeline-model-parallel-size", "8", "--virtual-pipeline-model-parallel-size", "4"],
    ["--model", "llama-3-70b", "--gpus", "128", "--global-batch-size", "1024", "--gpu", "h100-80g"],
    ["--model", "llama-3-8b", "--gpus", "32", "--global-batch-size", "256", "--pipeline-model-parallel-size", "4"],
    ["--model", "llama-3-8b", "--gpus", "16", "--global-batch-size", "64", "--seq-length", "32768",
     "--context-parallel-size", "2,4"],
    ["--model", "tiny-mixtral", "--gpus", "8", "--global-batch-size", "8", "--seq-length", "128"],
    ["--model", "tiny-qwen2-moe", "--gpus", "8", "--global-batch-size", "16", "--seq-length", "256",
     "--expert-model-parallel-size", "2"],
    ["--model", "gpt2-large", "--gpus", "8", "--global-batch-size", "32", "--pipeline-model-parallel-size", "4",
     "--gpu", "a100-80g"],
    ["--model", "gpt2-medium", "--gpus", "4", "--global-batch-size", "32", "--pipeline-model-parallel-size", "2",
     "--virtual-pipeline-model-parallel-size", "2"],
    ["--model", "llama-3-405b", "--gpus", "1024", "--global-batch-size", "2048", "--gpu", "h100-80g"],
    ["--model", "llama-3-70b", "--gpus", "256", "--global-batch-size", "512", "--gpu", "h100-80g",
     "--pipeline-model-parallel-size", "16", "--top", "5"],
    ["--model", "tiny-llama", "--gpus", "4", "--global-batch-size", "16", "--seq-length", "128",
     "--pipeline-model-parallel-size", "4"],
    ["--model", "gpt2-xl", "--global-batch-size", "64", "--scan-gpus", "8,16,32"],
]


def main() -> None:
    import hybrid.cli
    from hybrid.planner import families
    from hybrid.planner.published_more import evaluate
    out = sys.stdout
    for run in families.all_published_runs():
        result = evaluate(run)
        out.write(f"{run.name}\n{result.layout} {result.memory_gb!r} {result.predicted!r} {result.error!r} "
                  f"{result.rejected!r}\n{result.plan!r}\n")
    for row in families.all_rows():
        out.write(f"{row!r}\n")
    for args in CLI_PLANS:
        text, code = io.StringIO(), 0
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
            try:
                hybrid.cli.main(["plan", *args, "--json"])
            except SystemExit as exc:
                code = exc.code
        out.write(f"$ hybrid plan {' '.join(args)} --json  (exit {code})\n{text.getvalue()}\n")


if __name__ == "__main__":
    main()
