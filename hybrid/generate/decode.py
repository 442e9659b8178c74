"""`hybrid generate`: greedy or sampled decoding from a hybrid checkpoint or a transformers folder, with a KV
cache, at any TP x PP under torchrun -- the sanity check after a conversion or a run.

    greedy:   x_{t+1} = argmax_v z_t(v)
    sampled:  x_{t+1} ~ softmax(filter(z_t / temperature)),  filter = top-k, then top-p (nucleus)
              (the order of transformers' generate: TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

z_t is the last position's logits. The first forward runs the prompt and fills the KV cache; each later one
feeds only the newest token (models/common.KVCache: keys and values of the tokens seen so far, at their
positions). At tp t every rank holds its heads' cache and its vocabulary slice of z; the slices are
all-gathered, every rank picks the same token from the same logits with the same seeded generator, and rank
0's pick is broadcast so the ranks can never drift apart. At pp p > 1 (world = t x p) each stage holds the
layers hybrid.partition gives it (uniform, or --pipeline-layers-per-stage) and their KV cache; a step runs
stage 0 (embedding) -> ... -> stage p-1 (head), each sending its (B, T, C) hidden states to the next
(point-to-point over the pp group); the last stage picks the token and broadcasts it over the pp group, so
every stage feeds the same token to the next step. One micro-batch, no overlap: one stage works at a time.

The prompt is text -- through the tokenizer carried with SRC, the one the run recorded, or UTF-8 bytes (the
byte-level vocabulary of train.py's built-in data) -- or explicit token ids.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

import torch

from hybrid.cliutil import check_number
from hybrid.comm import Group
from hybrid.convert.detect import Format, detect

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")


# --- choosing the next token ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen from the logits.

    Attributes:
        temperature: 0 = greedy (argmax); > 0 samples from softmax(z / temperature).
        top_k: sample among the k largest logits only (0: all).
        top_p: sample from the smallest set of most probable tokens whose probability reaches top_p (1: all).
        seed: the sampling generator's seed: the same seed, model and prompt give the same tokens.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        check_number("--temperature", self.temperature, 0)
        check_number("--top-k", self.top_k, 0, integer=True)
        check_number("--top-p", self.top_p, 0, 1, low_open=True)
        check_number("--seed", self.seed, 0, integer=True)
        if self.temperature == 0 and (self.top_k or self.top_p < 1):
            flag = "--top-k" if self.top_k else "--top-p"
            raise ValueError(f"{flag} filters sampling, but --temperature is 0 (greedy); give --temperature > 0 "
                             f"(1 = the model's own distribution)")
        if self.temperature == 0 and self.seed:  # greedy draws nothing: the seed would change nothing
            raise ValueError(f"--seed {self.seed} seeds sampling, but --temperature is 0 (greedy, no draws); give "
                             f"--temperature > 0 or drop --seed")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def describe(self) -> str:
        if self.greedy:
            return "greedy"
        return (f"sampled: temperature {self.temperature:g}, top-k {self.top_k or 'off'}, "
                f"top-p {self.top_p:g}, seed {self.seed}")


def filter_logits(z: torch.Tensor, s: SamplingConfig) -> torch.Tensor:
    """(B, V) logits -> z / temperature with -inf outside top-k, then outside top-p.

    top-k keeps z_v >= the k-th largest value (ties at it stay). top-p sorts the tokens by probability,
    p_(1) >= p_(2) >= ..., and keeps token (i) while the mass before it, p_(1) + ... + p_(i-1), is below top_p:
    the smallest prefix whose mass reaches top_p (Holtzman et al. 2020); the most probable token always stays."""
    z = z / s.temperature
    if s.top_k:
        kth = torch.topk(z, min(s.top_k, z.shape[-1]), dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if s.top_p < 1:
        p_sorted, order = torch.softmax(z, dim=-1).sort(dim=-1, descending=True)
        before = p_sorted.cumsum(dim=-1) - p_sorted
        drop = torch.zeros_like(before, dtype=torch.bool).scatter(-1, order, before >= s.top_p)
        z = z.masked_fill(drop, float("-inf"))
    return z


def next_tokens(z: torch.Tensor, s: SamplingConfig, gen: torch.Generator) -> torch.Tensor:
    """(B, V) fp32 logits -> (B, 1) token ids."""
    if s.greedy:
        return z.argmax(-1, keepdim=True)
    probs = torch.softmax(filter_logits(z, s), dim=-1)
    return torch.multinomial(probs.cpu(), 1, generator=gen).to(z.device)


# --- decoding -------------------------------------------------------------------------------------------------
def full_logits(z: torch.Tensor, tp: Group, vocab: int) -> torch.Tensor:
    """(B, V_padded / t) vocab-parallel logits of one position -> (B, V) fp32: the TP slices concatenated in
    rank order (rank r holds rows [r V_p/t, (r+1) V_p/t)), the padding rows dropped."""
    return tp.all_gather(z.float().contiguous(), dim=-1)[..., :vocab]


def stage_forward(model: torch.nn.Module, feed: torch.Tensor, cache, pp: Group, hidden: int) -> torch.Tensor:
    """This stage's part of one forward: stage 0 embeds the (B, T) token ids, a later stage receives the
    previous stage's (B, T, C) hidden states; a stage that is not the last sends its output on. Every stage
    knows T (all hold the same ids), so the receive buffer's shape needs no handshake."""
    x = feed
    if pp.rank > 0:
        dtype = next(model.parameters()).dtype
        x = torch.empty(feed.shape + (hidden,), dtype=dtype, device=feed.device)
        pp.batch_p2p([], [(x, pp.rank - 1)], labels=("hidden",))
    y = model(x, cache=cache)
    if pp.rank < pp.size - 1:
        pp.batch_p2p([(y.contiguous(), pp.rank + 1)], [], labels=("hidden",))
    return y


@torch.no_grad()
def generate(model: torch.nn.Module, ids: torch.Tensor, new_tokens: int, max_len: int, vocab: int,
             sampling: SamplingConfig = SamplingConfig(), tp: Group | None = None,
             use_cache: bool = True, on_logits=None, pp: Group | None = None, hidden: int = 0) -> torch.Tensor:
    """(B, T) prompt -> (B, T + n), n = min(new_tokens, max_len - T). Without the cache every step re-runs the
    whole sequence (O(T^2) work; the reference the cached path is tested against). `on_logits(step, z)` sees
    each step's (B, V) logits (on the last pipeline stage). With `pp` (size > 1) `model` is this rank's stage
    and `hidden` the model's hidden size; every rank returns the same ids."""
    from models.common import KVCache
    tp, pp = tp or Group.solo("tp"), pp or Group.solo("pp")
    last = pp.rank == pp.size - 1
    cache = KVCache() if use_cache else None  # this stage's layers only
    gen = torch.Generator().manual_seed(sampling.seed)
    feed = ids
    for step in range(min(new_tokens, max_len - ids.shape[1])):
        y = stage_forward(model, feed, cache, pp, hidden)
        nxt = torch.empty(ids.shape[0], 1, dtype=ids.dtype, device=ids.device)
        if last:
            z = full_logits(y[:, -1], tp, vocab)
            if on_logits is not None:
                on_logits(step, z)
            nxt = tp.broadcast(next_tokens(z, sampling, gen).to(ids.dtype).contiguous(), 0)
        nxt = pp.broadcast(nxt, pp.size - 1)  # the last stage's pick to every stage (same tp rank)
        ids = torch.cat([ids, nxt], dim=1)
        feed = nxt if use_cache else ids
    return ids


# --- the model and its weights --------------------------------------------------------------------------------
def _load_hybrid_shards(model: torch.nn.Module, it_dir: str, tp_rank: int, world: Group) -> None:
    """Each parameter's TP shard from the checkpoint: one ShardedTensor per parameter whose chunk is this rank's
    shard box (hybrid/checkpoint/shards.shard_box, the rows a run at this tp saves), read by DCP from whatever
    chunks the checkpoint holds."""
    from hybrid.checkpoint import safe_read
    from hybrid.checkpoint.shards import shard_box, sharded_tensor
    from hybrid.tp.sharding import full_shape, spec_of
    sd = {}
    for name, p in model.named_parameters():
        box = shard_box(p, tp_rank)
        if box is None:
            continue  # a shard of vocabulary padding only
        view = p.data[tuple(slice(0, s) for s in box[1])]  # the real rows sit first in the local shard
        sd[f"model/{name}"] = sharded_tensor([view], [box], full_shape(p, spec_of(p)))
    # .metadata: only DCP's own classes (safe_read.py); DCP's collectives on the world group, counted (Group.delegate)
    if world.size == 1:
        safe_read.load(sd, it_dir, no_dist=True)
    else:
        world.delegate("dcp_load", lambda pg: safe_read.load(sd, it_dir, process_group=pg))


def load_model(cfg, folder: str, hybrid: bool, tp: Group | None = None, pp: Group | None = None,
               stages: list[tuple[int, ...]] | None = None, world: Group | None = None) -> torch.nn.Module:
    """Our model at this TP rank and pipeline stage (eval mode; the stage's layers from `stages`, one per pp
    rank, as the trainer builds its chunks: models.build_pipeline_chunks), its weights read from the checkpoint
    directory `folder` (hybrid) or the transformers folder (each rank reads only its rows and its layers).
    `world`: every rank's group, which a hybrid checkpoint's read runs on (None: the default process group)."""
    from hybrid.tp import TPContext
    from models import build_pipeline_chunks
    from models.hf_io import load_hf_checkpoint
    tp, pp = tp or Group.solo("tp"), pp or Group.solo("pp")
    net = build_pipeline_chunks(cfg, TPContext(tp), pp.rank, pp.size, 1, stages=stages, seed=None)[0].eval()
    if not hybrid:
        load_hf_checkpoint(net, folder, tp.rank)
        return net
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()  # vocabulary padding rows stay zero (they are in no checkpoint)
    _load_hybrid_shards(net, folder, tp.rank, world or _default_world(tp.size * pp.size))
    return net


def _default_world(size: int) -> Group:
    """Every rank over the default process group (a caller that brings no mesh), counted on a ledger of its own."""
    import torch.distributed as dist

    from hybrid.comm import CommLedger
    if size == 1:
        return Group.solo("world")
    return Group("world", tuple(range(dist.get_world_size())), dist.group.WORLD, CommLedger())


def read_source(src: str, model: str | None):
    """(config, checkpoint directory or transformers folder, state.json or None), checked, with no weights
    read: a hybrid checkpoint's files against its manifest and its tensors against the config."""
    from hybrid.checkpoint import store
    from hybrid.convert.common import check_safetensors, read_config
    from hybrid.convert.to_hf import check_against, checkpoint_config, iteration_dir
    from models.hf_io import check_checkpoint
    fmt = detect(src, deepspeed=False)  # (round 19: its errors offered a DeepSpeed folder, which it then refused)
    if fmt is Format.HYBRID:
        it_dir = iteration_dir(src, None)
        cfg = checkpoint_config(it_dir, model)
        check_against(cfg, it_dir)
        return cfg, it_dir, store.read_state(it_dir)
    if fmt is not Format.HF:
        raise ValueError(f"SRC {src!r}: generate reads a hybrid checkpoint or a transformers folder; convert it first")
    if model is not None:
        raise ValueError("--model: a transformers SRC carries its own config.json; drop --model")
    cfg = read_config(src, "SRC")
    check_safetensors(src)  # a truncated file: one line here, not safetensors' traceback at the load
    # every tensor's shape against config.json, on the meta device (round 19: found by the load, after the process
    # group started, each rank printing "--load SRC: ...", a flag generate does not take)
    check_checkpoint(cfg, src, "SRC")
    return cfg, src, None


# --- the tokenizer --------------------------------------------------------------------------------------------
@dataclass
class TextCodec:
    """encode / decode of the prompt and output, and where it came from (printed)."""

    source: str
    encode: object
    decode: object
    vocab_size: int = 256  # the ids it can encode or decode (bytes: 256)
    guessed: bool = False  # bytes as the last resort (no tokenizer given, carried or recorded): no size to check


def _bytes_codec(why: str, guessed: bool = False) -> TextCodec:
    return TextCodec(f"UTF-8 bytes ({why})", lambda text: list(text.encode("utf-8")),
                     lambda ids: bytes(x for x in ids if x < 256).decode("utf-8", "replace"), guessed=guessed)


def _tokenizer_codec(path: str, why: str) -> TextCodec:
    """_read_tokenizer, with a file that does not parse (truncated, another format) as one line naming it."""
    import json
    files = [os.path.join(path, n) for n in sorted(os.listdir(path)) if n.endswith(".json")] \
        if os.path.isdir(path) else [path]
    for f in files:  # each JSON file parses: the error can then name the one that does not
        if not os.path.isfile(f) and not os.path.isdir(f):  # read whole below: a FIFO would hang, /dev/zero fill memory
            raise ValueError(f"tokenizer {f} ({why}): not a regular file (a FIFO, a device or a dangling link); give "
                             f"--tokenizer a tokenizer folder or its tokenizer.json, or --prompt-ids")
        if os.path.isdir(f):
            continue
        try:
            with open(f, "rb") as fh:
                json.loads(fh.read().decode("utf-8"))
        except (ValueError, RecursionError, OSError) as e:
            raise ValueError(f"tokenizer {f} ({why}): not readable JSON ({type(e).__name__}: "
                             f"{(str(e).strip().splitlines() or [''])[0][:120]}); give --tokenizer or --prompt-ids")
    try:
        return _read_tokenizer(path, why)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        error: Exception = e
    except ValueError:  # ours: names the file already
        raise
    except Exception as e:  # tokenizers' "EOF while parsing", transformers' KeyError on a partial tokenizer.json
        error = e
    raise ValueError(f"tokenizer {path} ({why}): not a readable tokenizer ({type(error).__name__}: "
                     f"{(str(error).strip().splitlines() or [''])[0][:160]}); give --tokenizer or --prompt-ids")


def _read_tokenizer(path: str, why: str) -> TextCodec:
    """A transformers tokenizer folder (AutoTokenizer: its special tokens, e.g. BOS, as transformers adds them),
    or a bare tokenizers JSON as train.py's --tokenizer-model (no special tokens: as the data were encoded)."""
    folder = path if os.path.isdir(path) else None
    if folder is not None and os.path.isfile(os.path.join(folder, "tokenizer_config.json")):
        tok = _auto_tokenizer(folder, why)
        return TextCodec(f"{path} ({why})", lambda text: tok(text)["input_ids"], tok.decode, len(tok))
    from tokenizers import Tokenizer

    from hybrid.data.tokenizer import tokenizer_file
    tok = Tokenizer.from_file(tokenizer_file(path, "--tokenizer"))
    return TextCodec(f"{path} ({why})", lambda text: tok.encode(text, add_special_tokens=False).ids, tok.decode,
                     tok.get_vocab_size())


def _auto_tokenizer(folder: str, why: str):
    """transformers' AutoTokenizer on a folder whose JSON files parse (_tokenizer_codec read them). A
    tokenizer_config.json with an `auto_map` names Python files of the folder to import: hybrid never runs them
    (nor asks transformers to: no trust_remote_code), and says so in one line rather than transformers' three,
    which send the user to a Hub page for a local folder. Any other refusal of transformers: its first line."""
    import json
    with open(os.path.join(folder, "tokenizer_config.json"), "rb") as f:
        config = json.loads(f.read().decode("utf-8"))
    if isinstance(config, dict) and "auto_map" in config:
        raise ValueError(f"tokenizer {folder} ({why}): its tokenizer_config.json names custom code (auto_map), "
                         f"which is never run; give --tokenizer a folder without it (or its tokenizer.json alone) "
                         f"or --prompt-ids")
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(folder)
    except (ValueError, OSError) as e:
        raise ValueError(f"tokenizer {folder} ({why}): transformers cannot load it ({type(e).__name__}: "
                         f"{(str(e).strip().splitlines() or [''])[0][:160]}); give --tokenizer or --prompt-ids") \
            from None


def _has_tokenizer(d: str | None) -> bool:
    return bool(d) and os.path.isdir(d) and any(os.path.isfile(os.path.join(d, n)) for n in TOKENIZER_FILES)


def find_codec(given: str | None, folder: str, state: dict | None) -> TextCodec:
    """--tokenizer; else tokenizer files carried with SRC (a conversion copies them); else, for a checkpoint of a
    train.py run, the run's --tokenizer-type / --tokenizer-model, or the files in the folder its --model named;
    else UTF-8 bytes (train.py's built-in and text-file data are byte tokens)."""
    if given is not None:
        if not os.path.exists(given):
            raise ValueError(f"--tokenizer {given!r} does not exist; give a tokenizer folder or tokenizer.json")
        return _tokenizer_codec(given, "--tokenizer")
    parent = os.path.dirname(os.path.abspath(folder))
    for d in (folder, parent) if state is not None else (folder,):
        if _has_tokenizer(d):
            return _tokenizer_codec(d, "carried with SRC")
    if state is None:
        return _bytes_codec("SRC carries no tokenizer", guessed=True)
    args, model = state.get("args", {}), state.get("model")
    if args.get("tokenizer_type") == "ByteLevel":
        return _bytes_codec("the run's --tokenizer-type ByteLevel")
    if args.get("tokenizer_type") == "HuggingFaceTokenizer" and args.get("tokenizer_model"):
        if os.path.exists(args["tokenizer_model"]):
            return _tokenizer_codec(args["tokenizer_model"], "the run's --tokenizer-model")
        raise ValueError(f"the run's --tokenizer-model {args['tokenizer_model']!r} no longer exists; give "
                         f"--tokenizer (its tokenizer.json) or --prompt-ids")
    if _has_tokenizer(model):
        return _tokenizer_codec(model, "the run's --model folder")
    return _bytes_codec("the run recorded no tokenizer", guessed=True)


def prompt_ids(args: argparse.Namespace, cfg, codec: TextCodec) -> torch.Tensor:
    """(1, T) token ids of the prompt, checked against the vocabulary and the context."""
    if args.prompt_ids is not None:
        try:
            ids = [int(x) for x in args.prompt_ids.split(",")]
        except ValueError:
            raise ValueError(f"--prompt-ids {args.prompt_ids!r}: give comma-separated token ids, e.g. 1,2,3") from None
    else:
        ids = codec.encode(args.prompt)
    if not ids:  # --prompt "" ("0 tokens, 0 outside the vocabulary" named no cause); --prompt-ids '' fails its parse
        raise ValueError("--prompt is empty (0 tokens); give a prompt of at least one token")
    flag = "--prompt-ids" if args.prompt_ids is not None else "--prompt"
    n = f"{len(ids)} token{'' if len(ids) == 1 else 's'}"
    bad = [i for i in ids if not 0 <= i < cfg.vocab_size]
    if bad:
        raise ValueError(f"{flag}: {n}, {len(bad)} outside the vocabulary [0, {cfg.vocab_size}); "
                         f"give a non-empty --prompt or --prompt-ids below {cfg.vocab_size}")
    if len(ids) >= cfg.max_position_embeddings:
        raise ValueError(f"{flag}: {n}, the model's context is {cfg.max_position_embeddings} (the prompt and at "
                         f"least one new token must fit); give a shorter prompt")
    return torch.tensor([ids])


# --- the command ----------------------------------------------------------------------------------------------
