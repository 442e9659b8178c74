"""Megatron-LM flags train.py does not take, with where their setting lives here: the one line an unknown flag gets
(hybrid.cliutil.OneLineParser's `hints`) names it instead of a near spelling that would mislead (--num-layers is
not --num-layers-per-virtual-pipeline-stage, --merge-file not --metrics-file, --ep not --help)."""

from __future__ import annotations

MODEL = "the model's shape comes from --model (a preset, or a transformers config.json: write {field} there)"

# Megatron's model-shape flags -> the config.json field that sets the same thing (transformers' names)
SHAPE_FIELDS = {
    "--num-layers": "num_hidden_layers",
    "--hidden-size": "hidden_size",
    "--ffn-hidden-size": "intermediate_size",
    "--num-attention-heads": "num_attention_heads",
    "--num-query-groups": "num_key_value_heads",
    "--group-query-attention": "num_key_value_heads",
    "--max-position-embeddings": "max_position_embeddings",
    "--vocab-size": "vocab_size",
    "--rotary-base": "rope_theta",
    "--untie-embeddings-and-output-weights": "tie_word_embeddings: false",
    "--num-experts": "num_local_experts (Mixtral) or num_experts (Qwen2-MoE)",
    "--moe-router-topk": "num_experts_per_tok",
    "--moe-ffn-hidden-size": "moe_intermediate_size (Qwen2-MoE; Mixtral's experts are intermediate_size wide)",
    "--moe-shared-expert-intermediate-size": "shared_expert_intermediate_size (Qwen2-MoE)",
}

# Megatron's (and torchtitan's) short and other names of flags train.py has
RENAMED = {
    "--tp": "--tensor-model-parallel-size", "--pp": "--pipeline-model-parallel-size",
    "--cp": "--context-parallel-size", "--ep": "--expert-model-parallel-size",
    "--etp": "--expert-tensor-parallel-size", "--expert-parallel-size": "--expert-model-parallel-size",
    "--use-distributed-optimizer": "--zero-stage 1 (Megatron's distributed optimizer shards the optimizer state: "
                                   "ZeRO stage 1)",
    "--moe-grouped-gemm": "--moe-experts-impl grouped",
}

TOKENIZER = ("a GPT-2 BPE tokenizer is one tokenizer.json here: --tokenizer-type HuggingFaceTokenizer "
             "--tokenizer-model tokenizer.json (transformers' AutoTokenizer.save_pretrained writes it)")


def hints() -> dict[str, str]:
    """{unknown flag: the one-line hint}, for train.py's parser."""
    out = {flag: f"{flag}: " + MODEL.format(field=field) for flag, field in SHAPE_FIELDS.items()}
    out.update({flag: f"{flag}: train.py's flag is {name}" for flag, name in RENAMED.items()})
    out.update({flag: f"{flag}: {TOKENIZER}" for flag in ("--vocab-file", "--merge-file")})
    return out
