"""What the data loader hands a context-parallel rank: its load-balanced tokens, their positions, and (for packed
documents) the document id of every position.

Megatron's `get_ltor_masks_and_position_ids` with `--reset-attention-mask` / `--reset-position-ids`: a sample of
seq_length tokens cut from documents packed end to end holds several documents, each ending with the end-of-
document token (eod). With

    doc(t)  = number of eod tokens at positions < t         (the eod belongs to the document it ends)
    pos(t)  = t - (index of the first token of doc(t))

`--reset-attention-mask` lets a token see only earlier tokens of its own document (doc(i) == doc(j)), and
`--reset-position-ids` restarts the positions (RoPE angles, learned positions) at 0 in each document -- so each
document is computed as if it were alone. Without the flags doc = 0 and pos = t.

CP rank r then keeps the tokens at `local_indices(r, CP, T)` (hybrid/cp/balance.py) of the inputs, the labels
(already shifted over the whole sequence, so every label is the right next token) and the positions; the
document ids stay whole, (B, T), because a rank's queries meet keys from every other rank's positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybrid.cp.balance import local_indices


@dataclass(frozen=True)
class SequenceInfo:
    """One micro-batch's token layout, passed to every pipeline stage with the micro-batch.

    Attributes:
        positions: (B, T/CP) int64 position id of each of this rank's tokens (RoPE angle / learned position).
        segments: (B, T) int64 document id of every position of the whole sequence (`--reset-attention-mask`),
            or None (one document per row).
    """

    positions: torch.Tensor
    segments: torch.Tensor | None = None

    def to(self, device: torch.device) -> "SequenceInfo":
        return SequenceInfo(self.positions.to(device), None if self.segments is None else self.segments.to(device))


def document_ids(tokens: torch.Tensor, eod: int) -> torch.Tensor:
    """(B, T) doc(t): the number of eod tokens strictly before t in each row."""
    is_eod = (tokens == eod).long()
    return torch.cumsum(is_eod, dim=1) - is_eod


def reset_positions(segments: torch.Tensor) -> torch.Tensor:
    """(B, T) position of each token within its document: t minus the first position of doc(t)."""
    B, T = segments.shape
    t = torch.arange(T).expand(B, T)
    starts = torch.ones_like(segments, dtype=torch.bool)
    starts[:, 1:] = segments[:, 1:] != segments[:, :-1]
    first = torch.cummax(torch.where(starts, t, torch.zeros_like(t)), dim=1).values
    return t - first


@dataclass(frozen=True)
class TokenSharding:
    """How the loader cuts each micro-batch for this rank (the `--context-parallel-size` and reset flags).

    Attributes:
        cp: context-parallel size; rank: this rank's index in its CP group.
        reset_attention_mask: document ids from `eod` (`--reset-attention-mask`).
        reset_position_ids: positions restart after each `eod` (`--reset-position-ids`).
        eod: the end-of-document token id (the tokenizer's), needed by either reset flag.
    """

    cp: int = 1
    rank: int = 0
    reset_attention_mask: bool = False
    reset_position_ids: bool = False
    eod: int | None = None

    @property
    def active(self) -> bool:
        return self.cp > 1 or self.reset_attention_mask or self.reset_position_ids

    @property
    def needs_info(self) -> bool:
        """Whether micro-batches carry a SequenceInfo (else positions follow from the CP rank alone)."""
        return self.reset_attention_mask or self.reset_position_ids

    def micro_batch(self, inputs: torch.Tensor, labels: torch.Tensor) -> tuple:
        """(inputs, labels) of the whole sequence -> this rank's (inputs, labels[, SequenceInfo])."""
        B, T = inputs.shape
        idx = local_indices(self.rank, self.cp, T)
        if not self.needs_info:
            return inputs[:, idx], labels[:, idx]
        docs = document_ids(inputs, self.eod)
        positions = reset_positions(docs) if self.reset_position_ids else torch.arange(T).expand(B, T)
        info = SequenceInfo(positions[:, idx].contiguous(), docs if self.reset_attention_mask else None)
        return inputs[:, idx], labels[:, idx], info

    def batches(self, batches: list) -> list:
        return [self.micro_batch(x, y) for x, y in batches] if self.active else batches

    def no_documents_line(self, batches: list) -> str | None:
        """One warning line when a reset flag finds no end-of-document token in `batches` (whole sequences, before
        batches()): each sample is then one document and the flag changes nothing -- data tokenized without
        --append-eod, or a tokenizer whose eod is not the data's (ByteLevel's id 0 on the default corpus, which has
        none). None when no reset flag is on or some sample holds the token."""
        if not self.needs_info or any(bool((x == self.eod).any()) for x, _ in batches):
            return None
        flags = " and ".join(f for f, on in (("--reset-attention-mask", self.reset_attention_mask),
                                             ("--reset-position-ids", self.reset_position_ids)) if on)
        return (f"warning: {flags}: no end-of-document token (id {self.eod}) in the first step's samples, so each "
                f"sample is one document and the flag changes nothing; tokenize the data with --append-eod "
                f"(scripts/preprocess_data.py) and the same --tokenizer-type / --tokenizer-model")


def seq_kwargs(info: list, device: torch.device) -> dict:
    """The model's `seq=` keyword for a micro-batch `(inputs, labels, *info)` that carries a SequenceInfo (the
    positions and document ids every pipeline stage needs), none for a plain `(inputs, labels)`."""
    return {"seq": info[0].to(device)} if info else {}
