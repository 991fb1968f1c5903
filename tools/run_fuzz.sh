#!/usr/bin/env bash
# Runs libFuzzer targets for a bounded time each and fails if any finds a
# crash, a sanitizer report, a leak, a timeout or an out-of-memory.
#
#   tools/run_fuzz.sh BUILD SECONDS TARGET...
#
# Each target runs on BUILD/corpus/TARGET (new inputs are added there), with
# tests/fuzz/TARGET.dict when present; a failing input is saved under
# BUILD/artifacts/TARGET/ and the log under BUILD/fuzz-logs/. One line per
# run (executions, seconds, corpus files and bytes) is appended to
# BUILD/fuzz-stats.tsv, the figures the reliability notes quote.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=$1
SECONDS_EACH=$2
shift 2
mkdir -p "$BUILD/fuzz-logs"
STATS=$BUILD/fuzz-stats.tsv
[ -f "$STATS" ] || printf 'date\ttarget\tseconds\texecs\texecs_per_s\tcorpus_files\tcorpus_bytes\tresult\n' > "$STATS"
failed=0
for t in "$@"; do
  mkdir -p "$BUILD/corpus/$t" "$BUILD/artifacts/$t"
  extra=()
  [ -f "tests/fuzz/$t.dict" ] && extra+=(-dict="tests/fuzz/$t.dict")
  # GGUF seeds are whole tiny models; bigger inputs only slow the target down.
  [ "$t" = fuzz_gguf ] && extra+=(-max_len=200000)
  # Real chat templates run to 20 KB.
  [ "$t" = fuzz_jinja ] && extra+=(-max_len=32768)
  log=$BUILD/fuzz-logs/$t.log
  # timeout: a unit slower than 10 s is a hang. rss/malloc limits: an input
  # that makes the reader allocate 2 GB is a bug too.
  "$BUILD/$t" "$BUILD/corpus/$t" "${extra[@]}" -max_total_time="$SECONDS_EACH" -timeout=10 \
    -rss_limit_mb=2048 -malloc_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$BUILD/artifacts/$t/" > "$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  secs=$(grep -o 'Done [0-9]* runs in [0-9]* second' "$log" | tail -1 | awk '{print $5}')
  files=$(find "$BUILD/corpus/$t" -type f | wc -l)
  bytes=$(du -sb "$BUILD/corpus/$t" | cut -f1)
  result=ok
  if [ $rc -ne 0 ]; then
    result="FAILED(rc=$rc)"
    failed=1
    grep -E 'ERROR|SUMMARY|Test unit written|deadly|==[0-9]+==' "$log" | head -20
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "$t" "${secs:-?}" "${execs:-?}" "${rate:-?}" \
    "$files" "$bytes" "$result" >> "$STATS"
  echo "fuzz $t: $result, ${execs:-?} executions in ${secs:-?} s (${rate:-?}/s), corpus $files files, $bytes bytes"
done
exit $failed
