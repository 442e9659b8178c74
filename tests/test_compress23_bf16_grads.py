"""Round 23: PowerSGD's error feedback under --bf16's gradient dtypes (round 22: --bf16 accumulates and reduces
gradients in fp32 by default, as Megatron-LM; --grad-reduce-in-bf16 in bf16). PowerSGD's buffers -- the error
feedback e and the warm-start Q -- take the gradient buffers' dtype (hybrid/compress/reduction.py: the engine's
grad_dtype), so a checkpoint holds them in fp32 or bf16 by the flag of the run that saved it.

1. A PowerSGD run under the --bf16 default (fp32 buffers) saved mid-run resumes bit for bit: losses and every
   saved tensor, the error feedback non-zero and fp32.
2. Across the flag: a checkpoint saved with --grad-reduce-in-bf16 loads into a default --bf16 run and back, its
   error feedback and Q cast to the loading run's dtype. A cast, not a refusal: e is a residual of the gradient in
   the gradient's coordinates (as across TP, docs/comm-efficient.md's resharding table), bf16 -> fp32 is exact and
   fp32 -> bf16 is the rounding the bf16 run applies to its own residual every step; a refusal would leave a user
   who changes the flag only the choice of dropping the state (a fresh start of compression) or not resuming.
   Checked by train.py's own objects loading and saving at once: every error and Q equal to the saved one cast
   (bf16 -> fp32 -> bf16 gives back the original bits), everything else bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from hybrid import testing
from tests.test_compress_reshard import _reshard, _tensors
from tests.test_compress_train import _run as run_dp2
from tests.test_compress_train import assert_resume_bit_for_bit

BF16 = ["--bf16"]
BF16_GRADS = ["--bf16", "--grad-reduce-in-bf16"]


def _compress(sd: dict) -> list[str]:
    return sorted(k for k in sd if k.startswith("compress/powersgd.") and "/" in k[len("compress/"):])


# Both slow: 4 train.py runs of 2 ranks and 2 two-rank loads, 11.5 s of CPU together (conftest's table, this machine
# under load). The fast tier keeps PowerSGD's fp32 resume (test_compress_train's bit-for-bit test, no --bf16).
@pytest.mark.slow
def test_powersgd_under_the_bf16_default_resumes_bit_for_bit(tmp_path):
    a = assert_resume_bit_for_bit(lambda flags: run_dp2(BF16 + flags), tmp_path)
    errors = [k for k in _compress(a) if ".error/" in k]
    assert errors and any(a[k].abs().max() > 0 for k in errors)
    assert {a[k].dtype for k in _compress(a)} == {torch.float32}  # the default: fp32 gradients, fp32 buffers


@pytest.fixture(scope="module")
def saved_bf16(tmp_path_factory):
    """dp 2, ZeRO 1, --grad-reduce-in-bf16: 6 steps, saved after 4 (compressing since step 3)."""
    from tests.test_compress_reshard import _run
    d = tmp_path_factory.mktemp("powersgd_bf16")
    _run(BF16_GRADS + ["--train-iters", "6", "--save-interval", "4", "--save", str(d / "ckpt")], 2)
    return str(d / "ckpt")


@pytest.mark.slow
def test_bf16_error_feedback_loads_into_the_default_and_back_cast(saved_bf16, tmp_path):
    want = _tensors(saved_bf16, 4)
    keys = _compress(want)
    assert keys and {want[k].dtype for k in keys} == {torch.bfloat16}
    assert any(want[k].abs().max() > 0 for k in keys if ".error/" in k)
    got = {}
    for flags, src, tag in ((BF16, saved_bf16, "fp32"), (BF16_GRADS, str(tmp_path / "fp32"), "bf16")):
        testing.run_distributed(_reshard, 2, args=(flags, src, str(tmp_path / tag)), timeout=300)
        got[tag] = _tensors(str(tmp_path / tag), 4)
    assert got["fp32"].keys() == got["bf16"].keys() == want.keys()
    for k, v in want.items():
        if k in keys:
            assert got["fp32"][k].dtype == torch.float32 and torch.equal(got["fp32"][k], v.float()), k
        else:
            assert torch.equal(got["fp32"][k], v), k
        assert got["bf16"][k].dtype == v.dtype and torch.equal(got["bf16"][k], v), k  # and back: the same bits
