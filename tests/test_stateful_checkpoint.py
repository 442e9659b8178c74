"""The checkpoint needs only the `Stateful` interface (hybrid/stateful.py): an owner it has never seen -- here a toy
that holds rows of a global matrix, a per-rank tensor and a plain counter -- is saved on 2 ranks and loaded on 1 at
another split (columns instead of rows), through hybrid.checkpoint.core's save_state / load_state alone. Each
global element is read back where the toy says it lies; the counter comes back through state.json; the owner's own
load_state_dict is called with the filled views. And statically: hybrid/checkpoint/ reads no private attribute
of any object but its own (`self._x`) and torch's, so it cannot reach into an owner's internals."""

from __future__ import annotations

import ast
import glob
import os

import torch

from hybrid.stateful import Shards
from hybrid.testing import run_distributed

SHAPE = (6, 4)
GLOBAL = torch.arange(24, dtype=torch.float32).reshape(SHAPE)


class Toy:
    """Rows [3r, 3r+3) of GLOBAL on rank r of 2 (`split="rows"`), or the two column halves on one rank
    (`split="cols"`); a tensor of this rank alone; a step counter."""

    def __init__(self, rank: int, split: str, fill: bool):
        src = GLOBAL if fill else torch.zeros(SHAPE)
        if split == "rows":
            self.pieces = [src[3 * rank:3 * rank + 3].clone()]
            self.boxes = [((3 * rank, 0), (3, 4))]
        else:
            self.pieces = [src[:, :2].clone(), src[:, 2:].clone()]
            self.boxes = [((0, 0), (6, 2)), ((0, 2), (6, 2))]
        self.rank = rank
        self.mine = torch.full((2,), float(rank + 1)) if fill else torch.zeros(2)
        self.steps = 7 if fill else 0
        self.loaded_keys: list[str] = []

    def state_dict(self) -> dict[str, object]:
        return {"matrix": Shards(SHAPE, self.pieces, self.boxes, write=True), f"mine/{self.rank}": self.mine,
                "steps": self.steps}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.loaded_keys = sorted(state)
        self.mine, self.steps = state[f"mine/{self.rank}"], state["steps"]


def _save(rank: int, world: int, root: str) -> None:
    from hybrid.checkpoint import core
    # what state.json must hold for a resume (store.read_state): a run's position and layout, and the fields the
    # optimizer owner would add (no optimizer here)
    run = {"iteration": 3, "consumed_samples": 12, "model": "toy", "layout": {"tp": 1, "pp": 1, "dp": 2, "zero": 0},
           "adam_step": 0, "scaler": {"loss_scale": 1.0, "good_steps": 0, "skipped_steps": 0}}
    core.save_state({"toy/": Toy(rank, "rows", fill=True)}, root, 3, run).finish()


def _load(rank: int, world: int, root: str):
    from hybrid.checkpoint import core, store
    owner = Toy(rank, "cols", fill=False)  # rank 0 reads its own tensor back, the matrix at another split
    state = core.load_state({"toy/": owner}, store.final_path(root, 3))
    return torch.cat(owner.pieces, dim=1), owner.mine, owner.steps, owner.loaded_keys, state["iteration"]


def test_an_owner_the_checkpoint_never_saw_saves_on_2_ranks_and_loads_on_1_at_another_split(tmp_path):
    root = str(tmp_path / "ckpt")
    run_distributed(_save, 2, args=(root,), timeout=120)
    (matrix, mine, steps, keys, iteration), = run_distributed(_load, 1, args=(root,), timeout=120)
    assert torch.equal(matrix, GLOBAL)  # rows written by two ranks, read back as columns by one
    assert torch.equal(mine, torch.full((2,), 1.0)) and steps == 7 and iteration == 3
    assert keys == ["matrix", "mine/0", "steps"]


def test_the_checkpoint_reads_no_private_attribute_of_another_object():
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hybrid", "checkpoint")
    found = []
    for path in sorted(glob.glob(os.path.join(root, "*.py"))):
        tree = ast.parse(open(path).read())
        imported = {(a.asname or a.name).split(".")[0]: (n.module if isinstance(n, ast.ImportFrom) else a.name)
                    for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
        for n in ast.walk(tree):
            if isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__"):
                base = ast.unparse(n.value).split(".")[0]
                if base in ("self", "cls") or str(imported.get(base, "")).startswith(("torch", "argparse")):
                    continue
                if base == "st" and "sharded_tensor" in open(path).read():  # the ShardedTensor shards.py builds
                    continue
                found.append(f"{os.path.basename(path)}:{n.lineno} {ast.unparse(n)}")
    assert not found, found
