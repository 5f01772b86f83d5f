#!/usr/bin/env bash
# Runs one libFuzzer target for a while from its seeds and says what it
# found; exits 1 on any crash, leak, timeout or out-of-memory. The same
# script is the //tests:fuzz tests (under `bazel test --config=fuzz`) and
# what tools/fuzz runs for each target.
#
# Usage: run_fuzzer.sh BINARY SEED_FILE_OR_DIR...
# Environment:
#   RDMAEMU_FUZZ_SECONDS  how long (default 30)
#   RDMAEMU_FUZZ_CORPUS   the working corpus directory (default: a scratch
#                         directory, so the checked-in seeds never change);
#                         the seeds are copied into it first
#   RDMAEMU_FUZZ_ARTIFACTS where a crashing input is written (default: the
#                         test's undeclared outputs, else the scratch dir)
#   RDMAEMU_FUZZ_LOG      keep libFuzzer's whole output there (default: the
#                         scratch dir; only its end is printed)
#   RDMAEMU_FUZZ_RSS_MB   libFuzzer's -rss_limit_mb (default 2048)
# The last line is the summary, e.g.
#   fuzz: receive_fuzzer: 123456 runs in 30 s (4115/s), cov 2345, ft 6789,
#   corpus 210 (47 seeds), peak RSS 310 MB: 0 crashes, 0 leaks, 0 timeouts, 0 OOMs
set -uo pipefail

if (( $# < 1 )); then
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
bin=$1
shift
name=$(basename "$bin")
seconds=${RDMAEMU_FUZZ_SECONDS:-30}

scratch=$(mktemp -d "${TEST_TMPDIR:-${TMPDIR:-/tmp}}/fuzz-$name.XXXXXX")
failed=0
# A failed run's scratch directory stays: it may hold the crashing input.
trap '(( failed == 0 )) && rm -rf "$scratch"' EXIT
corpus=${RDMAEMU_FUZZ_CORPUS:-$scratch/corpus}
artifacts=${RDMAEMU_FUZZ_ARTIFACTS:-${TEST_UNDECLARED_OUTPUTS_DIR:-$scratch}/artifacts}
log=${RDMAEMU_FUZZ_LOG:-$scratch/fuzz.log}
mkdir -p "$corpus" "$artifacts"

# The plain (gcc) build links the replay driver, not libFuzzer: say so
# rather than "fuzzing" with it.
# (The whole help read first: grep -q quitting early would SIGPIPE it.)
help=$("$bin" -help=1 2>&1)
if ! grep -q 'libFuzzer' <<<"$help"; then
  echo "fuzz: $name is not built with libFuzzer: build it with --config=fuzz (tools/fuzz does)" >&2
  exit 1
fi

# Stacks with function names and lines: clang-14's own symbolizer (llvm-14),
# which is not on PATH without Debian's unversioned llvm package.
if [[ -z ${ASAN_SYMBOLIZER_PATH:-} && -x /usr/lib/llvm-14/bin/llvm-symbolizer ]]; then
  export ASAN_SYMBOLIZER_PATH=/usr/lib/llvm-14/bin/llvm-symbolizer
fi

seeds=0
for s in "$@"; do
  if [[ -d $s ]]; then
    for f in "$s"/*; do [[ -f $f ]] && cp "$f" "$corpus/" && seeds=$((seeds + 1)); done
  elif [[ -f $s ]]; then
    cp "$s" "$corpus/" && seeds=$((seeds + 1))
  fi
done
chmod -R u+w "$corpus"

# -timeout: an input that takes 5 s is a hang (none takes a millisecond).
# -rss_limit_mb: growth past 2 GiB is a leak that outlived an input.
# -print_final_stats: the run counts parsed below.
"$bin" -max_total_time="$seconds" -timeout=5 -rss_limit_mb="${RDMAEMU_FUZZ_RSS_MB:-2048}" \
  -print_final_stats=1 \
  -artifact_prefix="$artifacts/" "$corpus" >"$log" 2>&1
status=$?

last_status=$(grep -E '^#[0-9]+' "$log" | tail -n 1)
field() { sed -n "s/.* $1: \([0-9]*\).*/\1/p" <<<"$last_status"; }
stat() { sed -n "s/^stat::$1: *\([0-9]*\).*/\1/p" "$log" | tail -n 1; }
runs=$(stat number_of_executed_units)
rate=$(stat average_exec_per_sec)
rss=$(stat peak_rss_mb)
cov=$(field cov)
ft=$(field ft)
corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last_status")
crashes=$(grep -cE 'ERROR: (AddressSanitizer|libFuzzer: deadly signal|libFuzzer: fuzz target exited)|runtime error:' "$log")
leaks=$(grep -c 'ERROR: LeakSanitizer' "$log")
timeouts=$(grep -c 'ERROR: libFuzzer: timeout' "$log")
ooms=$(grep -c 'ERROR: libFuzzer: out-of-memory' "$log")
found=$(find "$artifacts" -type f | wc -l)

if (( status != 0 || crashes + leaks + timeouts + ooms + found > 0 )); then
  failed=1
  # The report itself: the first sanitizer or libFuzzer error and its stack.
  grep -n -m1 -E 'ERROR:|runtime error:' "$log" >&2 || true
  sed -n '/ERROR:\|runtime error:/,$p' "$log" | head -n 80 >&2
  echo "fuzz: $name: libFuzzer exited with status $status; input(s) kept in $artifacts:" >&2
  ls -l "$artifacts" >&2
  echo "fuzz: reproduce with: $bin <input>   (docs/testing.md, \"Fuzzing\")" >&2
else
  tail -n 3 "$log"
fi
echo "fuzz: $name: ${runs:-?} runs in $seconds s (${rate:-?}/s), cov ${cov:-?}, ft ${ft:-?}," \
     "corpus ${corp:-?} ($seeds seeds), peak RSS ${rss:-?} MB:" \
     "$crashes crashes, $leaks leaks, $timeouts timeouts, $ooms OOMs"
exit $failed
