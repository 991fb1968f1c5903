#!/usr/bin/env bash
# Perplexity of runlm's CPU forward against llama.cpp's CPU build, one small
# random-weight GGUF per model family (tools/make_random_model presets at a
# tiny size: hidden 256, 2-6 layers, the family's head size), on the same
# text (the mixture-of-experts families too, and two of them quantized
# with the mxfp4_moe mix). Prints one table row per model: both perplexities and their
# relative difference. Also checks that rope_freqs.weight (Llama 3.1's RoPE
# scaling) moves the perplexity in both programs.
#
#   tools/compare_families.sh [LLAMA_CPP_BIN_DIR] [BUILD_DIR]
#
# Defaults: ../llama.cpp-cpu/bin (llama-perplexity) and build-cpu (runlm,
# make_random_model). Text: the first 8 KB of
# ../shared/models/sotu29m/eval.txt. Vocabulary: the family's real one where
# ../shared/vocab has it (Llama 3's byte-level BPE, Qwen 2's, Phi-3's
# SentencePiece), else the Llama 2 SentencePiece vocabulary
# (../shared/models/ggml-vocab-llama-spm.gguf). Runs from the repository root.
set -euo pipefail

LLAMA_BIN=${1:-../llama.cpp-cpu/bin}
BUILD=${2:-build-cpu}
SHARED=${RUNLM_TEST_DATA:-../shared}
SPM=$SHARED/models/ggml-vocab-llama-spm.gguf
EVAL=${RUNLM_TEST_DATA:-../shared}/models/sotu29m/eval.txt
WORK=$(mktemp -d /tmp/compare_families.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

for f in "$LLAMA_BIN/llama-perplexity" "$BUILD/runlm" "$BUILD/make_random_model" "$SPM" "$EVAL"; do
  [[ -e $f ]] || { echo "missing: $f" >&2; exit 1; }
done
head -c 8192 "$EVAL" > "$WORK/text.txt"

# name | vocabulary | preset and size overrides
L3=$SHARED/vocab/ggml-vocab-llama-bpe.gguf
QW=$SHARED/vocab/ggml-vocab-qwen2.gguf
PHI=$SHARED/vocab/ggml-vocab-phi-3.gguf
MODELS=(
  "llama3|$L3|--preset llama3-8b --dim 256 --hidden 512 --layers 2 --heads 4 --kv-heads 2 --rope-orig-ctx 32"
  "llama3-no-rope-freqs|$L3|--preset llama3-8b --dim 256 --hidden 512 --layers 2 --heads 4 --kv-heads 2 --no-rope-freqs"
  "qwen2.5|$QW|--preset qwen2.5-7b --dim 256 --hidden 512 --layers 2 --heads 4 --kv-heads 2"
  "qwen3|$QW|--preset qwen3-8b --dim 256 --hidden 512 --layers 2 --heads 4 --kv-heads 2 --head-dim 128"
  "gemma2|$SPM|--preset gemma2-9b --dim 256 --hidden 512 --layers 4 --heads 2 --kv-heads 1 --head-dim 256 --sliding-window 32"
  "gemma3|$SPM|--preset gemma3-12b --dim 256 --hidden 512 --layers 6 --heads 2 --kv-heads 1 --head-dim 256 --sliding-window 32"
  "phi3|$PHI|--preset phi3-mini --dim 256 --hidden 512 --layers 2 --heads 4 --kv-heads 4"
  "mistral-nemo|$SPM|--preset mistral-nemo-12b --dim 256 --hidden 512 --layers 2 --heads 4 --kv-heads 2 --head-dim 128"
  # Mixtures of experts (gpt-oss: a 32-token window so that it slides within -c 128).
  "mixtral|$SPM|--preset mixtral-8x7b --dim 256 --hidden 256 --layers 2 --heads 4 --kv-heads 2 --experts 4 --experts-used 2"
  "qwen3moe|$QW|--preset qwen3-30b-a3b --dim 256 --hidden 512 --layers 2 --heads 4 --kv-heads 2 --head-dim 128 --experts 8 --experts-used 2 --expert-hidden 128"
  "gpt-oss|$L3|--preset gpt-oss-20b --dim 256 --hidden 256 --layers 2 --heads 4 --kv-heads 2 --head-dim 64 --experts 4 --experts-used 2 --expert-hidden 256 --sliding-window 32"
)
# Quantized with llama.cpp's MXFP4_MOE mix (experts MXFP4, the rest Q8_0) by
# `runlm quantize`: name | f32 model above it was made from.
QUANTIZED=(gpt-oss qwen3moe)

ppl_llama() {  # last "Final estimate: PPL = X" of llama-perplexity
  "$LLAMA_BIN/llama-perplexity" -m "$1" -f "$WORK/text.txt" -c 128 -b 128 -fa off -ctk f32 -ctv f32 -nr -t 2 \
    > "$WORK/llama.log" 2>&1 || { tail -20 "$WORK/llama.log" >&2; return 1; }
  sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' "$WORK/llama.log"
}
ppl_runlm() {
  "$BUILD/runlm" perplexity -m "$1" -f "$WORK/text.txt" --ppl-mode llama --device cpu -c 128 -t 2 \
    > "$WORK/runlm.log" 2>&1 || { tail -20 "$WORK/runlm.log" >&2; return 1; }
  sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' "$WORK/runlm.log"
}

printf "%-22s %16s %16s %12s\n" model llama.cpp runlm rel.diff
declare -A PPL_L PPL_R
for entry in "${MODELS[@]}"; do
  IFS='|' read -r name vocab args <<< "$entry"
  # shellcheck disable=SC2086
  "$BUILD/make_random_model" $args --type f32 --vocab-from "$vocab" --threads 2 -o "$WORK/$name.gguf" > /dev/null
  l=$(ppl_llama "$WORK/$name.gguf")
  r=$(ppl_runlm "$WORK/$name.gguf")
  PPL_L[$name]=$l
  PPL_R[$name]=$r
  printf "%-22s %16s %16s %12s\n" "$name" "$l" "$r" \
    "$(python3 -c "print(f'{abs($r - $l) / $l:.2e}')")"
  if [[ " ${QUANTIZED[*]} " == *" $name "* ]]; then
    "$BUILD/runlm" quantize "$WORK/$name.gguf" "$WORK/$name-mxfp4.gguf" mxfp4_moe > /dev/null 2>&1
    l=$(ppl_llama "$WORK/$name-mxfp4.gguf")
    r=$(ppl_runlm "$WORK/$name-mxfp4.gguf")
    printf "%-22s %16s %16s %12s\n" "$name-mxfp4_moe" "$l" "$r" \
      "$(python3 -c "print(f'{abs($r - $l) / $l:.2e}')")"
    rm -f "$WORK/$name-mxfp4.gguf"
  fi
  rm -f "$WORK/$name.gguf"
done

echo
echo "rope_freqs.weight moves the perplexity (relative change, with vs without):"
python3 - "${PPL_L[llama3]}" "${PPL_L[llama3-no-rope-freqs]}" "${PPL_R[llama3]}" "${PPL_R[llama3-no-rope-freqs]}" <<'PY'
import sys
lw, lo, rw, ro = map(float, sys.argv[1:])
print(f"  llama.cpp: {abs(lw - lo) / lo:.2e}   runlm: {abs(rw - ro) / ro:.2e}")
PY
