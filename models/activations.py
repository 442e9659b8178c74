"""MLP activations by transformers' names (`hidden_act`, `activation_function`), without importing transformers.

The names a preset or a common config uses are built from torch here; any other name of transformers' ACT2FN
table is taken from it, imported then (such a name only comes from a config.json, whose reading imports
transformers anyway). tests/test_activations.py checks each local entry against ACT2FN's on the same input.

GPT-2's tanh-approximated GELU ("gelu_new", written out in Python in transformers) runs as torch's fused
kernel: the same function, one op that saves only its input for backward instead of three intermediates
(12 bytes/element less in fp32); equal to transformers' within float rounding.
"""

from __future__ import annotations

from typing import Callable

import torch.nn as nn

LOCAL: dict[str, Callable[[], nn.Module]] = {
    "gelu": nn.GELU,                                     # erf GELU (transformers' GELUActivation)
    "gelu_new": lambda: nn.GELU(approximate="tanh"),     # GPT-2's; see the module docstring
    "gelu_pytorch_tanh": lambda: nn.GELU(approximate="tanh"),
    "relu": nn.ReLU,
    "silu": nn.SiLU,                                     # the Llama family's SwiGLU gate
    "swish": nn.SiLU,
    "sigmoid": nn.Sigmoid,
    "tanh": nn.Tanh,
}


def activation(name: str) -> nn.Module:
    """The activation module transformers' ACT2FN[name] names (KeyError for an unknown name)."""
    if name in LOCAL:
        return LOCAL[name]()
    from transformers.activations import ACT2FN  # a rarer name: transformers' own module
    return ACT2FN[name]


def known(name: object) -> bool:
    """`name` is an activation transformers' ACT2FN defines (the local ones are among them)."""
    if isinstance(name, str) and name in LOCAL:
        return True
    from transformers.activations import ACT2FN
    return isinstance(name, str) and name in ACT2FN
