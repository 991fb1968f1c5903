#!/usr/bin/env bash
# On a GPU machine: build, test, SASS check, sanitizers, benchmarks with
# their in-run anchors, summary.
#
#   tools/gpu-check.sh                     # check this tree (every section)
#   SECTIONS="build bench summary" tools/gpu-check.sh
#   BASE=/path/to/baseline-tree tools/gpu-check.sh compare
#
# compare: builds the baseline tree and this one side by side ($BASE_BUILD,
# $BUILD), runs the same benchmark list on both in this one call and prints
# one before/after table. A baseline without `runlm bench-decode` gives its
# decode-attention numbers through its gtest benchmark
# (PagedAttentionBench.KvTypes, the "paged decode by KV type" table).
#
# The benchmark list: decode attention B=64 L=8192 and B=1 L=32768 with
# f16/q8_0/fp8/q4_0 KV (+ tools/decode_anchor.py, torch SDPA on the same
# shapes); bench-attn fa2 and fa3 at d128, causal and not (+ torch_sdpa.py);
# tg128 / pp512 on the Llama-2-7B-shaped F16 and Q4_0 models
# (make_random_model); bench -npl 1,64,256; batch of 256 prompts x 128 tokens.
# Test data comes from $RUNLM_TEST_DATA (default ../shared). Logs and JSON go
# to $OUT; a failed section is reported at the end and the run goes on.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
MODE=${1:-check}
OUT=${OUT:-$ROOT/gpu-check-out}
BUILD=${BUILD:-/root/build-new}
BASE_BUILD=${BASE_BUILD:-/root/build-base}
JOBS=${JOBS:-$(nproc)}
DATA=${RUNLM_TEST_DATA:-$ROOT/../shared}
MODEL_DIR=${MODEL_DIR:-/tmp/runlm-models}
MODEL_TYPES=${MODEL_TYPES:-"f16 q4_0"}
ATTN_SEQLEN=${ATTN_SEQLEN:-8192}
TEST_TIMEOUT=${TEST_TIMEOUT:-900}
SANITIZE_TIMEOUT=${SANITIZE_TIMEOUT:-300}
# GPU suites at small sizes (RUNLM_GPU_OPS_SMALL=1 drops the GPU ops tests' 7B
# shapes; no 7B-shape engine, sotu29m or out-of-memory cases).
SANITIZE_FILTER=${SANITIZE_FILTER:-'GpuOps.*:PagedAttention.*:All/AttentionGpu.*:AttentionGpuDispatch.*:CudaEngine.Stories260K*:-*Llama7B*:*Sotu29m*:CudaOom.*'}
RACECHECK_FILTER=${RACECHECK_FILTER:-'GpuOps.GemvMulti*:GpuOps.GemvX8Multi*:GpuOps.RmsNorm*:GpuOps.DecodeAttention*:PagedAttention.SmallHeadDims:PagedAttention.WindowEdges'}
case $MODE in
  check) SECTIONS=${SECTIONS:-"env build test sass sanitize anchors bench summary"} ;;
  compare)
    [ -d "${BASE:-}" ] || { echo "compare: BASE=/path/to/baseline-tree is required"; exit 2; }
    SECTIONS=${SECTIONS:-"env build anchors bench summary"} ;;
  *) echo "usage: [BASE=tree] $0 [check|compare]"; exit 2 ;;
esac
mkdir -p "$OUT"
FAILED=()
log() { echo "== $(date +%H:%M:%S) $*"; }

section_env() {
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv 2>&1
  nvcc --version | tail -1
  git -C "$ROOT" log -1 --format='this tree: %h %s'
  [ "$MODE" = compare ] && git -C "$BASE" log -1 --format='baseline: %h %s' 2>/dev/null
  python3 -c 'import torch; print("torch", torch.__version__)' 2>&1
}

# build_tree SRC BUILD_DIR: runlm, runlm_tests, make_random_model and dump_logits, Release.
build_tree() {
  # shellcheck disable=SC2086
  cmake -S "$1" -B "$2" -DRUNLM_CUDA=ON -DCMAKE_BUILD_TYPE=Release ${CMAKE_EXTRA:-} >"$OUT/cmake_$(basename "$2").log" 2>&1 &&
    cmake --build "$2" -j "$JOBS" --target runlm runlm_tests make_random_model dump_logits >>"$OUT/cmake_$(basename "$2").log" 2>&1 ||
    { tail -30 "$OUT/cmake_$(basename "$2").log"; return 1; }
  log "built $1 in $2"
}

section_build() {
  build_tree "$ROOT" "$BUILD" || return 1
  [ "$MODE" = compare ] && { build_tree "$BASE" "$BASE_BUILD" || return 1; }
  return 0
}

section_test() {
  timeout "$TEST_TIMEOUT" "$BUILD/runlm_tests" --gtest_brief=1 >"$OUT/tests.log" 2>&1
  local rc=$?
  grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$OUT/tests.log" | head -5
  grep -E "^\[  FAILED  \]" "$OUT/tests.log" | head -40
  grep -A6 "Failure$" "$OUT/tests.log" | head -60
  [ $rc -eq 124 ] && echo "tests timed out after ${TEST_TIMEOUT}s"
  return $rc
}

# Tensor-core instructions per kernel, and local memory (LDL/STL: spills or
# indexed register arrays). Every kernel with local memory is listed; the
# check fails when one of the tuned attention kernels (fa3, the tensor-core
# paged decode kernels) has any; some GEMV, fa2 and SIMT instances keep a
# few spilled registers, listed for whoever tunes them next.
section_sass() {
  cuobjdump --dump-sass "$BUILD/librunlm_cuda.a" >"$OUT/sass.txt" 2>&1 || return 1
  awk '/Function :/ {f=$3} /HGMMA/ {h[f]++} /HMMA/ {m[f]++} /LDL|STL/ {l[f]++}
       END {for (f in h) printf "HGMMA %5d  %s\n", h[f], f; for (f in m) printf "HMMA  %5d  %s\n", m[f], f;
            for (f in l) printf "LDL/STL %3d  %s\n", l[f], f}' "$OUT/sass.txt" | c++filt | cut -c1-150 | sort >"$OUT/sass_summary.txt"
  grep -c "^HGMMA\|^HMMA" "$OUT/sass_summary.txt" | sed 's/^/kernels with tensor-core instructions: /'
  grep "^LDL/STL" "$OUT/sass_summary.txt" | cut -c1-120
  if grep "^LDL/STL" "$OUT/sass_summary.txt" | grep -qE "attn_fa3|paged_decode_(tma|mma)"; then
    echo "local memory in a tuned attention kernel"; return 1
  fi
  echo "no local memory in fa3 or the tensor-core paged decode kernels"
}

section_sanitize() {
  command -v compute-sanitizer >/dev/null || { echo "no compute-sanitizer"; return 1; }
  local rc=0 tool filter errors
  for tool in memcheck racecheck synccheck; do
    filter=$SANITIZE_FILTER
    [ $tool = racecheck ] && filter=$RACECHECK_FILTER
    RUNLM_GPU_OPS_SMALL=1 timeout "$SANITIZE_TIMEOUT" compute-sanitizer --tool $tool --error-exitcode 9 "$BUILD/runlm_tests" \
      --gtest_filter="$filter" >"$OUT/sanitize_$tool.log" 2>&1 || rc=1
    errors=$(sed -n -e 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' \
      -e 's/.*RACECHECK SUMMARY:.*(\([0-9]*\) error.*/\1/p' "$OUT/sanitize_$tool.log" | tail -1)
    printf '%-9s errors %s, tests ok %s, failed %s\n' $tool "${errors:-? (did not finish)}" \
      "$(grep -c '^\[       OK \]' "$OUT/sanitize_$tool.log")" "$(grep -c '^\[  FAILED  \].*(' "$OUT/sanitize_$tool.log")"
  done
  return $rc
}

# Torch on the same shapes, in the same call: prefill SDPA (cuDNN, flash) and
# the decode anchor (contiguous KV, f16).
section_anchors() {
  local rc=0
  PYTHONUNBUFFERED=1 python3 "$DATA/anchors/torch_sdpa.py" prefill --hdim 128 --seqlen "$ATTN_SEQLEN" \
    >"$OUT/anchor_prefill.jsonl" 2>"$OUT/anchor_prefill.err" || { tail -3 "$OUT/anchor_prefill.err"; rc=1; }
  PYTHONUNBUFFERED=1 python3 tools/decode_anchor.py --batches 1,64 --ctxs 8192,32768 --dtypes f16 \
    >"$OUT/anchor_decode.jsonl" 2>"$OUT/anchor_decode.err" || { tail -3 "$OUT/anchor_decode.err"; rc=1; }
  return $rc
}

write_batch_prompts() {
  python3 - "$OUT/batch_prompts.jsonl" <<'PY'
import json, random, sys
random.seed(1)
words = "the of and to a in that is was he for it with as his on be at by had not are but from or have an they which one you were".split()
with open(sys.argv[1], "w") as f:
    for i in range(256):  # ~128 tokens each: 100 common words
        f.write(json.dumps({"id": i, "prompt": " ".join(random.choice(words) for _ in range(100))}) + "\n")
PY
}

# bench_list BUILD_DIR DIR: the benchmark list with one tree's binaries.
bench_list() {
  local b=$1 d=$2 t m rc=0
  mkdir -p "$d"
  if "$b/runlm" bench-decode --help >/dev/null 2>&1; then
    "$b/runlm" bench-decode --kv f16,q8_0,fp8,q4_0 --points 64x8192,1x32768 >"$d/decode.txt" 2>"$d/decode.err" || rc=1
  else  # a tree from before bench-decode: its gtest benchmark prints the same table
    RUNLM_BENCH=1 RUNLM_BENCH_KV=q8_0,fp8,q4_0 "$b/runlm_tests" --gtest_filter='PagedAttentionBench.KvTypes' \
      >"$d/decode.txt" 2>"$d/decode.err" || rc=1
  fi
  "$b/runlm" bench-attn --attn fa2,fa3 --hdim 128 --seqlen "$ATTN_SEQLEN" -o json >"$d/attn.jsonl" 2>"$d/attn.err" || rc=1
  for t in $MODEL_TYPES; do
    m=$MODEL_DIR/llama2-7b-$t.gguf
    "$b/runlm" bench -m "$m" -p 512 -n 128 -r 3 -o json >"$d/bench_$t.jsonl" 2>"$d/bench_$t.err" || rc=1
    "$b/runlm" bench -m "$m" -npl 1,64,256 -npp 128 -ntg 128 -b 4096 -o json >"$d/npl_$t.jsonl" 2>"$d/npl_$t.err" || rc=1
    "$b/runlm" batch -m "$m" -f "$OUT/batch_prompts.jsonl" -o "$d/batch_out_$t.jsonl" -n 128 --ignore-eos --temp 0 \
      -np 256 -c 512 -b 4096 >/dev/null 2>"$d/batch_$t.log" || rc=1
  done
  return $rc
}

section_bench() {
  local t rc=0
  mkdir -p "$MODEL_DIR"
  for t in $MODEL_TYPES; do
    [ -f "$MODEL_DIR/llama2-7b-$t.gguf" ] || "$BUILD/make_random_model" --preset llama2-7b --type "$t" \
      --tokenizer "$DATA/models/llama2-tokenizer.model" -o "$MODEL_DIR/llama2-7b-$t.gguf" || return 1
  done
  write_batch_prompts
  if [ "$MODE" = compare ]; then
    bench_list "$BASE_BUILD" "$OUT/base" || rc=1
  fi
  bench_list "$BUILD" "$OUT/new" || rc=1
  grep -h -E "rror|exception" "$OUT"/*/[a-z]*.err 2>/dev/null | head -10
  return $rc
}

# One table: metric, baseline (compare), this tree, ratio; torch anchors beside.
section_summary() {
  python3 - "$OUT" "$MODE" <<'PY'
import json, os, re, sys
out, mode = sys.argv[1], sys.argv[2]
def jsonl(path):
    try:
        return [json.loads(l) for l in open(path) if l.startswith("{")]
    except FileNotFoundError:
        return []
def text(path):
    try:
        return open(path).read()
    except FileNotFoundError:
        return ""
def metrics(d):
    m = {}
    # "paged decode by KV type" table rows: B L kv us MB-read GB/s tokens/s vs-f16 kernel
    t = text(os.path.join(d, "decode.txt"))
    if "paged decode by KV type" in t:
        for line in t[t.index("paged decode by KV type"):].splitlines():
            f = line.split()
            if len(f) >= 8 and f[0].isdigit() and f[1].isdigit():
                m["decode B=%s L=%s %s us" % (f[0], f[1], f[2])] = (float(f[3]), "lower")
                m["decode B=%s L=%s %s GB/s" % (f[0], f[1], f[2])] = (float(f[5]), "higher")
    for r in jsonl(os.path.join(d, "attn.jsonl")):
        if r.get("status") == "ok":
            m["%s d%d %d %s TFLOP/s" % (r["backend"], r["hdim"], r["seqlen"], "causal" if r["causal"] else "full")] = (r["TFLOPs"], "higher")
    for t in ("f16", "q4_0"):
        for r in jsonl(os.path.join(d, "bench_%s.jsonl" % t)):
            m["%s %s t/s" % (t, r["test"])] = (r["tps_mean"], "higher")
        for r in jsonl(os.path.join(d, "npl_%s.jsonl" % t)):
            m["%s npl %d S_TG t/s" % (t, r["pl"])] = (r["speed_tg"], "higher")
        b = re.search(r"tokens out in ([\d.]+) s \(([\d.]+) tok/s\)", text(os.path.join(d, "batch_%s.log" % t)))
        if b:
            m["%s batch 256x128 tok/s" % t] = (float(b.group(2)), "higher")
    return m
new = metrics(os.path.join(out, "new"))
base = metrics(os.path.join(out, "base")) if mode == "compare" else {}
anchors = {}
for r in jsonl(os.path.join(out, "anchor_decode.jsonl")):
    if r.get("impl") == "torch_cudnn" and "gbps" in r:
        anchors["decode B=%d L=%d f16 GB/s" % (r["B"], r["L"])] = "cuDNN %.0f" % r["gbps"]
for r in jsonl(os.path.join(out, "anchor_prefill.jsonl")):
    if r.get("what") == "prefill" and r.get("cudnn_TFLOPs"):
        for be in ("fa2", "fa3"):
            anchors["%s d%d %d %s TFLOP/s" % (be, r["hdim"], r["seqlen"], "causal" if r["causal"] else "full")] = "cuDNN %.0f" % r["cudnn_TFLOPs"]
keys = list(new) + [k for k in base if k not in new]
print("%-38s %12s %12s %8s  %s" % ("metric", "baseline" if base else "", "this tree", "ratio" if base else "", "anchor"))
for k in keys:
    n, b = new.get(k, (None, ""))[0], base.get(k, (None, ""))[0]
    better = (new.get(k) or base.get(k))[1]
    ratio = ""
    if n is not None and b:
        ratio = "%.3f" % ((n / b) if better == "higher" else (b / n))
    fmt = lambda v: "-" if v is None else "%.2f" % v
    print("%-38s %12s %12s %8s  %s" % (k, fmt(b) if base else "", fmt(n), ratio, anchors.get(k, "")))
if base:
    print("ratio > 1: this tree is faster (us: baseline / this; rates: this / baseline)")
PY
  grep -h "decode kernel\|kernel" "$OUT/new/decode.txt" 2>/dev/null | head -2
}

for s in $SECTIONS; do
  log "section $s"
  if ! "section_$s" > >(tee "$OUT/section_$s.log") 2>&1; then
    FAILED+=("$s")
  fi
done
log "done; failed sections: ${FAILED[*]:-none}"
[ ${#FAILED[@]} -eq 0 ]
