"""DiLoCo: local updates over data-parallel replicas (Douillard et al. 2023, arXiv:2311.08105), each replica a whole
TP x PP (x ZeRO) model. See outer.py for the math, replicas.py for the groups, docs/comm-efficient.md for use."""

from hybrid.diloco.args import DiLoCoConfig
from hybrid.diloco.outer import DiLoCo
from hybrid.diloco.replicas import ReplicaLayout

__all__ = ["DiLoCo", "DiLoCoConfig", "ReplicaLayout"]
