#!/usr/bin/env bash
# On a GPU machine: runlm beside llama.cpp on the same GGUF files, in one
# run. llama.cpp (the anchor, never a dependency) is built from the shared
# script; its llama-quantize makes every quantized file from one F16 file of
# random weights, so both programs read the same bytes.
#
#   tools/bench_vs_llama.sh types      # Llama-2-7B shape: F16 and every type
#   tools/bench_vs_llama.sh families   # each family preset: F16 and Q4_K_M
#   tools/bench_vs_llama.sh moe        # the mixture-of-experts presets in their mixes
#
# moe writes each file in its mix directly (runlm's mixes are byte for byte
# llama-quantize's; an F16 file of these shapes would not fit the disk), with
# --repeat-rows so that a 30B-120B shape takes seconds; MOE_RUNS lists
# preset:mix pairs, MOE_DIR where the files go (/dev/shm holds what the disk
# cannot).
#
# Settings (environment): RUNLM_BUILD (default /root/build-new, with runlm
# and make_random_model), LLAMA_DIR (default /root/llama.cpp-build; built
# there by ../shared/anchors/llama_cpp.sh when its bin/ lacks llama-bench),
# RUNLM_TEST_DATA (default ../shared), WORK (default /tmp/bench-vs-llama),
# OUT (default ./bench-vs-llama-out), TYPES, FAMILIES, NPL (batched decode
# points; empty = none), REPS, DEADLINE (a `date +%s` time after which no
# new file is started, so a time-limited run still prints its table),
# STEP_TIMEOUT (seconds for each program's run on a file, default 240: a
# step that overruns loses its own row, not the run's table). Models are made one at a time and deleted
# after their runs, so the disk holds one F16 file and one quantized file.
# Prints one markdown table last: per file its size, llama.cpp's and
# runlm's pp512 and tg128, the ratios, runlm's decode bytes/s as a share of
# the copy bandwidth runlm measured in the same run, and runlm's load time
# and device memory in use after loading.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODE=${1:-types}
BUILD=${RUNLM_BUILD:-/root/build-new}
LLAMA_DIR=${LLAMA_DIR:-/root/llama.cpp-build}
DATA=${RUNLM_TEST_DATA:-$ROOT/../shared}
WORK=${WORK:-/tmp/bench-vs-llama}
OUT=${OUT:-$ROOT/bench-vs-llama-out}
TYPES=${TYPES:-"f16 q8_0 q6_k q5_k_m q4_k_m q4_0 iq4_xs q3_k_m q2_k"}
FAMILIES=${FAMILIES:-"llama3-8b qwen2.5-7b qwen3-8b gemma2-9b gemma3-12b phi3-mini mistral-nemo-12b"}
FAMILY_TYPES=${FAMILY_TYPES:-"f16 q4_k_m"}
MOE_RUNS=${MOE_RUNS:-"qwen3-30b-a3b:q4_k_m gpt-oss-20b:mxfp4_moe mixtral-8x7b:q4_k_m gpt-oss-120b:mxfp4_moe"}
MOE_DIR=${MOE_DIR:-$WORK}
NPL=${NPL:-}
REPS=${REPS:-3}
STEP_TIMEOUT=${STEP_TIMEOUT:-240}
mkdir -p "$WORK" "$OUT"
LB=$LLAMA_DIR/bin
if [ ! -x "$LB/llama-bench" ]; then
  JOBS=${LLAMA_JOBS:-12} bash "$DATA/anchors/llama_cpp.sh" "$LLAMA_DIR" >"$OUT/llama_build.log" 2>&1 ||
    { tail -20 "$OUT/llama_build.log"; exit 1; }
fi
for f in "$BUILD/runlm" "$BUILD/make_random_model" "$LB/llama-bench" "$LB/llama-quantize"; do
  [ -x "$f" ] || { echo "missing: $f"; exit 1; }
done
RESULTS=$OUT/results.jsonl
: >"$RESULTS"

# bench_file NAME FILE: both programs on one file; one JSON line to RESULTS.
bench_file() {
  local name=$1 f=$2 tag
  tag=$(echo "$name" | tr -c 'a-zA-Z0-9_.-' '_')
  timeout "$STEP_TIMEOUT" "$LB/llama-bench" -m "$f" -p 512 -n 128 -fa 1 -ngl 99 -r "$REPS" -o json \
    >"$OUT/llama_$tag.json" 2>"$OUT/llama_$tag.err"
  timeout "$STEP_TIMEOUT" "$BUILD/runlm" bench -m "$f" -p 512 -n 128 -r "$REPS" -o json >"$OUT/runlm_$tag.jsonl" \
    2>"$OUT/runlm_$tag.err"
  if [ -n "$NPL" ]; then
    timeout "$STEP_TIMEOUT" "$LB/llama-batched-bench" -m "$f" -c 66000 -b 2048 -ub 512 -npp 128 -ntg 128 -npl "$NPL" \
      -fa 1 -ngl 99 >"$OUT/llama_npl_$tag.txt" 2>&1
    timeout "$STEP_TIMEOUT" "$BUILD/runlm" bench -m "$f" -npl "$NPL" -npp 128 -ntg 128 -b 4096 -o json \
      >"$OUT/runlm_npl_$tag.jsonl" 2>"$OUT/runlm_npl_$tag.err"
  fi
  python3 - "$name" "$f" "$OUT" "$tag" >>"$RESULTS" <<'PY'
import json, os, re, sys
name, path, out, tag = sys.argv[1:5]
r = {"name": name, "bytes": os.path.getsize(path)}
try:
    for t in json.load(open(os.path.join(out, "llama_%s.json" % tag))):
        key = "pp512" if t.get("n_prompt") == 512 and t.get("n_gen") == 0 else "tg128" if t.get("n_gen") == 128 else None
        if key: r["llama_" + key] = t["avg_ts"]
except Exception as e:
    r["llama_error"] = str(e)[:80]
for line in open(os.path.join(out, "runlm_%s.jsonl" % tag)):
    if line.startswith("{"):
        t = json.loads(line)
        r["runlm_" + t["test"]] = t["tps_mean"]
        if t["test"] == "tg128": r["copy_bw"], r["bytes_per_s"] = t.get("copy_bw"), t.get("bytes_per_s")
        r["load_s"], r["device_mem"] = t.get("load_s"), t.get("device_mem_bytes")
npl = os.path.join(out, "llama_npl_%s.txt" % tag)
if os.path.exists(npl):
    for line in open(npl):  # |    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s | ...
        f = [x.strip() for x in line.split("|")]
        if len(f) > 9 and f[3].isdigit():
            r["llama_npl%s" % f[3]] = float(f[8])
    for line in open(os.path.join(out, "runlm_npl_%s.jsonl" % tag)):
        if line.startswith("{"):
            t = json.loads(line)
            r["runlm_npl%d" % t["pl"]] = t["speed_tg"]
print(json.dumps(r))
PY
  echo "$name done: $(tail -1 "$RESULTS")"
}

past_deadline() {
  [ -n "${DEADLINE:-}" ] && [ "$(date +%s)" -ge "$DEADLINE" ] && { echo "deadline: skipping the rest"; return 0; }
  return 1
}

# quantize_and_bench PREFIX F16_FILE TYPE...
quantize_and_bench() {
  local prefix=$1 f16=$2 t q
  shift 2
  for t in "$@"; do
    past_deadline && return
    if [ "$t" = f16 ]; then
      bench_file "$prefix f16" "$f16"
      continue
    fi
    q=$WORK/$prefix-$t.gguf
    "$LB/llama-quantize" "$f16" "$q" "$t" "$(nproc)" >"$OUT/quantize_${prefix}_$t.log" 2>&1 ||
      { echo "llama-quantize $t failed"; tail -3 "$OUT/quantize_${prefix}_$t.log"; continue; }
    bench_file "$prefix $t" "$q"
    rm -f "$q"
  done
}

case $MODE in
  types)
    f16=$WORK/llama2-7b-f16.gguf
    [ -f "$f16" ] || "$BUILD/make_random_model" --preset llama2-7b --type f16 \
      --tokenizer "$DATA/models/llama2-tokenizer.model" -o "$f16" >/dev/null || exit 1
    # shellcheck disable=SC2086
    quantize_and_bench llama2-7b "$f16" $TYPES
    ;;
  families)
    for p in $FAMILIES; do
      past_deadline && break
      f16=$WORK/$p-f16.gguf
      # The preset's real vocabulary size: the Llama-2 tokenizer padded up to
      # it, except Phi-3's own (llama.cpp sets Phi-3's special-token
      # attributes by model name and needs its <|endoftext|>).
      vocab=(--tokenizer "$DATA/models/llama2-tokenizer.model" --pad-vocab)
      [[ $p == phi3* ]] && vocab=(--vocab-from "$DATA/vocab/ggml-vocab-phi-3.gguf")
      "$BUILD/make_random_model" --preset "$p" --type f16 "${vocab[@]}" -o "$f16" >/dev/null ||
        { echo "$p: make failed"; continue; }
      # shellcheck disable=SC2086
      quantize_and_bench "$p" "$f16" $FAMILY_TYPES
      rm -f "$f16"
    done
    ;;
  moe)
    for run in $MOE_RUNS; do
      past_deadline && break
      p=${run%%:*} mix=${run#*:}
      f=$MOE_DIR/$p-$mix.gguf
      "$BUILD/make_random_model" --preset "$p" --type "$mix" --tokenizer "$DATA/models/llama2-tokenizer.model" \
        --pad-vocab --repeat-rows 1024 -o "$f" >"$OUT/make_$p.log" 2>&1 || { echo "$p: make failed"; tail -2 "$OUT/make_$p.log"; continue; }
      bench_file "$p $mix" "$f"
      rm -f "$f"
    done
    ;;
  *) echo "usage: $0 types|families|moe"; exit 2 ;;
esac

python3 - "$RESULTS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def f(v, fmt="%.1f"): return fmt % v if isinstance(v, (int, float)) else "-"
def ratio(a, b): return "%.2fx" % (a / b) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "-"
print("| file | size GiB | llama.cpp pp512 | runlm pp512 | ratio | llama.cpp tg128 | runlm tg128 | ratio | runlm tg share of copy | runlm load s | runlm device GiB |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    share = r["bytes_per_s"] / r["copy_bw"] if r.get("bytes_per_s") and r.get("copy_bw") else None
    mem = r["device_mem"] / 2**30 if r.get("device_mem") else None
    print("| %s | %.2f | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
        r["name"], r["bytes"] / 2**30, f(r.get("llama_pp512")), f(r.get("runlm_pp512")),
        ratio(r.get("runlm_pp512"), r.get("llama_pp512")), f(r.get("llama_tg128")), f(r.get("runlm_tg128")),
        ratio(r.get("runlm_tg128"), r.get("llama_tg128")), "%.0f%%" % (100 * share) if share else "-",
        f(r.get("load_s")), f(mem, "%.2f")))
npl = sorted({k[len("runlm_npl"):] for r in rows for k in r if k.startswith("runlm_npl")}, key=int)
if npl:
    print()
    print("| file | " + " | ".join("B=%s llama.cpp / runlm S_TG" % b for b in npl) + " |")
    print("|---|" + "---:|" * len(npl))
    for r in rows:
        print("| %s | " % r["name"] + " | ".join("%s / %s" % (f(r.get("llama_npl" + b)), f(r.get("runlm_npl" + b))) for b in npl) + " |")
PY
