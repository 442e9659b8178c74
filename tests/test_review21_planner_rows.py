"""Round 21's review of planner21b's flash-attention rows: each row's micro-batch is its config's
`datamodule.batch_size` at `train.gpu_mem` = round(81920 MiB / 1000) = 82 (A100 80GB's nvidia-smi memory.total),
Dao-AILab/flash-attention training/configs/experiment/pile/*.yaml (unchanged since 4a6eaa9f, 2022-11-29, the commit
that added the README's results). The 355M's gpt3m-flash.yaml reads "4 if gpu_mem < 24 else (8 if gpu_mem < 40
else (16 if gpu_mem < 80 else 32))": 32, not the 16 the row first had."""

from __future__ import annotations

from hybrid.planner import published21_newsources as new

# each config's expression, as written, at gpu_mem 82
CONFIG_BATCH = {
    "GPT3-125M": lambda m: 8 if m < 24 else (16 if m < 40 else 32),                               # gpt3s-flash
    "GPT3-355M": lambda m: 4 if m < 24 else (8 if m < 40 else (16 if m < 80 else 32)),            # gpt3m-flash
    "GPT3-760M": lambda m: 2 if m < 24 else (4 if m < 40 else (8 if m < 80 else 16)),             # gpt3l-flash
    "GPT3-1.3B": lambda m: 1 if m < 24 else (2 if m < 40 else (4 if m < 80 else 8)),              # gpt3xl-flash
    "GPT3-2.7B": lambda m: 1 if m < 40 else (2 if m < 80 else 4),                   # gpt3-2.7B-flash-hdim128
}


def test_flash_attn_micro_batches_are_the_configs_at_80gb():
    assert {row[0]: row[4] for row in new.FLASH_ATTN_ROWS} == {name: f(82) for name, f in CONFIG_BATCH.items()}
    (run,) = [r for r in new.flash_attn_runs() if "355M" in r.name]
    assert run.space.micro_batch == (32,) and "b32 x 1" in run.name


def test_nemo22_rows_plan_their_configs_vocab_and_optimizer():
    """NeMo-Framework-Launcher conf/training/gpt3/{5b,175b}.yaml at each table's commit: make_vocab_size_divisible_by
    128 times t (50,257 -> 50,304 at t 1, 50,432 at t 2, 51,200 at t 8); 22.06's `fused_adam` is ZeRO 0, 22.08's
    `distributed_fused_adam` the planner's ZeRO 1 wherever d > 1. (The row table's doc test caught these only as a
    changed table, which a regeneration hides.)"""
    from hybrid.planner.layout import ZeroStage
    for run in new.nemo22_runs():
        tp, dp = run.space.tp[0], run.gpus // (run.space.tp[0] * run.space.pp[0])
        assert run.workload.model.vocab_size == {1: 50304, 2: 50432, 8: 51200}[tp], run.name
        distributed = run.name.startswith("NeMo 22.08") and dp > 1
        assert run.space.zero == ((ZeroStage.OPTIMIZER,) if distributed else (ZeroStage.NONE,)), run.name


def test_flash_attn_rows_reduce_fc1s_bias_gradient_in_their_gemms():
    """flash-attn's FusedDenseGeluDense (`fused_dense_gelu_dense: True` in every pile/gpt3*-flash config) returns both
    bias gradients from its cuBLASLt GEMMs' epilogues: no autograd reduction pass, unlike Megatron's bias-GELU
    (ops._bias_grad_ops). The 1.3B (t 1: f = 8192 elements a token, bf16) moved 0.4 point when it paid one."""
    from hybrid.planner.ops import layer_ops
    from hybrid.planner.published_more import evaluate
    from hybrid.planner.published21_gptarch import no_bias_grads
    for run in new.flash_attn_runs():
        work = run.workload
        assert work.fc1_bias_grad_in_kernel, run.name
        ops = layer_ops(work.shard(1), 2048, False, 2, work.kernel_profile, work.fc1_bias_grad_in_kernel)
        assert "fc1 bias grad" not in {o.name for o in ops}
    (run,) = [r for r in new.flash_attn_runs() if "1.3B" in r.name]
    with no_bias_grads():
        before = evaluate(run).error
    assert evaluate(run).error == before  # the time does not read the term at all
