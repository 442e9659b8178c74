"""The MoE block: router -> dispatch -> local experts -> combine (+ a shared expert), and its balancing losses.

    y_t = sum_{i<k} p_ti * expert_{e_ti}(x_t)  [+ sigmoid(x_t w_g) * shared(x_t)]

Under tensor parallelism the block takes the sequence-parallel slice of the tokens (B, T/t, h): every rank
routes its own tokens, so the expert layers see the TP ranks like data-parallel ones (parallel folding,
hybrid/moe/parallel.py). The shared expert is a dense tensor-parallel SwiGLU like any MLP.

Under context parallelism the block takes the CP rank's T/cp tokens of each sequence (B, T/cp, h), or T/(cp t)
with TP + SP: MoE is token-local, so a CP rank routes its own tokens like a TP rank under SP.

Auxiliary losses are not added to the returned loss: as Megatron's MoEAuxLossAutoScaler, each layer hooks its
loss into backward -- the block's output carries it, and its backward adds d aux / d router to the gradient,
scaled like the language-model loss (1 / micro-batches, times the fp16 loss scale: `set_aux_grad_scale`).
So the losses need no path to the last pipeline stage, and each rank adds only its own tokens' share: the
shares sum to the micro-batch's loss over the ranks its tokens are spread on -- TP (under SP) x CP, over which
the counts are all-reduced first (Megatron's tp_cp_group). With CP the gradient of a rank's share is scaled by
cp as well, as its language-model loss is cp x its share (hybrid/cp/loss.py) and the gradients are averaged over
DP x CP: Megatron's MoEAuxLossAutoScaler.set_loss_scale(loss_scale * cp_size / num_microbatches).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from hybrid.comm import Group
from hybrid.moe import dispatch as dsp
from hybrid.moe.comm import all_to_all, gather_rows, gather_rows_v, reduce_scatter_rows, reduce_scatter_rows_v
from hybrid.moe.config import Dispatcher, LoadBalancing, MoEConfig
from hybrid.moe.experts import LocalExperts, _Weight
from hybrid.moe.router import (Router, Routing, hf_aux_weights, route, seq_aux_loss, switch_aux_loss,
                               tokens_per_expert, z_loss)
from hybrid.tp import TPContext


@dataclass(frozen=True)
class ExpertContext:
    """What an MoE layer needs of the run: the training choices and its expert-parallel groups.

    Attributes:
        config: the MoE flags (hybrid/moe/config.py).
        ep: the expert-parallel group (None: one rank holds every expert).
        etp: the expert-tensor-parallel group, splitting each expert's width (None: each expert whole).
        cp: the context-parallel group: its ranks hold other tokens of the same sequences (None: cp 1).
        tp_cp: TP x CP in one group (Mesh.tp_cp, built when both exceed 1): the balancing loss's counts are
            all-reduced over it in one call (Megatron's tp_cp_group); None: over TP (under SP), then CP.
    """

    config: MoEConfig = field(default_factory=MoEConfig)
    ep: Group | None = None
    etp: Group | None = None
    cp: Group | None = None
    tp_cp: Group | None = None

    @property
    def ep_size(self) -> int:
        return 1 if self.ep is None else self.ep.size

    @property
    def cp_size(self) -> int:
        return 1 if self.cp is None else self.cp.size

    @property
    def etp_size(self) -> int:
        return 1 if self.etp is None else self.etp.size

    def local_experts(self, num_experts: int) -> range:
        per = num_experts // self.ep_size
        r = 0 if self.ep is None else self.ep.rank
        return range(r * per, (r + 1) * per)


def in_recompute() -> bool:
    """True while autograd runs a backward pass: a forward running then is activation recomputation, whose
    routing must not be counted again (statistics, the expert-bias loads, the pooled counts)."""
    return torch._C._current_graph_task_id() != -1


class _AttachAux(torch.autograd.Function):
    """y = x; in backward `stat` also gets the gradient coef() * scale -- the gradient of the auxiliary loss
    <coef, stat>, whose coefficients may be known only after the whole forward (hf_aux_loss)."""

    @staticmethod
    def forward(ctx, x, stat, coef, scale):
        ctx.coef, ctx.scale = coef, scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g, ctx.coef() * ctx.scale, None, None


def _ones(t: torch.Tensor):
    return lambda: torch.ones_like(t)


@dataclass
class HFPool:
    """transformers' pooled load-balancing loss of one forward: the counts C (E,) of every MoE layer so far
    (over the TP x CP group) and the detached probability sums, for the loss value."""

    counts: torch.Tensor
    psum: torch.Tensor
    layers: int
    tokens: int
    coeff: float

    def value(self) -> float:
        """This rank's share of the loss (the shares sum over TP x CP to transformers' value)."""
        return float((hf_aux_weights(self.counts, self.layers, self.tokens, self.coeff) * self.psum).sum())


class MoELayer(nn.Module):
    """The MoE block of one layer (module docstring). Parameter names follow transformers' Qwen2-MoE:
    `gate.weight` (router), `experts.<e>.{gate,up,down}_proj.weight`, `shared_expert.*`,
    `shared_expert_gate.weight`; models/hf_io.py maps Mixtral's."""

    def __init__(self, cfg, tp: TPContext, moe: ExpertContext, act, shared: nn.Module | None = None):
        super().__init__()
        self.cfg, self.tp, self.moe, mc = cfg, tp, moe, moe.config
        E, h = cfg.num_experts, cfg.hidden_size
        if mc.dispatcher is Dispatcher.ALLGATHER and moe.etp_size > 1:
            raise ValueError("--moe-token-dispatcher-type allgather with --expert-tensor-parallel-size > 1 is not "
                             "implemented; use alltoall")
        self.gate = Router(h, E, tp, expert_bias=mc.expert_bias)
        local = moe.local_experts(E)
        self.experts = LocalExperts(h, cfg.moe_ffn_hidden_size, local.start, len(local), act, mc.experts_impl,
                                    moe.etp_size, 0 if moe.etp is None else moe.etp.rank)
        self.first_expert = local.start
        if shared is not None:
            self.shared_expert = shared
            if cfg.moe_shared_expert_gate:
                self.shared_expert_gate = _Weight(1, h, tp.replicated_spec(), expert=False)
        self.score_function = mc.score_function or "softmax"
        self.bias_counts: torch.Tensor | None = None
        # full recomputation reruns this forward in backward; its routing must be the original's, not a new
        # top-k (a last-bit difference in the recomputed logits can flip a near tie, and the experts' all-to-all
        # sizes would no longer match the saved tensors nor the peers': Megatron's router replay). The choices
        # of each forward wait here, oldest first -- backward runs the micro-batches in forward order.
        self.recompute = "none"  # set by models.common.set_recompute (a Recompute, compared by its value)
        self._replay: deque = deque()
        self.aux_grad_scale = 1.0  # loss scale / micro-batches of the current step (set_aux_grad_scale)
        self.pool_owner = False  # hf_aux_loss: this is the stage's first MoE layer, it opens each forward's pool
        self.pool_ref: list = [None]  # shared by the stage's MoE layers: the current HFPool
        self.moe_layers = 1  # MoE layers of the model (hf_aux_loss normalises by it)
        self.reset_stats()

    # --- statistics of the step (logging, the expert-bias update) ---------------------------------------
    def reset_stats(self) -> None:
        self.stat_counts: torch.Tensor | None = None  # (E,) slots routed to each expert, this rank's tokens
        self.stat_aux = 0.0  # this rank's share of the balancing loss, summed over micro-batches
        self.stat_z = 0.0
        self.pools: list[HFPool] = []

    def _record(self, counts: torch.Tensor) -> None:
        self.stat_counts = counts.detach().clone() if self.stat_counts is None else self.stat_counts + counts
        if self.gate.expert_bias is not None:  # this step's loads, for the bias update (runtime.after_step)
            self.bias_counts = counts.detach().clone() if self.bias_counts is None else self.bias_counts + counts

    # --- forward ----------------------------------------------------------------------------------------
    # Eager under --compile (compile_blocks, hybrid/train/loop.py, traces each block's body): one graph break at
    # this call, and the block's dense parts (norms, attention, residuals) compile at shapes that never change.
    # Traced, the layer's data-dependent sizes -- bincount's counts, the kept rows, the experts' blocks and the
    # all-to-all's splits (.tolist()) -- broke the graph at each and recompiled whenever the routing moved them:
    # tiny-mixtral at ep 2, 28 breaks and 20 recompilations a rank in 10 steps, steps of 1-10 s (docs/moe.md). As
    # torchtitan's apply_compile, which leaves its experts' dispatch and combine uncompiled. The wrapper costs
    # ~2 us a call eagerly; it imports dynamo at its first call only (models has imported it already).
    @torch._disable_dynamo
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape  # T: this rank's tokens of each sequence (T / tp under sequence parallelism)
        flat = x.reshape(-1, C)
        replaying = in_recompute()
        replay = self._replay.popleft() if replaying and self._replay else (None, None)
        r = route(self.gate(flat), self.cfg.moe_top_k, self.cfg.moe_router_pre_softmax,
                  self.cfg.moe_norm_topk_prob, self.score_function, self.gate.expert_bias, chosen=replay[0])
        counts = tokens_per_expert(r.experts, self.cfg.num_experts)
        recording = self.training and not replaying
        if recording:
            self._record(counts)
        keep, pad = self._capacity(r, flat.shape[0])
        if replay[1] is not None:
            keep = replay[1]
        if recording and getattr(self.recompute, "value", self.recompute) == "full":
            self._replay.append((r.experts.detach(), keep))
        y = self._dispatch(flat, r, keep, pad)
        y = self._balance(y, r, counts, B, T, recording).view(B, T, C)
        if hasattr(self, "shared_expert"):
            s = self.shared_expert(x)
            if hasattr(self, "shared_expert_gate"):
                s = torch.sigmoid(F.linear(x, self.shared_expert_gate.weight)) * s
            y = y + s
        return y

    def _capacity(self, r: Routing, n: int) -> tuple[torch.Tensor | None, int | None]:
        factor = self.moe.config.capacity_factor
        if factor is None:
            return None, None
        cap = dsp.capacity(n, self.cfg.num_experts, self.cfg.moe_top_k, factor)
        return dsp.capacity_keep(r.probs, r.experts, self.cfg.num_experts, cap), \
            (cap if self.moe.config.pad_to_capacity else None)

    def _dispatch(self, x: torch.Tensor, r: Routing, keep, pad) -> torch.Tensor:
        if self.moe.config.dispatcher is Dispatcher.ALLGATHER and self.moe.ep_size > 1:
            return self._allgather(x, r, keep)
        return self._alltoall(x, r, keep, pad)

    def _alltoall(self, x: torch.Tensor, r: Routing, keep, pad) -> torch.Tensor:
        """Permute by expert, all-to-all the blocks to their EP ranks (counts first), run, and back."""
        N, k = r.experts.shape
        d = dsp.permutation(r.experts, self.cfg.num_experts, keep, pad)
        valid = d.rows >= 0
        tok = torch.where(valid, d.rows // k, N)  # padding rows read (and write) the zero row N
        xr = torch.cat([x, x.new_zeros(1, x.shape[1])])[tok]  # (R, h)
        ep = self.moe.ep
        if self.moe.ep_size == 1:
            yr = self._expert_tp(xr, d.counts.view(1, -1))
        else:
            send = d.counts.view(ep.size, -1)  # (ep, E_l): rows for each rank's experts
            recv = ep.all_to_all_v(send.flatten(), [send.shape[1]] * ep.size, [send.shape[1]] * ep.size,
                                        tag="counts").view(ep.size, -1)  # rows each rank sends our experts
            in_splits, out_splits = send.sum(1).tolist(), recv.sum(1).tolist()
            out = self._expert_tp(all_to_all(xr, ep, out_splits, in_splits), recv)
            yr = all_to_all(out, ep, in_splits, out_splits)
        w = torch.where(valid, r.probs.flatten()[d.rows.clamp(min=0)], 0.0)
        y = x.new_zeros(N + 1, x.shape[1]).index_add(0, tok, yr * w.unsqueeze(1).to(yr.dtype))
        return y[:N]

    def _expert_tp(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Our local experts on `rows`, which arrive in blocks (source, expert) with (S, E_l) `counts`; outputs in
        the same order. With expert-TP (etp ranks, each holding a width slice of every local expert) first
        all-gather-v the group's rows, run the slices on all of them, and reduce-scatter-v the partial sums
        back (Megatron's alltoall dispatcher with tp_size > 1):

            X = [X_0; ..; X_{etp-1}]  (each rank's rows)      Y_j = sum_i expert^i(X_j)  back to rank j"""
        etp = self.moe.etp
        if self.moe.etp_size == 1 and counts.shape[0] == 1:
            return self.experts(rows, counts[0].tolist())  # one source: already expert-major
        sizes = None
        if self.moe.etp_size > 1:
            counts = etp.all_gather(counts.flatten().unsqueeze(0), dim=0).view(-1, counts.shape[1])  # (etp S, E_l)
            sizes = counts.view(etp.size, -1).sum(1).tolist()  # rows of each expert-TP rank
            rows = gather_rows_v(rows, etp, sizes)
        order = dsp.expert_major(counts)
        out = self.experts(rows[order], counts.sum(0).tolist())[torch.argsort(order)]
        return out if sizes is None else reduce_scatter_rows_v(out, etp, sizes)

    def _allgather(self, x: torch.Tensor, r: Routing, keep) -> torch.Tensor:
        """Gather every EP rank's tokens and routing, run our experts on the rows routed to them, and
        reduce-scatter the summed outputs back to each token's rank."""
        ep, k = self.moe.ep, self.cfg.moe_top_k
        X = gather_rows(x, ep)
        experts = ep.all_gather(r.experts, dim=0)
        probs = gather_rows(r.probs, ep)
        mine = (experts >= self.first_expert) & (experts < self.first_expert + len(self.experts))
        if keep is not None:
            mine &= ep.all_gather(keep, dim=0)
        d = dsp.permutation((experts - self.first_expert).clamp(0, len(self.experts) - 1), len(self.experts), mine)
        tok = d.rows // k
        yr = self.experts(X[tok], d.counts.tolist())
        Y = X.new_zeros(X.shape).index_add(0, tok, yr * probs.flatten()[d.rows].unsqueeze(1).to(yr.dtype))
        return reduce_scatter_rows(Y, ep)

    # --- balancing losses -------------------------------------------------------------------------------
    def _tp_split(self) -> int:
        """TP ranks the micro-batch's tokens are spread on: tp under sequence parallelism, else 1."""
        return self.tp.size if self.tp.sequence_parallel else 1

    def _group_counts(self, counts: torch.Tensor) -> torch.Tensor:
        """Counts over the micro-batch's tokens: summed over the TP group under sequence parallelism and over the
        CP group -- in one all-reduce over TP x CP when both split them."""
        if self._tp_split() > 1 and self.moe.cp_size > 1 and self.moe.tp_cp is not None:
            return self.moe.tp_cp.all_reduce(counts.clone(), tag="moe")
        if self._tp_split() > 1:
            counts = self.tp.group.all_reduce(counts.clone(), tag="moe")
        if self.moe.cp_size > 1:
            counts = self.moe.cp.all_reduce(counts.clone(), tag="moe")
        return counts

    def _balance(self, y: torch.Tensor, r: Routing, counts: torch.Tensor, B: int, T: int, recording: bool):
        mc, k = self.moe.config, self.cfg.moe_top_k
        if not self.training:  # evaluation: no backward, no statistics
            return y
        split = self._tp_split() * self.moe.cp_size  # ranks the micro-batch's tokens are spread on (TP x CP)
        scale = self.aux_grad_scale * self.moe.cp_size  # CP: a share's gradient weighs cp, as the LM loss's does
        coeff, kind = mc.aux_coeff, mc.load_balancing
        if coeff > 0 and kind is LoadBalancing.AUX_LOSS:
            aux = switch_aux_loss(r.scores, self._group_counts(counts), B * T * split, k, coeff)
            y = _AttachAux.apply(y, aux, _ones(aux), scale)
            self.stat_aux += float(aux.detach()) if recording else 0.0
        elif coeff > 0 and kind is LoadBalancing.SEQ_AUX_LOSS:
            per_seq = torch.zeros(B, self.cfg.num_experts, device=y.device).scatter_add_(
                1, r.experts.view(B, -1), torch.ones(B, T * k, device=y.device))
            aux = seq_aux_loss(r.scores.view(B, T, -1), self._group_counts(per_seq), T * split, k, coeff)
            y = _AttachAux.apply(y, aux, _ones(aux), scale)
            self.stat_aux += float(aux.detach()) if recording else 0.0
        elif coeff > 0 and kind is LoadBalancing.HF_AUX_LOSS:
            y = self._hf_pooled(y, r, counts, B * T * split, coeff, recording, scale)
        if mc.z_loss_coeff > 0:
            z = z_loss(r.logits, mc.z_loss_coeff) / split  # mean over the micro-batch = sum of the ranks' shares
            y = _AttachAux.apply(y, z, _ones(z), scale)
            self.stat_z += float(z.detach()) if recording else 0.0
        return y

    def _hf_pooled(self, y, r: Routing, counts, tokens: int, coeff: float, recording: bool, scale: float):
        """transformers' loss pooled over the model's MoE layers: its gradient with respect to this layer's
        probability sums is coeff E C / (L T)^2 (router.hf_aux_weights), C the counts of *all* layers -- read
        in backward, when the whole forward has run."""
        if recording:
            if self.pool_owner:
                E = self.cfg.num_experts
                self.pool_ref[0] = HFPool(torch.zeros(E, device=y.device), torch.zeros(E, device=y.device),
                                          self.moe_layers, tokens, coeff)
                self.pools.append(self.pool_ref[0])
            pool = self.pool_ref[0]
            pool.counts += self._group_counts(counts)
            pool.psum += r.scores.detach().sum(0)
        pool = self.pool_ref[0]
        psum = r.scores.sum(0)
        return _AttachAux.apply(y, psum, lambda: hf_aux_weights(pool.counts, pool.layers, pool.tokens, pool.coeff),
                                scale)
