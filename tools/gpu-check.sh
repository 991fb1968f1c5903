#!/usr/bin/env bash
# On a GPU machine: build runlm for the GPU (CUDA, Release, sm_80 + sm_90a),
# run the whole test binary (GPU tests included), check the kernels' SASS,
# run compute-sanitizer (memcheck, racecheck, synccheck) over the GPU tests
# at small sizes, run `runlm bench-attn
# -o json` and torch's SDPA anchors (cuDNN, flash) on the same shapes in the
# same run, and print a short table last: our TFLOP/s and the ratio to cuDNN
# and torch-flash at each shape.
#
# Sections run in order; pick some with SECTIONS="build test bench" or add
# one by writing a section_NAME function and listing it. Logs and JSON go to
# $OUT (default ./gpu-check-out). Everything is logged, failures are counted
# and reported in the last lines, and the script goes on after a failed
# section so one run returns as much as it can.
#
#   tools/gpu-check.sh                       # everything
#   SECTIONS="build bench anchors summary" BENCH_ARGS="--hdim 128" tools/gpu-check.sh
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/gpu-check-out}
BUILD=${BUILD:-$ROOT/build-gpu}
JOBS=${JOBS:-$(nproc)}
# Also available: profile (ncu), plot (PNG charts), and the sections below
# the summary (models, bench_model, paged, batch_model, gemv, gemm_fused,
# bench_npl, fa3_variant, ...).
SECTIONS=${SECTIONS:-"env build test sass sanitize bench anchors summary"}
BENCH_ARGS=${BENCH_ARGS:-}
ANCHOR_ARGS=${ANCHOR_ARGS:-}
TEST_FILTER=${TEST_FILTER:-*}
# Per-section time limits (seconds): a hung kernel must not eat the whole run.
TEST_TIMEOUT=${TEST_TIMEOUT:-300}
# compute-sanitizer: a limit per tool (memcheck, racecheck, synccheck), ~6
# minutes in all on an H100; a tool that runs out reports how far it got.
SANITIZE_TIMEOUT_MEMCHECK=${SANITIZE_TIMEOUT_MEMCHECK:-240}
SANITIZE_TIMEOUT_RACECHECK=${SANITIZE_TIMEOUT_RACECHECK:-150}
SANITIZE_TIMEOUT_SYNCCHECK=${SANITIZE_TIMEOUT_SYNCCHECK:-60}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-300}
# Every GPU test suite at small sizes: the GPU ops (RUNLM_GPU_OPS_SMALL=1
# drops their 7B shapes), paged decode attention, the prefill attention
# backends (all 126 cases are small) and, at head_dim 128, their reads of
# typed (quantized) pages, the CUDA engine on stories260K, the KV type check. Left out: benches, the 7B-shape and sotu29m engine tests (too
# slow under the tools), and CudaOom (it takes all GPU memory on purpose).
# racecheck instruments every shared-memory access and runs ~100x slower
# than memcheck: it gets the suites' small cases that use shared memory.
RACECHECK_FILTER=${RACECHECK_FILTER:-'GpuOps.GemvMulti*:GpuOps.GemvX8Multi*:GpuOps.GemvX8Swiglu*:GpuOps.RmsNorm*:GpuOps.Swiglu*:GpuOps.Rope*:GpuOps.DecodeAttention*:PagedAttention.SmallHeadDims:PagedAttention.WindowEdges:PagedAttention.KvTypeHeadDimsRowsPages:All/AttentionGpu.MatchesReference/*_bf16_d64_gqa_causal:All/AttentionGpu.MatchesReference/*_f16_d128_gqa_causal_window_offset:Typed/AttentionPagedTypedGpu.MatchesReference/fa2_Kq8_0_Vq4_0_d128_*'}
SANITIZE_TOOLS=${SANITIZE_TOOLS:-"memcheck racecheck synccheck"}
SANITIZE_FILTER=${SANITIZE_FILTER:-'GpuOps.*:PagedAttention.*:All/AttentionGpu.*:Typed/AttentionPagedTypedGpu.*_d128_*:AttentionGpuDispatch.*:CudaEngine.Stories260K*:CudaEngine.PagedGenerateMatchesGolden:KvQuant.EnginesTakeTheTypesAndRefuseWhatTheyLack-*Bench*:*Llama7B*:*Sotu29m*:CudaOom.*'}
mkdir -p "$OUT"
FAILED=()
TESTS=$BUILD/runlm_tests
RUNLM=$BUILD/runlm

log() { echo "== $(date +%H:%M:%S) $*"; }

# The torch anchor script: ../shared (beside the repo) when present, else the
# copy carried into the repo's ignored .carry/ folder.
anchor_script() {
  for f in "$ROOT/../shared/anchors/torch_sdpa.py" "$ROOT/.carry/anchors/torch_sdpa.py"; do
    [ -f "$f" ] && { echo "$f"; return 0; }
  done
  return 1
}

section_env() {
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv 2>&1
  nvcc --version | tail -2
  cmake --version | head -1
  for h in /usr/include/nlohmann/json.hpp /usr/local/include/nlohmann/json.hpp; do
    [ -f "$h" ] && echo "nlohmann-json: $h"
  done
  python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())' 2>&1
}

# The project build; when it fails (a teammate's file mid-edit), a standalone
# build of the attention unit alone (its sources, test and bench) keeps the
# GPU checks going.
section_build() {
  # BUILD_MODE=standalone skips the project build (attention unit only).
  if [ "${BUILD_MODE:-cmake}" = standalone ]; then
    build_attention_standalone
    return
  fi
  # CMAKE_EXTRA: more cmake flags, e.g. one -DRUNLM_CUDA_GENCODE for sm_90a
  # alone (half the kernel build time when only the H100 runs).
  # shellcheck disable=SC2086
  if cmake -S . -B "$BUILD" -DRUNLM_CUDA=ON -DCMAKE_BUILD_TYPE=Release ${CMAKE_EXTRA:-} >"$OUT/cmake.log" 2>&1 &&
     cmake --build "$BUILD" -j "$JOBS" --target runlm_tests runlm >>"$OUT/cmake.log" 2>&1; then
    log "cmake build ok"
    return 0
  fi
  tail -30 "$OUT/cmake.log"
  log "cmake build failed; building the attention unit standalone"
  build_attention_standalone
}

build_attention_standalone() {
  local sb=$BUILD/standalone
  mkdir -p "$sb"
  local objs=() f o
  # Only the attention kernels: other kernels may need libraries (cuBLAS).
  for f in kernels/cuda/attn_*.cu kernels/cuda/fa3/*.cu; do
    [ -f "$f" ] || continue
    o=$sb/$(echo "$f" | tr '/' '_').o
    nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo \
      -DRUNLM_CUDA=1 -Isrc -Ikernels -Ikernels/cpu -c "$f" -o "$o" >>"$OUT/standalone.log" 2>&1 || return 1
    objs+=("$o")
  done
  g++ -std=c++20 -O3 -DRUNLM_CUDA=1 -DRUNLM_SOURCE_DIR="\"$ROOT\"" -DRUNLM_BINARY="\"\"" \
    -DRUNLM_RANDOM_MODEL_BINARY="\"\"" -Isrc -Ikernels -Ikernels/cpu -I/usr/local/cuda/include \
    src/attention.cpp src/common.cpp src/dtype.cpp kernels/cpu/attention_ref.cpp src/cmd_bench_attn.cpp \
    tests/test_attention.cpp "${objs[@]}" -o "$TESTS" -L/usr/local/cuda/lib64 -lgtest -lgtest_main \
    -lcudart -lcuda -lpthread >>"$OUT/standalone.log" 2>&1 || { tail -30 "$OUT/standalone.log"; return 1; }
  RUNLM=/nonexistent  # bench-attn through the test binary
  log "standalone attention build ok (runlm_tests = attention tests only)"
}

section_test() {
  timeout "$TEST_TIMEOUT" "$TESTS" --gtest_filter="$TEST_FILTER" --gtest_brief=1 >"$OUT/tests.log" 2>&1
  local rc=$?
  grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$OUT/tests.log" | sort | uniq -c | head -5
  grep -E "^\[  FAILED  \]" "$OUT/tests.log" | head -40
  grep -A6 "Failure$" "$OUT/tests.log" | head -60
  grep -E "GPU vs CPU" "$OUT/tests.log" | head -10
  grep -E "tests? ran|PASSED|FAILED" "$OUT/tests.log" | tail -3
  [ $rc -eq 124 ] && echo "tests timed out after ${TEST_TIMEOUT}s (hung kernel?)"
  return $rc
}

# HGMMA must be present in fa3; LDL/STL (local memory: spills or indexed
# register arrays) should be absent from the attention kernels.
section_sass() {
  local f
  : >"$OUT/sass.txt"
  for f in "$BUILD"/librunlm_cuda.a "$BUILD"/standalone/*.o; do
    [ -f "$f" ] && cuobjdump --dump-sass "$f" >>"$OUT/sass.txt"
  done
  grep -q "Function :" "$OUT/sass.txt" || { echo "no SASS found"; return 1; }
  awk '/Function :/ {f=$3} /HGMMA/ {h[f]++} /HMMA/ {m[f]++} /LDL|STL/ {l[f]++}
       END {for (f in h) printf "HGMMA %5d  %s\n", h[f], f; for (f in m) printf "HMMA  %5d  %s\n", m[f], f;
            for (f in l) printf "LDL/STL %3d  %s\n", l[f], f}' "$OUT/sass.txt" | c++filt | cut -c1-150 | sort | head -60
}

section_sanitize() {
  command -v compute-sanitizer >/dev/null || { echo "no compute-sanitizer"; return 1; }
  local rc=0 tool limit log trc errors
  for tool in $SANITIZE_TOOLS; do
    case $tool in
      memcheck) limit=$SANITIZE_TIMEOUT_MEMCHECK ;;
      racecheck) limit=$SANITIZE_TIMEOUT_RACECHECK ;;
      synccheck) limit=$SANITIZE_TIMEOUT_SYNCCHECK ;;
    esac
    log=$OUT/sanitize_$tool.log
    RUNLM_GPU_OPS_SMALL=1 timeout "$limit" compute-sanitizer --tool "$tool" --error-exitcode 9 \
      "$TESTS" --gtest_filter="$([ "$tool" = racecheck ] && echo "$RACECHECK_FILTER" || echo "$SANITIZE_FILTER")" >"$log" 2>&1
    trc=$?
    [ $trc -ne 0 ] && rc=1
    # memcheck/synccheck: "ERROR SUMMARY: N errors"; racecheck: "RACECHECK
    # SUMMARY: N hazards displayed (E errors, W warnings)". None printed: the
    # tool did not finish (timeout or crash), so count the reports so far.
    errors=$(sed -n -e 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' -e 's/.*RACECHECK SUMMARY:.*(\([0-9]*\) error.*/\1/p' "$log" | tail -1)
    [ -n "$errors" ] || errors="? ($(grep -E '^========= [^ ]' "$log" | grep -cvE 'SUMMARY|COMPUTE-SANITIZER') reports before the stop)"
    printf '%-9s errors %s | tests run %s, ok %s, failed %s, skipped %s%s\n' "$tool" "${errors:-?}" \
      "$(grep -c '^\[ RUN      \]' "$log")" "$(grep -c '^\[       OK \]' "$log")" \
      "$(grep -c '^\[  FAILED  \].*(' "$log")" "$(grep -c '^\[  SKIPPED \]' "$log")" \
      "$([ $trc -eq 124 ] && echo " | TIMED OUT after ${limit}s" || { [ $trc -ne 0 ] && echo " | exit $trc"; })"
  done
  return $rc
}

# runlm bench-attn, through the binary when it has the subcommand, else
# through the test binary's AttentionBench.FromEnv.
bench_attn() {
  if "$RUNLM" bench-attn --help >/dev/null 2>&1; then
    timeout "$BENCH_TIMEOUT" "$RUNLM" bench-attn "$@"
  else
    # JSON lines to stdout, gtest's own report (failures included) to stderr.
    RUNLM_BENCH_ATTN_ARGS="$*" timeout "$BENCH_TIMEOUT" "$TESTS" --gtest_filter=AttentionBench.FromEnv >"$OUT/bench_gtest.log"
    local rc=$?
    grep -E '^\{' "$OUT/bench_gtest.log"
    grep -vE '^\{' "$OUT/bench_gtest.log" >&2
    return $rc
  fi
}

section_bench() {
  local rc=0
  # shellcheck disable=SC2086
  bench_attn --attn "${BENCH_ATTN:-fa2,fa3}" -o json $BENCH_ARGS >"$OUT/bench_attn.jsonl" 2>"$OUT/bench_attn.err" || rc=1
  grep -E "exception|Failure|error" "$OUT/bench_attn.err" | head -5
  grep -c '"status": "ok"' "$OUT/bench_attn.jsonl" | sed 's/^/bench rows ok: /'
  grep -v '"status": "ok"' "$OUT/bench_attn.jsonl" | head -5
  return $rc
}

# Nsight Compute on one launch of each prefill backend (opt-in: add
# "profile" to SECTIONS): speed of light, occupancy, warp stall summary.
section_profile() {
  command -v ncu >/dev/null || { echo "no ncu"; return 1; }
  local be args
  for be in ${PROFILE_ATTN:-fa2 fa3}; do
    args="--attn $be --hdim ${PROFILE_HDIM:-128} --seqlen ${PROFILE_SEQLEN:-8192} --causal ${PROFILE_CAUSAL:-0} -r 1"
    if "$RUNLM" bench-attn --help >/dev/null 2>&1; then
      # shellcheck disable=SC2086
      timeout 180 ncu --kernel-name "regex:attn_${be}" --launch-count 1 --section SpeedOfLight --section Occupancy \
        --section WarpStateStats --section ComputeWorkloadAnalysis "$RUNLM" bench-attn $args >"$OUT/ncu_$be.txt" 2>&1
    else
      RUNLM_BENCH_ATTN_ARGS="$args" timeout 180 ncu --kernel-name "regex:attn_${be}" --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis \
        "$TESTS" --gtest_filter=AttentionBench.FromEnv >"$OUT/ncu_$be.txt" 2>&1
    fi
    echo "-- ncu $be ($args)"
    grep -E "Duration|Compute \(SM\) Throughput|Registers Per Thread|Achieved Occupancy|Issue Slots Busy|Warp Cycles Per Issued|stalled|Executed Ipc Active" \
      "$OUT/ncu_$be.txt" | cut -c1-220 | head -14
  done
}

section_anchors() {
  local a
  a=$(anchor_script) || { echo "torch_sdpa.py not found (../shared/anchors or .carry/anchors)"; return 1; }
  # shellcheck disable=SC2086
  PYTHONUNBUFFERED=1 python3 "$a" ceilings >"$OUT/anchors.jsonl" 2>"$OUT/anchors.err" &&
  PYTHONUNBUFFERED=1 python3 "$a" prefill $ANCHOR_ARGS >>"$OUT/anchors.jsonl" 2>>"$OUT/anchors.err"
  local rc=$?
  tail -3 "$OUT/anchors.err"
  return $rc
}

# FlashAttention-paper-style charts (opt-in: add "plot" to SECTIONS).
section_plot() {
  python3 "$ROOT/tools/plot_attn.py" "$OUT/bench_attn.jsonl" "$OUT/anchors.jsonl" -o "$OUT/plots"
}

# Our TFLOP/s per backend, torch's, and the ratios, one row per shape.
section_summary() {
  python3 - "$OUT/bench_attn.jsonl" "$OUT/anchors.jsonl" <<'EOF'
import json, sys
ours, torch, ceil = {}, {}, {}
def rows(path):
    try:
        for line in open(path):
            line = line.strip()
            if line.startswith("{"):
                yield json.loads(line)
    except FileNotFoundError:
        return
for r in rows(sys.argv[1]):
    key = (r["hdim"], r["seqlen"], bool(r["causal"]))
    ours.setdefault(key, {})[r["backend"]] = r["TFLOPs"] if r["status"] == "ok" else None
for r in rows(sys.argv[2]):
    if r.get("what") == "prefill":
        torch[(r["hdim"], r["seqlen"], bool(r["causal"]))] = r
    elif r.get("what") in ("copy", "gemm_bf16"):
        ceil[r["what"]] = r.get("TBps") or r.get("TFLOPs")
if ceil:
    print("ceilings: copy %.2f TB/s, bf16 gemm %.0f TFLOP/s" % (ceil.get("copy", 0), ceil.get("gemm_bf16", 0)))
backends = sorted({b for v in ours.values() for b in v})
def f(x):
    return "%7.1f" % x if isinstance(x, (int, float)) else "      -"
def ratio(a, b):
    return "%6.2f" % (a / b) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "     -"
hdr = "hdim   seq caus " + " ".join("%7s" % b for b in backends) + "   cudnn   flash  " + \
      " ".join("%s/cudnn %s/flash" % (b, b) for b in backends)
print(hdr)
for key in sorted(set(ours) | set(torch)):
    o, t = ours.get(key, {}), torch.get(key, {})
    cu, fl = t.get("cudnn_TFLOPs"), t.get("flash_TFLOPs")
    print("%4d %5d %4d " % (key[0], key[1], key[2]) + " ".join(f(o.get(b)) for b in backends) + " " + f(cu) + " " + f(fl) +
          "  " + " ".join("%8s %8s" % (ratio(o.get(b), cu), ratio(o.get(b), fl)) for b in backends))
EOF
}

# The shared models travel in the ignored .carry/shared (../shared does not
# reach the device): make ../shared point at it when it is missing.
section_shared() {
  if [ ! -f "$ROOT/../shared/models/stories260K.gguf" ] && [ -d "$ROOT/.carry/shared/models" ]; then
    mkdir -p "$ROOT/../shared"
    ln -sfn "$ROOT/.carry/shared/models" "$ROOT/../shared/models" && echo "../shared/models -> .carry/shared/models"
  fi
  ls "$ROOT/../shared/models" | head -20
}

# Random-weight Llama-2-7B models (the project's own tool) for the speed rows.
MODEL_DIR=${MODEL_DIR:-/tmp/runlm-models}
MODEL_TYPES=${MODEL_TYPES:-"q4_0 f16"}
section_models() {
  mkdir -p "$MODEL_DIR"
  local t
  for t in $MODEL_TYPES; do
    [ -f "$MODEL_DIR/llama2-7b-$t.gguf" ] && continue
    /usr/bin/time -f "make_random_model $t: %e s, %M KB" "$BUILD/make_random_model" --preset llama2-7b --type "$t" \
      --tokenizer "$ROOT/../shared/models/llama2-tokenizer.model" -o "$MODEL_DIR/llama2-7b-$t.gguf" || return 1
  done
  ls -la "$MODEL_DIR"
}

# runlm bench (llama-bench style) on each model: pp512 and tg128.
BENCH_MODEL_ARGS=${BENCH_MODEL_ARGS:-"-p 512 -n 128 -r 3"}
section_bench_model() {
  local t rc=0
  : >"$OUT/bench_model.md"
  for t in $MODEL_TYPES; do
    # shellcheck disable=SC2086
    "$RUNLM" bench -m "$MODEL_DIR/llama2-7b-$t.gguf" $BENCH_MODEL_ARGS -o md >"$OUT/bench_model_$t.md" 2>"$OUT/bench_model_$t.err" || rc=1
    tail -3 "$OUT/bench_model_$t.err"
    cat "$OUT/bench_model_$t.md" >>"$OUT/bench_model.md"
  done
  cat "$OUT/bench_model.md"
  return $rc
}

# The paged decode benches (the kernel that ran in each row) and torch's decode anchor.
section_paged() {
  RUNLM_BENCH=1 "$TESTS" --gtest_filter='PagedAttentionBench*' >"$OUT/paged_bench.log" 2>&1
  local rc=$?
  grep -E '^\{' "$OUT/paged_bench.log" >"$OUT/paged_bench.jsonl"
  sed -n '/^paged decode/,$p' "$OUT/paged_bench.log" | grep -vE '^\{|^\[' | head -60
  if [ -f tools/decode_anchor.py ]; then
    PYTHONUNBUFFERED=1 python3 tools/decode_anchor.py >"$OUT/decode_anchor.jsonl" 2>"$OUT/decode_anchor.err" || rc=1
    tail -3 "$OUT/decode_anchor.err"
  fi
  return $rc
}


# The end-to-end batch job of issue 6: 256 prompts of 128 tokens, 128 new
# tokens each (EOS ignored), on the random 7B models.
write_batch_prompts() {
  python3 - "$OUT/batch_prompts.jsonl" <<'PY'
import json, random, sys
random.seed(1)
words = "the of and to a in that is was he for it with as his on be at by had not are but from or have an they which one you were".split()
with open(sys.argv[1], "w") as f:
    for i in range(256):
        # ~128 tokens: about 100 common words (some split into two tokens).
        f.write(json.dumps({"id": i, "prompt": " ".join(random.choice(words) for _ in range(100))}) + "\n")
PY
}

section_batch_model() {
  local t rc=0
  write_batch_prompts
  for t in $MODEL_TYPES; do
    /usr/bin/time -f "batch $t wall %e s" "$RUNLM" batch -m "$MODEL_DIR/llama2-7b-$t.gguf" -f "$OUT/batch_prompts.jsonl" \
      -o "$OUT/batch_out_$t.jsonl" -n 128 --ignore-eos --temp 0 -np "${BATCH_PARALLEL:-256}" -c 512 -b "${BATCH_TOKENS:-4096}" \
      >"$OUT/batch_$t.log" 2>&1 || rc=1
    tail -2 "$OUT/batch_$t.log"
  done
  return $rc
}

# The decode GEMV kernels on the Llama-2-7B shapes (f32-x and int8-x).
section_gemv() {
  RUNLM_BENCH_GPU_OPS=1 timeout "$BENCH_TIMEOUT" "$TESTS" --gtest_filter='GpuOpsBench.GemvLlama7bShapes' \
    >"$OUT/gemv_bench.log" 2>&1
  local rc=$?
  grep -E '^\[bench\]' "$OUT/gemv_bench.log" | grep -E ' (q4_0|q8_0|f16) |copy|type' | head -40
  return $rc
}

# The fused Q4_0/Q8_0 GEMM (versions 1-3) against dequantization + cuBLAS on
# the Llama-2-7B shapes, 16 to 512 tokens.
section_gemm_fused() {
  RUNLM_BENCH_GPU_OPS=1 timeout "$BENCH_TIMEOUT" "$TESTS" --gtest_filter='GpuOpsBench.GemmFusedQuantShapes' \
    >"$OUT/gemm_fused_bench.log" 2>&1
  local rc=$?
  grep -E '^\[bench\]' "$OUT/gemm_fused_bench.log" | head -60
  return $rc
}

# Several Q4_0/Q8_0 matrices in one fused launch (q/k/v, gate/up:
# gemm_fused_q_multi) and auto's version 4 routing: the tests, the bench
# (singles vs multi rows, after the per-shape table) and the Q4_0 batch job
# three ways: before (one launch each, version 4 forced), auto routing
# alone (RUNLM_GEMM_MULTI=0), auto + multi (default).
section_gemm_multi() {
  local rc=0 v
  timeout 900 "$TESTS" --gtest_filter='GpuOps.GemmFused*:CudaEngine.Llama7BShape*:CudaEngine.Batched*' \
    >"$OUT/gemm_multi_tests.log" 2>&1 || rc=1
  grep -E '^\[  (PASSED|FAILED) |Failure|Expected|Which is' "$OUT/gemm_multi_tests.log" | head -20
  RUNLM_BENCH_GPU_OPS=1 timeout "$BENCH_TIMEOUT" "$TESTS" --gtest_filter='GpuOpsBench.GemmFusedQuantShapes' \
    >"$OUT/gemm_multi_bench.log" 2>&1 || rc=1
  grep -E '^\[bench\]' "$OUT/gemm_multi_bench.log" | grep -E 'multi|(4096x4096|11008x4096|4096x11008) +(128|256|512) '
  write_batch_prompts
  for v in "RUNLM_GEMM_MULTI=0 RUNLM_GEMM_FUSED_VERSION=4" "RUNLM_GEMM_MULTI=0" "RUNLM_GEMM_MULTI=1"; do
    env $v /usr/bin/time -f "batch q4_0 [$v] wall %e s" "$RUNLM" batch -m "$MODEL_DIR/llama2-7b-q4_0.gguf" \
      -f "$OUT/batch_prompts.jsonl" -o "$OUT/batch_multi_out.jsonl" -n 128 --ignore-eos --temp 0 -np 256 -c 512 \
      -b 4096 >"$OUT/batch_multi.log" 2>&1 || rc=1
    tail -2 "$OUT/batch_multi.log"
  done
  return $rc
}

# tg with the int8-activation GEMV off (RUNLM_GEMV_F32X=1) and without
# programmatic dependent launch (RUNLM_PDL=0), for comparison.
section_bench_ab() {
  local t v
  for t in $MODEL_TYPES; do
    for v in RUNLM_GEMV_F32X=1 RUNLM_PDL=0; do
      [ $v = RUNLM_GEMV_F32X=1 ] && case $t in q4_0|q8_0) ;; *) continue ;; esac
      env $v "$RUNLM" bench -m "$MODEL_DIR/llama2-7b-$t.gguf" -p 0 -n 128 -r 2 -o md 2>/dev/null |
        sed "s/\$/ ($v)/" | grep -E '^\| (random|llama)'
    done
  done
}

# Where a decode token's time goes: nsys over a short tg run on the first
# model, kernels summed (graph nodes traced one by one).
section_profile_tg() {
  command -v nsys >/dev/null || { echo "no nsys"; return 1; }
  local t=${MODEL_TYPES%% *}
  timeout 240 nsys profile -o "$OUT/tg_$t" --force-overwrite true --cuda-graph-trace=node -t cuda \
    "$RUNLM" bench -m "$MODEL_DIR/llama2-7b-$t.gguf" -p 0 -n 32 -r 1 >"$OUT/nsys_$t.log" 2>&1 || { tail -5 "$OUT/nsys_$t.log"; return 1; }
  nsys stats --report cuda_gpu_kern_sum --format csv "$OUT/tg_$t.nsys-rep" 2>/dev/null >"$OUT/tg_kern_$t.csv"
  python3 - "$OUT/tg_kern_$t.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
hdr = next(i for i, r in enumerate(rows) if r and r[0].startswith("Time"))
cols = rows[hdr]
data = [dict(zip(cols, r)) for r in rows[hdr + 1:] if len(r) == len(cols)]
tot = sum(float(d["Total Time (ns)"]) for d in data)
print("kernel time total %.1f ms over %d kernel names" % (tot / 1e6, len(data)))
for d in sorted(data, key=lambda d: -float(d["Total Time (ns)"]))[:14]:
    print("%5.1f%% %9.1f us x%-6s avg %7.2f us  %s" % (100 * float(d["Total Time (ns)"]) / tot, float(d["Total Time (ns)"]) / 1e3,
          d["Instances"], float(d["Avg (ns)"]) / 1e3, d["Name"][:90]))
PY
}

# Sums an `ncu --metrics gpu__time_duration.sum --csv` log by kernel name.
ncu_summary() {
  python3 - "$1" <<'PY'
import csv, sys, collections, re
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
rows = list(csv.reader(lines))
hdr = rows[0]
ki, vi = hdr.index("Kernel Name"), hdr.index("Metric Value")
tot, cnt = collections.Counter(), collections.Counter()
for r in rows[1:]:
    name = re.sub(r"\(.*", "", r[ki])[:70]
    v = float(r[vi].replace(",", ""))
    unit = r[hdr.index("Metric Unit")]
    # ncu names units "nsecond"/"usecond"/"msecond" or "ns"/"us"/"ms" by version.
    v = v / 1e3 if unit in ("nsecond", "ns") else (v if unit in ("usecond", "us") else v * 1e3)
    tot[name] += v; cnt[name] += 1
s = sum(tot.values())
print("ncu: %d kernels, %.1f us GPU time" % (sum(cnt.values()), s))
for n, v in tot.most_common(16):
    print("%5.1f%% %9.1f us x%-5d avg %7.2f us  %s" % (100 * v / s, v, cnt[n], v / cnt[n], n))
PY
}

# Per-kernel GPU time of a short decode run (Nsight Compute, one metric),
# summed by kernel name: what the launch gaps leave out.
section_ncu_tg() {
  command -v ncu >/dev/null || { echo "no ncu"; return 1; }
  local t=${MODEL_TYPES%% *}
  timeout 300 ncu --metrics gpu__time_duration.sum --csv -c ${NCU_KERNELS:-1200} \
    "$RUNLM" bench -m "$MODEL_DIR/llama2-7b-$t.gguf" -p 0 -n 3 -r 1 >"$OUT/ncu_tg_$t.csv" 2>"$OUT/ncu_tg_$t.err" || { tail -5 "$OUT/ncu_tg_$t.err"; }
  ncu_summary "$OUT/ncu_tg_$t.csv"
}

# The same for batched decode steps of 256 sequences (bench -npl 256 with
# one prompt token each, so every step carries 256 tokens): the first ~2
# steps' kernels, per model type.
section_ncu_batch() {
  command -v ncu >/dev/null || { echo "no ncu"; return 1; }
  local t
  for t in $MODEL_TYPES; do
    timeout 240 ncu --metrics gpu__time_duration.sum --csv -c ${NCU_BATCH_KERNELS:-1100} \
      "$RUNLM" bench -m "$MODEL_DIR/llama2-7b-$t.gguf" -npl 256 -npp 1 -ntg 2 -b 4096 -o md \
      >"$OUT/ncu_batch_$t.csv" 2>"$OUT/ncu_batch_$t.err" || { tail -5 "$OUT/ncu_batch_$t.err"; }
    echo "-- $t, B=256 steps"
    ncu_summary "$OUT/ncu_batch_$t.csv"
  done
}

# Decode at 32k context (issue 7): one sequence, 32768 prompt tokens, 64
# generated, on the paged cache with f16, q8_0 and q4_0 KV, and with a
# 4096-token sliding window (f16).
section_long_ctx() {
  local t=${MODEL_TYPES%% *} args
  for args in "-ctk f16 -ctv f16" "-ctk q8_0 -ctv q8_0" "-ctk q4_0 -ctv q4_0" "-ctk f16 -ctv f16 --swa 4096"; do
    # shellcheck disable=SC2086
    timeout 120 "$RUNLM" bench -m "$MODEL_DIR/llama2-7b-$t.gguf" -npl 1 -npp 32768 -ntg 64 -b 4096 --kv paged $args \
      -o md 2>"$OUT/long_ctx.err" | grep -E '^\| (random|llama)' | sed "s/\$/ $args/"
    tail -1 "$OUT/long_ctx.err"
  done
}

# Prefill of one 32k prompt on the paged cache: attention reading the pages
# (default) against K/V gathered out of them first, at two page sizes.
section_prefill_kv() {
  local t=${MODEL_TYPES%% *} bs mode
  for bs in 16 64; do
    for mode in pages gather; do
      RUNLM_PREFILL_KV=$mode timeout 120 "$RUNLM" bench -m "$MODEL_DIR/llama2-7b-$t.gguf" -npl 1 -npp 32768 -ntg 16 \
        -b 4096 --kv paged --block-size $bs -o md 2>"$OUT/prefill_kv.err" | grep -E '^\| (random|llama)' |
        sed "s/\$/ block-size $bs, $mode/"
      grep -E 'rror' "$OUT/prefill_kv.err" || true
    done
  done
}

# Typed KV pools in prefill (issue 7): fa2 reading q8_0 (and q4_0 V) pages
# in place vs fa2 on gather_kv's f16 copy (the path before), and auto (fa3
# + gather) for scale; one 32k prompt in chunks of 4096, pages of 16.
section_prefill_kvq() {
  local t=${MODEL_TYPES%% *} kv attn mode
  for kv in "q8_0 q8_0" "q8_0 q4_0"; do
    for attn in fa2 auto; do
      for mode in pages gather; do
        [ "$attn" = auto ] && [ "$mode" = pages ] && continue  # auto on sm_90 is fa3: gather either way
        set -- $kv
        RUNLM_PREFILL_KV=$mode timeout 150 "$RUNLM" bench -m "$MODEL_DIR/llama2-7b-$t.gguf" -npl 1 -npp 32768 -ntg 16 \
          -b 4096 --kv paged --block-size 16 -ctk $1 -ctv $2 --attn $attn -o md 2>"$OUT/prefill_kvq.err" |
          grep -E '^\| (random|llama)' | sed "s/\$/ K=$1 V=$2 --attn $attn, $mode/"
        grep -E 'rror|prefill attention' "$OUT/prefill_kvq.err" || true
      done
    done
  done
}

# runlm bench's parallel-sequences mode (llama-batched-bench columns).
section_bench_npl() {
  local t
  for t in $MODEL_TYPES; do
    timeout 200 "$RUNLM" bench -m "$MODEL_DIR/llama2-7b-$t.gguf" -npl ${NPL:-1,16,64,256} -npp 128 -ntg 128 -b 4096 -o md \
      2>"$OUT/bench_npl_$t.err" | tee "$OUT/bench_npl_$t.md" | grep -E '^\|'
    grep -E '^bench:|rror' "$OUT/bench_npl_$t.err"
  done
}

# fa3's tile order: head groups (default), one group (lpt), one head a group.
section_fa3_sched() {
  local v
  for v in groups lpt head; do
    echo "-- RUNLM_FA3_SCHED=$v"
    RUNLM_FA3_SCHED=$v "$RUNLM" bench-attn --attn fa3 --hdim 128 --seqlen 2048,8192,16384 2>&1 | tail -8
  done
}

# fa3's kernel variants (RUNLM_FA3_VARIANT, d128 contiguous K/V, BN 128): 1
# FA3-order O rescale (the default kernel's loop; the default runs BN 176),
# 0 v4's order, 2 ping-pong, 3 both. The fa3 tests under each
# (AttentionGpuFa3Variants sets them itself: run once), then bench-attn fa3
# d128 bf16 at FA3_VARIANT_SEQLEN, causal and not, each variant in its own
# process (the variable is read once), the rounds repeated FA3_VARIANT_ROUNDS
# times in turn so clock drift shows; one table of medians per variant.
FA3_VARIANT_SEQLEN=${FA3_VARIANT_SEQLEN:-8192,16384}
FA3_VARIANT_ROUNDS=${FA3_VARIANT_ROUNDS:-2}
section_fa3_variant() {
  local rc=0 v i
  timeout "$TEST_TIMEOUT" "$TESTS" --gtest_filter='AttentionGpuFa3Variants.*' >"$OUT/fa3_variant_test.log" 2>&1 || rc=1
  grep -E '^\[  (PASSED|FAILED)  \]|Failure|variant' "$OUT/fa3_variant_test.log" | head -20
  for v in 1 2 3; do
    printf -- '-- tests RUNLM_FA3_VARIANT=%s ' "$v"
    RUNLM_FA3_VARIANT=$v timeout "$TEST_TIMEOUT" "$TESTS" --gtest_filter='All/AttentionGpu.*fa3*d128*:AttentionGpuRescale.*' \
      >"$OUT/fa3_variant_test_$v.log" 2>&1 || rc=1
    grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/fa3_variant_test_$v.log" | tr '\n' ' '; echo
  done
  : >"$OUT/fa3_variant.jsonl"
  for ((i = 0; i < FA3_VARIANT_ROUNDS; i++)); do
    for v in 0 1 2 3; do
      RUNLM_FA3_VARIANT=$v "$RUNLM" bench-attn --attn fa3 --hdim 128 --seqlen "$FA3_VARIANT_SEQLEN" -o json 2>>"$OUT/fa3_variant.err" |
        sed "s/^{/{\"variant\": $v, \"round\": $i, /" >>"$OUT/fa3_variant.jsonl" || rc=1
    done
  done
  python3 - "$OUT/fa3_variant.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
res = {}
for r in rows:
    if r.get("status") == "ok":
        res.setdefault((r["seqlen"], r["causal"], r["variant"]), []).append(r["TFLOPs"])
print("| seq | causal | v0 v4 order | v1 rescale | v2 ping-pong | v3 both | rounds |")
print("|---:|---|---:|---:|---:|---:|---|")
for seq, causal in sorted({(k[0], k[1]) for k in res}):
    cells = [res.get((seq, causal, v), []) for v in range(4)]
    med = ["%.1f" % statistics.median(c) if c else "-" for c in cells]
    print(f"| {seq} | {'yes' if causal else 'no'} | " + " | ".join(med) + " | " +
          "; ".join("/".join("%.0f" % x for x in c) for c in cells) + " |")
PY
  return $rc
}

# fa2 v5 against v4 (issue 5), one run: the fa2 tests under each kernel
# version and launch order (RUNLM_FA2_VERSION=4: v4, the old kernel;
# RUNLM_FA2_ORDER=head|lpt|pair forces an order; the default is v5 with lpt
# for causal problems of >= 64 query blocks, pair below), then bench-attn
# fa2 d128 bf16 under each, torch's flash on the same shapes, one table.
FA2_AB_SEQLEN=${FA2_AB_SEQLEN:-2048,8192,16384}
section_fa2_ab() {
  local rc=0 cfg name a
  local filter='All/AttentionGpu.*fa2*:Paged/AttentionPagedGpu.*fa2*:Typed/AttentionPagedTypedGpu.*fa2*:AttentionGpuRescale.*'
  # FA2_AB_TESTS=0: the table only (the tests ran elsewhere in the same run).
  [ "${FA2_AB_TESTS:-1}" = 0 ] ||
  for cfg in RUNLM_FA2_VERSION=4 RUNLM_FA2_ORDER=head RUNLM_FA2_ORDER=lpt RUNLM_FA2_ORDER=pair RUNLM_FA2_DEFAULT=1; do
    printf -- '-- tests %-22s ' "$cfg"
    env "$cfg" timeout "$TEST_TIMEOUT" "$TESTS" --gtest_filter="$filter" >"$OUT/fa2_ab_test_${cfg#*=}_${cfg%%=*}.log" 2>&1 || rc=1
    grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/fa2_ab_test_${cfg#*=}_${cfg%%=*}.log" | tr '\n' ' '; echo
  done
  for cfg in RUNLM_FA2_VERSION=4 RUNLM_FA2_ORDER=head RUNLM_FA2_ORDER=lpt RUNLM_FA2_ORDER=pair RUNLM_FA2_DEFAULT=1; do
    name=${cfg#RUNLM_FA2_}
    env "$cfg" "$RUNLM" bench-attn --attn fa2 --hdim 128 --seqlen "$FA2_AB_SEQLEN" -o json \
      >"$OUT/fa2_ab_$name.jsonl" 2>"$OUT/fa2_ab_$name.err" || rc=1
  done
  a=$(anchor_script) && PYTHONUNBUFFERED=1 python3 "$a" prefill --hdim 128 --seqlen "$FA2_AB_SEQLEN" \
    >"$OUT/fa2_ab_torch.jsonl" 2>"$OUT/fa2_ab_torch.err"
  python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
cols = ["VERSION=4", "ORDER=head", "ORDER=lpt", "ORDER=pair", "DEFAULT=1"]
res = {}
for c in cols:
    for line in open(os.path.join(out, f"fa2_ab_{c}.jsonl")) if os.path.exists(os.path.join(out, f"fa2_ab_{c}.jsonl")) else []:
        r = json.loads(line)
        if r.get("status") == "ok":
            res[(r["seqlen"], bool(r["causal"]), c)] = r["TFLOPs"]
flash = {}
p = os.path.join(out, "fa2_ab_torch.jsonl")
for line in open(p) if os.path.exists(p) else []:
    r = json.loads(line)
    if r.get("what") == "prefill":
        flash[(r["seqlen"], bool(r["causal"]))] = r.get("flash_TFLOPs")
print("fa2 d128 bf16 TFLOP/s (v4 = old kernel; v5 under each order; default = v5's choice)")
print("| seq | causal | v4 | v5 head | v5 lpt | v5 pair | v5 default | torch flash | v4/flash | default/flash |")
print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for s, c in sorted({(k[0], k[1]) for k in res}):
    v = [res.get((s, c, col)) for col in cols]
    f = flash.get((s, c))
    ratio = lambda x: f"{x / f:.2f}" if x and f else "-"
    print(f"| {s} | {'yes' if c else 'no'} | " + " | ".join(f"{x:.1f}" if x else "-" for x in v) +
          f" | {f if f else '-'} | {ratio(v[0])} | {ratio(v[4])} |")
PY
  return $rc
}

# The last lines of the run: the engine's numbers in one place.
section_final() {
  [ -s "$OUT/bench_model.md" ] && { echo "runlm bench (Llama-2-7B shape, random weights):"; grep -E '^\| (random|llama|model)' "$OUT/bench_model.md" | sort -u; }
  for f in "$OUT"/batch_*.log; do [ -f "$f" ] && { echo "$(basename "$f"):"; grep -E "^batch:|wall" "$f"; }; done
  [ -s "$OUT/paged_bench.log" ] && { echo "paged decode:"; grep -E '\|' "$OUT/paged_bench.log" | tail -20; }
  return 0
}

for s in $SECTIONS; do
  log "section $s"
  # Process substitution, not a pipe: a section may set variables (RUNLM).
  if ! "section_$s" > >(tee "$OUT/section_$s.log") 2>&1; then
    FAILED+=("$s")
  fi
done
log "done; failed sections: ${FAILED[*]:-none}"
# BUNDLE=1 (for the lent-GPU tool, which returns at most 8 files): pack the
# logs and charts into logs.tgz, keep the JSON files beside it.
if [ "${BUNDLE:-0}" = 1 ]; then
  (cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz --exclude='*.jsonl' --exclude=sass.txt . &&
   find . -maxdepth 1 -type f ! -name logs.tgz ! -name '*.jsonl' -delete && rm -rf plots) 2>/dev/null
fi
[ ${#FAILED[@]} -eq 0 ]
