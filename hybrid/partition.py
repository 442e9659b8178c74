"""Which Transformer layers each pipeline stage holds.

The model is cut into pp * v consecutive stages (Megatron's interleaved layout, see
hybrid.pipeline.schedules): global stage s = chunk * pp + rank holds a contiguous run of layers, stage 0
also the embedding and stage pp*v - 1 also the final norm, LM head and loss. `partition_layers` returns the
layers of every stage in stage order; stage s becomes

    StageLayout(layer_ids=parts[s], first=s == 0, last=s == pp * v - 1)

and rank r holds the chunks parts[r], parts[pp + r], ..., parts[(v - 1) pp + r] (`rank_chunks`).

Three ways to split (`--pipeline-partition`, `--pipeline-layers-per-stage`):

* UNIFORM: num_layers / (pp v) layers per stage; the layer count must divide.
* BALANCED: minimise the largest stage cost, where a stage costs the sum of its layers' costs, plus the
  embedding on stage 0 and the head + loss on the last stage. Exact (dynamic programme over the contiguous
  splits). Among the splits with that optimum it takes the most even one (least sum of squared stage
  costs), and among those the one with the fewest layers on the early stages: under 1F1B rank r holds up
  to pp - r micro-batches of activations, so the early stages are where memory runs out. With v > 1 each
  chunk is balanced as a stage of its own (every chunk is one step of the interleaved pipeline); a rank's
  total over its v chunks is not balanced separately.
* MANUAL: the layer counts per stage, given (Megatron-like `--pipeline-layers-per-stage 3,4,4,3`).

Empty stages. The first and the last stage may hold no layers (they still run the embedding, or the head
and loss: Megatron's "account for embedding/loss in the pipeline split"); BALANCED chooses that when the
embedding or the head costs as much as the layers it would displace. A middle stage must hold at least one
layer: an empty one would only relay activations, a pipeline step that does nothing.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from hybrid.cliutil import check_number, is_integer
if TYPE_CHECKING:
    from models.config import ModelConfig

_INF = math.inf
_REL_TOL = 1e-9  # float costs: sums equal up to rounding are ties


class PartitionMethod(enum.Enum):
    """How `partition_layers` splits the layers (`--pipeline-partition`)."""

    UNIFORM = "uniform"  # the same number of layers on every stage
    BALANCED = "balanced"  # minimise the largest stage cost (embedding and head included)
    MANUAL = "manual"  # the counts in `layers_per_stage` (`--pipeline-layers-per-stage`)


@dataclass(frozen=True)
class StageCosts:
    """Relative cost of the parts of a model, in any one unit (here: FLOPs of forward + backward for one
    micro-batch). Pass to `partition_layers(..., **costs.as_kwargs())`.

    Attributes:
        layer_cost: one Transformer layer.
        embedding_cost: the token (and position) embedding, on the first stage.
        head_cost: final norm, LM head and loss, on the last stage.
    """

    layer_cost: float
    embedding_cost: float
    head_cost: float

    def as_kwargs(self) -> dict[str, float]:
        return {"layer_cost": self.layer_cost, "embedding_cost": self.embedding_cost, "head_cost": self.head_cost}


def stage_costs_from_config(cfg: "ModelConfig", seq: int, micro_batch: int) -> StageCosts:
    """FLOPs of forward + backward (= 3 x forward: backward computes the input and the weight gradient,
    each as costly as the forward) of one micro-batch of `micro_batch` sequences of `seq` tokens.

    A layer's forward, counting a multiply-add as 2 FLOPs and the full s x s score matrix (as Narayanan
    et al. 2021, whose 24bsh^2 + 4bs^2h this is for GPT-2: f = 4h, a d = h):
        projections  2bs (h a d + 2 h g d + a d h)      q, k, v, o  (g key/value heads, d head width)
        MLP          2bs n h f                           n = 2 (GELU MLP) or 3 (SwiGLU)
        attention    2 x 2 b s^2 a d                    QK^T and (softmax) V
    The LM head is one (bs x h) (h x V) product: 2bshV forward, x 3. The embedding is a gather, no matmul:
    counted as bsh per pass (3bsh) -- about 1/(24h) of a layer, negligible but not free. Norms,
    activations and the loss's softmax are elementwise and left out. Tensor parallelism divides every term
    alike, so it is omitted; so is the micro-batch count, which scales every stage alike.
    """
    b, s, h, f = micro_batch, seq, cfg.hidden_size, cfg.ffn_hidden_size
    q_width, kv_width = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    mlp_matrices = 2 if cfg.arch == "gpt2" else 3
    projections = 2 * b * s * (h * q_width + 2 * h * kv_width + q_width * h)
    mlp = 2 * b * s * mlp_matrices * h * f
    attention = 4 * b * s * s * q_width
    return StageCosts(layer_cost=3.0 * (projections + mlp + attention),
                      embedding_cost=3.0 * b * s * h,
                      head_cost=3.0 * 2 * b * s * h * cfg.vocab_size)


def partition_layers(num_layers: int, pp: int, v: int = 1, method: PartitionMethod | None = None,
                     layer_cost: float | Sequence[float] = 1.0, embedding_cost: float = 0.0, head_cost: float = 0.0,
                     layers_per_stage: Sequence[int] | None = None, chunks: str | None = None
                     ) -> list[tuple[int, ...]]:
    """Global layer ids of each of the pp * v stages, in stage order (stage = chunk * pp + rank).

    `method` defaults to MANUAL when `layers_per_stage` is given, else UNIFORM. `layer_cost` is one
    cost for every layer or one per layer; the costs only matter to BALANCED. `chunks`: what set v, for the
    messages, when not --virtual-pipeline-model-parallel-size (train.py's --pipeline-schedule zbv, which fixes 2).
    """
    for flag, value in (("--num-layers", num_layers), ("--pipeline-model-parallel-size", pp),
                        ("--virtual-pipeline-model-parallel-size", v)):
        check_number(flag, value, 1, integer=True)
    method = method or (PartitionMethod.MANUAL if layers_per_stage is not None else PartitionMethod.UNIFORM)
    if not isinstance(method, PartitionMethod):
        choices = ", ".join(m.value for m in PartitionMethod)
        raise ValueError(f"--pipeline-partition must be a PartitionMethod ({choices}), got {method!r}; "
                         f"convert a flag with PartitionMethod(text)")
    if layers_per_stage is not None and method is not PartitionMethod.MANUAL:
        raise ValueError(f"--pipeline-layers-per-stage fixes the split, so --pipeline-partition {method.value} "
                         f"cannot apply; drop one of the two")
    stages = pp * v
    if method is PartitionMethod.UNIFORM:
        counts = _uniform_counts(num_layers, pp, v, chunks)
    elif method is PartitionMethod.BALANCED:
        costs = _layer_costs(layer_cost, num_layers)
        check_number("embedding_cost", embedding_cost, 0)
        check_number("head_cost", head_cost, 0)
        counts = _balanced_counts(costs, stages, embedding_cost, head_cost, _stage_flags(pp, v, chunks))
    else:
        counts = _manual_counts(layers_per_stage, num_layers, stages, _stage_flags(pp, v, chunks))
    return _to_layer_ids(counts)


def rank_chunks(parts: Sequence[tuple[int, ...]], pp: int, rank: int) -> list[tuple[int, ...]]:
    """Layers of each local chunk of pipeline rank `rank`: chunk c is global stage c * pp + rank."""
    if not 0 <= rank < pp or len(parts) % pp != 0:
        raise ValueError(f"rank must be in [0, pp={pp}) and the {len(parts)} stages a multiple of pp")
    return [parts[c * pp + rank] for c in range(len(parts) // pp)]


def partition_costs(parts: Sequence[tuple[int, ...]], layer_cost: float | Sequence[float] = 1.0,
                embedding_cost: float = 0.0, head_cost: float = 0.0) -> list[float]:
    """Cost of each stage of a partition, under BALANCED's model."""
    costs = _layer_costs(layer_cost, sum(len(p) for p in parts))
    out = [sum(costs[i] for i in ids) for ids in parts]
    out[0] += embedding_cost
    out[-1] += head_cost
    return out


def parse_layers_per_stage(text: str) -> tuple[int, ...]:
    """`--pipeline-layers-per-stage 3,4,4,3` -> (3, 4, 4, 3)."""
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--pipeline-layers-per-stage {text!r}: give comma-separated layer counts, "
                         f"one per stage, e.g. 3,4,4,3") from None


# --- the three methods -------------------------------------------------------------------------

def _uniform_counts(num_layers: int, pp: int, v: int, chunks: str | None = None) -> list[int]:
    stages = pp * v
    if num_layers % stages == 0:
        return [num_layers // stages] * stages
    # the model's layer count is not a flag of train.py or `hybrid convert` (the config holds it): named as a count
    layout = f"the {stages} stages {_stage_flags(pp, v, chunks)}"
    if num_layers < stages:
        raise ValueError(f"the model's {num_layers} layers are fewer than {layout}; use at most {num_layers} stages")
    raise ValueError(f"the model's {num_layers} layers do not divide into {layout}; use --pipeline-partition balanced, "
                     f"or --pipeline-layers-per-stage {','.join(map(str, _near_uniform(num_layers, stages)))}")


def _stage_flags(pp: int, v: int, chunks: str | None = None) -> str:
    """The flags that make the stages, "(--pipeline-model-parallel-size 2 x --virtual-pipeline-model-parallel-size
    2)": the virtual size only where there are virtual stages (a "pp x v" at v 1 read as a flag the user never gave),
    named by `chunks` where another flag set it ("2 chunks a rank of --pipeline-schedule zbv")."""
    virtual = f" x {chunks or f'--virtual-pipeline-model-parallel-size {v}'}" if v > 1 else ""
    return f"(--pipeline-model-parallel-size {pp}{virtual})"


def _near_uniform(num_layers: int, stages: int) -> list[int]:
    """Counts differing by at most one, the larger ones last (a suggestion for error messages)."""
    q, r = divmod(num_layers, stages)
    return [q] * (stages - r) + [q + 1] * r


def _manual_counts(counts: Sequence[int] | None, num_layers: int, stages: int, made_by: str) -> list[int]:
    """`made_by`: the flags that make the stages (_stage_flags), for the messages."""
    flag = "--pipeline-layers-per-stage"
    counts = list(counts or ())
    if len(counts) != stages:
        raise ValueError(f"{flag} gives {len(counts)} counts for {stages} stages {made_by}; give one per stage, "
                         f"e.g. {','.join(map(str, _near_uniform(num_layers, stages)))}")
    if any(not is_integer(c) or c < 0 for c in counts):
        raise ValueError(f"{flag} {counts}: every count must be an integer >= 0")
    if sum(counts) != num_layers:
        raise ValueError(f"{flag} {','.join(map(str, counts))} sums to {sum(counts)}, not the model's "
                         f"{num_layers} layers; make the counts add up to {num_layers}")
    empty_middle = [s for s in range(1, stages - 1) if counts[s] == 0]
    if empty_middle:
        raise ValueError(f"{flag}: stages {empty_middle} hold no layers; only the first and the last stage may "
                         f"be empty (they still run the embedding / the head), so move layers there or use "
                         f"fewer stages")
    return counts


MAX_BALANCED_LAYERS = 2048  # its DP tables: (L + 1)^2 float64 = 34 MB each at 2048 (100000 layers asked 75 GiB)


def _balanced_counts(costs: list[float], stages: int, embedding_cost: float, head_cost: float,
                     made_by: str) -> list[int]:
    """Layer counts minimising the largest stage cost, then the sum of squared stage costs, then the
    counts lexicographically (fewest layers early). Two dynamic programmes over (stage, first layer):
    the first finds the optimal largest cost M; the second, allowed only stages costing <= M, the least
    sum of squares (additive, so it decomposes where a lexicographic (max, squares) pair would not)."""
    n = len(costs)
    if n > MAX_BALANCED_LAYERS:
        raise ValueError(f"--num-layers {n}: the balanced pipeline split holds (layers + 1)^2 float tables "
                         f"({(n + 1) ** 2 * 8 / 2**30:.1f} GiB each); it splits at most {MAX_BALANCED_LAYERS} layers "
                         f"(published models have ~100); use --pipeline-partition uniform with a pp that divides them")
    if n < stages - 2:
        raise ValueError(f"the model's {n} layers cannot fill {stages} stages {made_by}: every stage but the first "
                         f"and the last needs a layer; use at most {n + 2} stages")
    split = _Split(costs, stages, embedding_cost, head_cost)
    bound = split.solve(squares=False)[0][0]
    limit = bound * (1 + _REL_TOL)  # the optimum, give or take rounding of the float sums
    table = split.solve(squares=True, limit=limit)
    return split.trace(table, limit)


@dataclass
class _Split:
    """Contiguous splits of `costs` into `stages` runs; stage k's run starts at layer i.

    Attributes:
        costs: cost of each layer.
        stages: number of stages (pp x v).
        embedding_cost: added to stage 0.
        head_cost: added to the last stage.
    """

    costs: list[float]
    stages: int
    embedding_cost: float
    head_cost: float

    def __post_init__(self) -> None:
        self.prefix = [0.0]  # prefix[j] = cost of layers [0, j)
        for c in self.costs:
            self.prefix.append(self.prefix[-1] + c)

    def cost(self, k: int, i: int, j: int) -> float:
        """Cost of stage k holding layers [i, j)."""
        return self.prefix[j] - self.prefix[i] + self._extra(k)

    def choices(self, k: int, i: int) -> range:
        """Layer counts stage k may take from layer i: the last stage takes the rest; a middle stage
        at least one layer; the first (when not also the last) may take none."""
        n = len(self.costs)
        if k == self.stages - 1:
            return range(n - i, n - i + 1)
        return range(0 if k == 0 else 1, n - i + 1)

    def solve(self, squares: bool, limit: float = _INF) -> list[list[float]]:
        """table[k][i] = the least combine(stage k's cost, table[k + 1][i + m]) over the counts m, the stage
        costing at most `limit`: the best split of layers [i, n) into stages k, k+1, ... combine is
        max(c, rest) (the largest stage cost) or, with `squares`, c * c + rest (the sum of squared costs).

        One numpy pass per stage over every (first layer i, end layer j = i + m) pair: stage k's cost of
        layers [i, j) is prefix[j] - prefix[i] + extra, the same float operations in the same order as
        `cost`, so the tables equal a scalar loop's bit for bit (max, min and c * c + rest round alike).
        O(stages n^2) work either way; vectorised, a 128-layer split on 64 stages takes milliseconds
        instead of a second, which the planner's search pays for every uneven (pp, v) it tries."""
        n = len(self.costs)
        prefix = np.asarray(self.prefix, dtype=np.float64)
        span = prefix[None, :] - prefix[:, None]  # span[i, j] = cost of layers [i, j)
        first, end = np.indices((n + 1, n + 1))
        table = np.full((self.stages + 1, n + 1), _INF)
        table[self.stages, n] = 0.0
        for k in reversed(range(self.stages)):
            c = span + self._extra(k)
            rest = table[k + 1][None, :]
            allowed = self._allowed(k, first, end) & (rest < _INF) & (c <= limit)
            value = c * c + rest if squares else np.maximum(c, rest)
            table[k] = np.where(allowed, value, _INF).min(axis=1)
        return table.tolist()

    def _extra(self, k: int) -> float:
        return (self.embedding_cost if k == 0 else 0.0) + (self.head_cost if k == self.stages - 1 else 0.0)

    def _allowed(self, k: int, first: np.ndarray, end: np.ndarray) -> np.ndarray:
        """The (i, j) pairs `choices` allows stage k: j = n for the last stage, else j - i >= 0 for the
        first stage and >= 1 for a middle one."""
        if k == self.stages - 1:
            return end == len(self.costs)
        return end - first >= (0 if k == 0 else 1)

    def trace(self, squares: list[list[float]], limit: float) -> list[int]:
        """The lexicographically smallest counts whose sum of squares is squares[0][0]: at each stage
        the fewest layers that still complete an optimal split."""
        counts, i = [], 0
        for k in range(self.stages):
            for m in self.choices(k, i):
                c, rest = self.cost(k, i, i + m), squares[k + 1][i + m]
                if c <= limit and rest < _INF and math.isclose(c * c + rest, squares[k][i], rel_tol=_REL_TOL):
                    break
            counts.append(m)
            i += m
        return counts


# --- helpers -----------------------------------------------------------------------------------

def _to_layer_ids(counts: Sequence[int]) -> list[tuple[int, ...]]:
    parts, start = [], 0
    for c in counts:
        parts.append(tuple(range(start, start + c)))
        start += c
    return parts


def _layer_costs(layer_cost: float | Sequence[float], num_layers: int) -> list[float]:
    if isinstance(layer_cost, (int, float)):
        check_number("layer_cost", layer_cost, 0)
        return [float(layer_cost)] * num_layers
    costs = [float(c) for c in layer_cost]
    if len(costs) != num_layers:
        raise ValueError(f"layer_cost gives {len(costs)} per-layer costs for --num-layers {num_layers}; "
                         f"give one cost, or one per layer")
    for c in costs:
        check_number("layer_cost", c, 0)
    return costs
