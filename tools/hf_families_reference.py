#!/usr/bin/env python3
"""Reference logits from transformers for every model family runlm converts.

For each Hugging Face class (LlamaForCausalLM with llama3 RoPE scaling,
Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM with head_dim,
Gemma2ForCausalLM, Gemma3ForCausalLM, Phi3ForCausalLM, and the mixtures of
experts MixtralForCausalLM, Qwen3MoeForCausalLM, GptOssForCausalLM: 4 or 8
experts, top 2) this builds a tiny random model (hidden 256, a few layers,
the family's head size, fixed seed),
saves it with save_pretrained (safetensors, float32) next to a SentencePiece
tokenizer.model (the embedded stories260K vocabulary of 512 pieces: only the
token ids matter), and writes reference.json beside it:

  {"class": ..., "ids": [24 ids], "logits": [[512 floats] per id], "greedy": [32 ids]}

logits are float32 logits of the fixed id sequence; greedy continues it by
argmax, recomputing the whole sequence each step (no cache). Then
tools/check_hf_families.sh converts each directory with `runlm convert` and
compares runlm's logits and greedy ids with these.

  python3 tools/hf_families_reference.py OUT_DIR [--tokenizer PATH/tokenizer.model]

Needs python3 with torch, transformers and numpy only. Eager attention
everywhere (Gemma 2's attention soft-cap and gpt-oss's attention sinks are
only in the eager path). gpt-oss's YaRN is built with truncate=True (the
rounded correction range ggml, and so llama.cpp and runlm, use; its config
default, truncate=False, turns the angles of a few frequency pairs slightly),
and its sliding window is 16 so that it binds within the 56-token sequence.
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np
import torch
import transformers

VOCAB = 512
SEQ_LEN = 24
N_GREEDY = 32
SEED = 1234

COMMON = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def families():
    """(directory name, class name, config class name, config kwargs)."""
    return [
        ("llama3", "LlamaForCausalLM", "LlamaConfig", dict(
            COMMON, max_position_embeddings=2048, rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 32})),
        ("qwen2", "Qwen2ForCausalLM", "Qwen2Config", dict(
            COMMON, max_position_embeddings=2048, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False,
            use_sliding_window=False)),
        ("qwen3", "Qwen3ForCausalLM", "Qwen3Config", dict(
            COMMON, head_dim=128, max_position_embeddings=2048, rope_theta=1e6, rms_norm_eps=1e-6,
            tie_word_embeddings=False, use_sliding_window=False)),
        ("mistral_head_dim", "MistralForCausalLM", "MistralConfig", dict(
            COMMON, head_dim=128, max_position_embeddings=2048, rope_theta=1e6, rms_norm_eps=1e-5,
            sliding_window=None, tie_word_embeddings=False)),
        ("gemma2", "Gemma2ForCausalLM", "Gemma2Config", dict(
            COMMON, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1, head_dim=256,
            query_pre_attn_scalar=256, sliding_window=8, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
            max_position_embeddings=2048, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
            tie_word_embeddings=True)),
        ("gemma3", "Gemma3ForCausalLM", "Gemma3TextConfig", dict(
            COMMON, num_hidden_layers=6, num_attention_heads=2, num_key_value_heads=1, head_dim=256,
            query_pre_attn_scalar=256, sliding_window=8, max_position_embeddings=2048, rms_norm_eps=1e-6,
            rope_theta=1e6, rope_local_base_freq=10000.0, hidden_activation="gelu_pytorch_tanh",
            final_logit_softcapping=None, attn_logit_softcapping=None, tie_word_embeddings=True)),
        ("phi3", "Phi3ForCausalLM", "Phi3Config", dict(
            COMMON, num_key_value_heads=4, max_position_embeddings=4096, original_max_position_embeddings=4096,
            rope_theta=10000.0, rms_norm_eps=1e-5, sliding_window=None, tie_word_embeddings=False)),
        ("mixtral", "MixtralForCausalLM", "MixtralConfig", dict(
            COMMON, num_hidden_layers=3, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=2048,
            rope_theta=1e6, rms_norm_eps=1e-5, sliding_window=None, router_jitter_noise=0.0,
            tie_word_embeddings=False)),
        ("qwen3moe", "Qwen3MoeForCausalLM", "Qwen3MoeConfig", dict(
            COMMON, head_dim=128, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256,
            norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=2048,
            rope_theta=1e6, rms_norm_eps=1e-6, use_sliding_window=False, tie_word_embeddings=False)),
        ("gpt_oss", "GptOssForCausalLM", "GptOssConfig", dict(
            COMMON, num_hidden_layers=4, head_dim=64, num_local_experts=4, num_experts_per_tok=2,
            intermediate_size=256, sliding_window=16,
            layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(4)],
            max_position_embeddings=131072, rms_norm_eps=1e-5, attention_bias=True, tie_word_embeddings=False)),
    ]


def round_yarn_correction_range(config):
    """gpt-oss's default YaRN (factor 32 over 4096 positions, base 150000)
    with truncate=True: the range ggml rounds down and up. Set on the dict
    the config carries (rope_parameters in newer transformers, rope_scaling
    in older ones), before the model builds its rotary embedding."""
    for attr in ("rope_parameters", "rope_scaling"):
        d = getattr(config, attr, None)
        if isinstance(d, dict) and d.get("rope_type", d.get("type")) == "yarn":
            d["truncate"] = True


# Per family: a change to the config object after it is built.
CONFIG_FIXUPS = {"gpt_oss": round_yarn_correction_range}


def randomize(model, seed):
    """Weights that make every part of the layer matter: matrices with
    unit-variance outputs, embeddings N(0, 1), norms perturbed; experts
    stored 3-D likewise (gpt-oss applies x @ W, its input dimension is 1;
    transformers' fused Mixtral/Qwen3-MoE experts are [E, out, in]); expert
    biases U(-0.2, 0.2); gpt-oss's attention sinks U(-1, 2), so that they
    take a real share of every softmax."""
    g = torch.Generator().manual_seed(seed)
    x_at_w = type(model).__name__ == "GptOssForCausalLM"
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("sinks"):
                p.copy_(torch.rand(p.shape, generator=g) * 3 - 1)
            elif p.ndim == 3:
                bound = (3.0 / p.shape[1 if x_at_w else 2]) ** 0.5
                p.copy_((torch.rand(p.shape, generator=g) * 2 - 1) * bound)
            elif ".experts." in name and name.endswith("_bias"):
                p.copy_((torch.rand(p.shape, generator=g) * 2 - 1) * 0.2)
            elif p.ndim == 2:
                if "embed_tokens" in name:
                    p.copy_(torch.randn(p.shape, generator=g))
                else:
                    bound = (3.0 / p.shape[1]) ** 0.5
                    p.copy_((torch.rand(p.shape, generator=g) * 2 - 1) * bound)
            else:
                p.add_(0.1 * (torch.rand(p.shape, generator=g) * 2 - 1))


def fixed_ids():
    rng = np.random.default_rng(SEED)
    return [1] + [int(x) for x in rng.integers(3, VOCAB, size=SEQ_LEN - 1)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--tokenizer", default=os.path.join(here, "..", "models", "stories260K", "stories260K-tok512.model"))
    ap.add_argument("--only", help="comma-separated family names to build (default: all)")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    ids = fixed_ids()
    only = set(args.only.split(",")) if args.only else None
    failed = []
    for name, cls_name, cfg_name, kwargs in families():
        if only and name not in only:
            continue
        try:
            build_one(args, name, cls_name, cfg_name, kwargs, ids)
        except Exception as e:  # one family's API change must not hide the others
            print(f"{name}: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
            failed.append(name)
    if failed:
        print(f"reference models not built: {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)


def build_one(args, name, cls_name, cfg_name, kwargs, ids):
    if not hasattr(transformers, cls_name) or not hasattr(transformers, cfg_name):
        raise RuntimeError(f"transformers {transformers.__version__} has no {cls_name}")
    torch.manual_seed(SEED)
    config = getattr(transformers, cfg_name)(attn_implementation="eager", **kwargs)
    config.architectures = [cls_name]
    if name in CONFIG_FIXUPS:
        CONFIG_FIXUPS[name](config)
    model = getattr(transformers, cls_name)(config).float().eval()
    randomize(model, SEED)
    out = os.path.join(args.out_dir, name)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    shutil.copyfile(args.tokenizer, os.path.join(out, "tokenizer.model"))

    logits = model(torch.tensor([ids]), use_cache=False).logits[0].float()
    seq = list(ids)
    greedy = []
    for _ in range(N_GREEDY):
        nxt = int(model(torch.tensor([seq]), use_cache=False).logits[0, -1].argmax())
        greedy.append(nxt)
        seq.append(nxt)
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump({"class": cls_name, "transformers": transformers.__version__, "ids": ids,
                   "logits": logits.tolist(), "greedy": greedy}, f)
    print(f"{name}: {cls_name} -> {out}")


if __name__ == "__main__":
    main()
