"""Tensor parallelism: comm primitives, sharded layers, vocab-parallel cross-entropy."""

from hybrid.tp.cross_entropy import IGNORE_INDEX, vocab_parallel_cross_entropy
from hybrid.tp.layers import (ColumnParallelLinear, LayerNorm, ParallelLMHead, RMSNorm, RowParallelLinear,
                              TPContext, VocabParallelEmbedding, enter_linears, normal_init)
from hybrid.tp.random import Dropout, ParallelRNG, Region
from hybrid.tp.sharding import ShardSpec, gather_full, init_parameters, spec_of, sync_partial_grads

__all__ = ["IGNORE_INDEX", "vocab_parallel_cross_entropy", "ColumnParallelLinear", "LayerNorm", "ParallelLMHead",
           "RMSNorm", "Dropout", "ParallelRNG", "Region", "RowParallelLinear", "TPContext", "VocabParallelEmbedding",
           "enter_linears", "normal_init", "ShardSpec",
           "gather_full", "init_parameters", "spec_of", "sync_partial_grads"]
