#!/usr/bin/env bash
# Checks runlm against transformers on every model family: builds the tiny
# reference models (tools/hf_families_reference.py), converts each with
# `runlm convert`, runs it with tools/dump_logits on the CPU (and on CUDA
# when the build has it and a GPU is present) and compares: the logits'
# maximum relative error (max |runlm - hf| / max |hf| over the whole
# sequence) must be below TOL (default 1e-3 on the CPU: float32 on both
# sides, the differences are summation order; CUDA_TOL, default 2e-2, on the
# GPU, whose matmuls and KV cache run in half precision) and the 32 greedy
# ids must be equal. The CUDA engine refuses the layers it does not
# implement yet; those rows say so and do not fail the check.
#
#   tools/check_hf_families.sh [BUILD_DIR] [WORK_DIR]
#
# LLAMA_CONVERT=DIR converts with llama.cpp's convert_hf_to_gguf.py from DIR
# (the shared llama.cpp-convert archive unpacked: the script, conversion/,
# gguf-py/) instead of `runlm convert`, --outtype f32: the GGUFs users
# download are written by that converter, so runlm must read them the same.
#
# Defaults: build (the CUDA build) if it has dump_logits, else build-cpu; a
# temporary WORK_DIR. The references need python3 with torch, transformers
# and numpy; the comparison itself plain python3.
# Exit status 0 when every family passes. Takes well under 2 minutes.
set -uo pipefail

BUILD=${1:-}
if [[ -z $BUILD ]]; then
  if [[ -x build/dump_logits ]]; then BUILD=build; else BUILD=build-cpu; fi
fi
WORK=${2:-$(mktemp -d /tmp/check_hf_families.XXXXXX)}
TOL=${TOL:-1e-3}
CUDA_TOL=${CUDA_TOL:-2e-2}
for b in runlm dump_logits; do
  [[ -x $BUILD/$b ]] || { echo "missing $BUILD/$b (build the runlm and dump_logits targets)" >&2; exit 2; }
done

status=0
python3 tools/hf_families_reference.py "$WORK" || { echo "some reference models were not built (see above)" >&2; status=1; }

devices=(cpu)
if command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then
  devices+=(cuda)
fi

printf "%-18s %-6s %-10s %-12s %s\n" family device convert max_rel_err greedy
for dir in "$WORK"/*/; do
  name=$(basename "$dir")
  [[ -f $dir/reference.json ]] || continue
  if [[ -n ${LLAMA_CONVERT:-} ]]; then
    convert=(env PYTHONPATH="$LLAMA_CONVERT/gguf-py" python3 "$LLAMA_CONVERT/convert_hf_to_gguf.py" "$dir"
             --outfile "$dir/model.gguf" --outtype f32)
  else
    convert=("$BUILD/runlm" convert "$dir" -o "$dir/model.gguf")
  fi
  if ! "${convert[@]}" > "$dir/convert.log" 2>&1; then
    printf "%-18s %-6s %-10s %s\n" "$name" - FAILED "$(tail -1 "$dir/convert.log")"
    status=1
    continue
  fi
  ids=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['ids'])))" "$dir/reference.json")
  for dev in "${devices[@]}"; do
    if ! "$BUILD/dump_logits" -m "$dir/model.gguf" --ids "$ids" --greedy 32 --device "$dev" \
         -o "$dir/runlm_$dev.json" > "$dir/run_$dev.log" 2>&1; then
      # The CUDA engine refuses layers it does not implement yet: reported, not failed.
      if [[ $dev == cuda ]] && grep -q "built without CUDA" "$dir/run_$dev.log"; then
        printf "%-18s %-6s %-10s %s\n" "$name" "$dev" ok "skipped: a CPU-only build"
        continue
      fi
      if [[ $dev == cuda ]] && grep -q "CUDA engine does not implement" "$dir/run_$dev.log"; then
        printf "%-18s %-6s %-10s %s\n" "$name" "$dev" ok "refused: $(grep -o 'does not implement.*' "$dir/run_$dev.log" | head -1)"
        continue
      fi
      printf "%-18s %-6s %-10s %s\n" "$name" "$dev" ok "RUN FAILED: $(tail -1 "$dir/run_$dev.log")"
      status=1
      continue
    fi
    tol=$TOL
    [[ $dev == cuda ]] && tol=$CUDA_TOL
    if ! python3 - "$dir/reference.json" "$dir/runlm_$dev.json" "$tol" "$name" "$dev" <<'PY'
import json, sys
ref, got, tol, name, dev = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), float(sys.argv[3]), sys.argv[4], sys.argv[5]
a, b = ref["logits"], got["logits"]
if len(a) != len(b) or any(len(x) != len(y) for x, y in zip(a, b)):
    print(f"{name:<18} {dev:<6} {'ok':<10} SHAPE differs from the reference")
    sys.exit(1)
scale = max(abs(v) for row in a for v in row)
err = max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)) / scale
same = ref["greedy"] == got["greedy"]
first = next((i for i, (x, y) in enumerate(zip(ref["greedy"], got["greedy"])) if x != y), None)
print(f"{name:<18} {dev:<6} {'ok':<10} {err:<12.3e} {'equal' if same else f'differ from step {first}'}")
sys.exit(0 if err < tol and same else 1)
PY
    then
      status=1
    fi
  done
done
[[ $status == 0 ]] && echo "all families agree (tolerance $TOL, CUDA $CUDA_TOL)" ||
  echo "FAILED: see the rows and messages above (tolerance $TOL, CUDA $CUDA_TOL)"
exit $status
