"""models/activations.py's local table equals transformers' ACT2FN entry of the same name, forward and backward."""

from __future__ import annotations

import pytest
import torch
from transformers.activations import ACT2FN

from models.activations import LOCAL, activation, known

X = torch.linspace(-8.0, 8.0, 100_001)  # the tails, zero and everything between, in fp32
# gelu_new: torch's fused tanh kernel against transformers' Python formula 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715
# x^3))): the same function, its ~8 fp32 operations in another order, each rounding by <= half an ulp of values up
# to |x| = 8: at most 8 ulp(8) = 8 * 8 * eps apart (forward; the derivative's formula has as many operations)
TOLERANCE = {"gelu_new": 8 * 8 * torch.finfo(torch.float32).eps}


@pytest.mark.parametrize("name", sorted(LOCAL))
def test_local_activation_equals_transformers(name):
    ours, theirs = X.clone().requires_grad_(), X.clone().requires_grad_()
    y_ours, y_theirs = activation(name)(ours), ACT2FN[name](theirs)
    y_ours.sum().backward()
    y_theirs.sum().backward()
    atol = TOLERANCE.get(name, 0.0)  # the rest are the same torch op: bit for bit
    torch.testing.assert_close(y_ours, y_theirs, rtol=0, atol=atol)
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=0, atol=atol)


def test_other_transformers_names_come_from_act2fn_and_unknown_names_are_refused():
    assert type(activation("quick_gelu")) is type(ACT2FN["quick_gelu"])
    assert known("quick_gelu") and known("silu") and not known("nope") and not known(None)
    with pytest.raises(KeyError):
        activation("nope")
