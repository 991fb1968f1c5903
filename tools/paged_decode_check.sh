#!/usr/bin/env bash
# On a GPU machine: build runlm_tests (CUDA), run the paged decode tests and
# the decode sweep bench (RUNLM_BENCH=1), the torch SDPA anchor, a SASS check
# of the kernel (16-byte loads, no local memory), and, with --sanitize, a
# compute-sanitizer memcheck on small tests. Logs go to $OUT (or /tmp/paged);
# the last thing printed is the comparison table.
#   tools/paged_decode_check.sh [--sanitize] [--no-anchor]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/paged}
mkdir -p "$OUT"
SAN=0
ANCHOR=1
for a in "$@"; do
  case $a in
    --sanitize) SAN=1 ;;
    --no-anchor) ANCHOR=0 ;;
  esac
done
B=build-paged-dev
t0=$(date +%s)
# The project build; when it fails (a teammate's file mid-edit), a standalone
# build of this unit alone (kernel, reference, test) keeps the checks going.
standalone() {
  mkdir -p $B/sa/CMakeFiles
  nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo -DRUNLM_CUDA=1 \
    -Isrc -Ikernels -c kernels/cuda/paged_attention.cu -o $B/sa/paged_attention.cu.o &&
  for k in f16 bf16 q8_0 q4_0 fp8; do
    nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo -DRUNLM_CUDA=1 \
      -Isrc -Ikernels -c kernels/cuda/inst/paged_decode_k$k.cu -o $B/sa/paged_decode_k$k.cu.o || return 1
  done &&
  g++ -std=c++20 -O2 -DRUNLM_CUDA=1 -DRUNLM_SOURCE_DIR="\"$PWD\"" -Isrc -Ikernels -Ikernels/cpu \
    -I/usr/local/cuda/include tests/test_paged_attention.cpp kernels/cpu/ops.cpp kernels/cpu/quant.cpp \
    kernels/cpu/kv_quant.cpp src/dtype.cpp src/common.cpp src/thread_pool.cpp $B/sa/*.cu.o -o $B/runlm_tests \
    -L/usr/local/cuda/lib64 -lgtest -lgtest_main -lcudart -lpthread
}
if cmake -S . -B $B -DRUNLM_CUDA=ON >"$OUT/cmake.log" 2>&1 &&
   cmake --build $B -j16 --target runlm_tests >"$OUT/build.log" 2>&1; then
  echo "cmake build ok"
else
  grep -E "error" -A3 "$OUT/build.log" "$OUT/cmake.log" | head -20
  echo "cmake build failed; standalone build"
  standalone >"$OUT/standalone.log" 2>&1 || { tail -30 "$OUT/standalone.log"; exit 1; }
fi
echo "build: $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader

RUNLM_BENCH=1 $B/runlm_tests --gtest_filter='PagedAttention*' >"$OUT/tests.log" 2>&1
echo "tests rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/tests.log" | tr '\n' ' ')"
grep -E "FAILED|Failure|error" "$OUT/tests.log" | head -20
grep -E '^\[       OK|^\[  FAILED' "$OUT/tests.log" | sed -E 's/^\[ *(OK|FAILED) *\] //' | tr '\n' ';'
echo

# The kernels live in kernels/cuda/inst/paged_decode_k<K>.cu (one object per K type).
: >"$OUT/paged.sass"
for o in $(find $B -name 'paged_decode_k*.cu.o'); do cuobjdump --dump-sass "$o" >>"$OUT/paged.sass" 2>/dev/null; done
awk '/Function : .*paged_decode_kernelINS_5KvF16ES2_Li128ELi4E/{f=1;next} /Function : /{f=0} f' "$OUT/paged.sass" >"$OUT/k128r4.sass"
for kv in KvQ8 KvFp8 KvQ4; do
  awk "/Function : .*paged_decode_kernelINS_[0-9]*${kv}ES2_Li128ELi4E/{f=1;next} /Function : /{f=0} f" "$OUT/paged.sass" >"$OUT/k128r4_$kv.sass"
  echo "sass $kv/hd128/R4: instructions=$(grep -cE '^\s+/\*[0-9a-f]{4}\*/' "$OUT/k128r4_$kv.sass") LDG=$(grep -c 'LDG' "$OUT/k128r4_$kv.sass") LDL=$(grep -c LDL "$OUT/k128r4_$kv.sass") PRMT=$(grep -c PRMT "$OUT/k128r4_$kv.sass") F2FP=$(grep -c F2FP "$OUT/k128r4_$kv.sass") I2F=$(grep -c I2F "$OUT/k128r4_$kv.sass")"
done
echo "sass f16/hd128/R4: LDG.128=$(grep -c 'LDG.E.128' "$OUT/k128r4.sass") LDG.E.CONSTANT.128=$(grep -c 'LDG.*128' "$OUT/k128r4.sass") LDL=$(grep -c 'LDL' "$OUT/paged.sass") STL=$(grep -c 'STL' "$OUT/paged.sass") SHFL=$(grep -c SHFL "$OUT/k128r4.sass") MUFU.EX2=$(grep -c 'MUFU.EX2' "$OUT/k128r4.sass")"
grep -oE 'LDG[.A-Z0-9]*' "$OUT/k128r4.sass" | sort | uniq -c | tr '\n' ' '
echo

if [ $ANCHOR = 1 ]; then
  export PYTHONUNBUFFERED=1
  python3 tools/decode_anchor.py --dtypes f16 >"$OUT/anchor.jsonl" 2>"$OUT/anchor.err"
  python3 tools/decode_anchor.py --dtypes bf16 --batches 1,64 --ctxs 8192,32768 >>"$OUT/anchor.jsonl" 2>>"$OUT/anchor.err"
  grep -E '"error"' "$OUT/anchor.jsonl" | head -6
  tail -3 "$OUT/anchor.err"
fi

if [ $SAN = 1 ]; then
  compute-sanitizer --tool memcheck --error-exitcode 9 $B/runlm_tests \
    --gtest_filter='PagedAttention.OutOfBound*:PagedAttention.Bf16Pool:PagedAttention.GraphReplays*' >"$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$OUT/memcheck.log" | tr '\n' ' ')"
  compute-sanitizer --tool initcheck --error-exitcode 9 $B/runlm_tests \
    --gtest_filter='PagedAttention.Bf16Pool' >"$OUT/initcheck.log" 2>&1
  echo "initcheck rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/initcheck.log" | tr '\n' ' ')"
fi

grep -E '"bench":"paged_decode_part"' "$OUT/tests.log" | python3 -c '
import json,sys
for l in sys.stdin:
    r=json.loads(l); print("part B=%d L=%d P=%d %.1f us %.0f GB/s" % (r["B"],r["L"],r["part"],r["us"],r["gbps"]))'
sed -n '/^paged decode sweep/,$p' "$OUT/tests.log" | head -40
[ $ANCHOR = 1 ] && python3 tools/decode_anchor.py --merge "$OUT/tests.log" "$OUT/anchor.jsonl"
echo "total: $(( $(date +%s) - t0 )) s"
