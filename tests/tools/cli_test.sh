#!/bin/bash
# The rdmaemu binary as a user meets it: help texts, exit statuses, errors on
# stderr that name what was wrong, and what `run` hands to the program.
# Usage: cli_test.sh RDMAEMU LIBIBVERBS
set -u
# Absolute, not resolved: the tool must work from its runfiles path.
tool="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
lib="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
checks=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# t NAME EXPECTED_STATUS CMD...: runs CMD, keeps stdout/stderr in $out/$err.
t() {
  local name="$1" want="$2"
  shift 2
  checks=$((checks + 1))
  out="$tmp/$name.out"
  err="$tmp/$name.err"
  "$@" >"$out" 2>"$err"
  local rc=$?
  if [[ "$rc" != "$want" ]]; then
    fail "$name: exit status $rc, want $want; stderr:"
    sed 's/^/    /' "$err" | head -10
    return 1
  fi
  return 0
}
has() {  # has NAME FILE REGEX
  if ! grep -qE -- "$3" "$2"; then
    fail "$1: no line matching '$3' in $(basename "$2"):"
    sed 's/^/    /' "$2" | head -15
  fi
}
hasnt() {  # hasnt NAME FILE REGEX
  if grep -qE -- "$3" "$2"; then
    fail "$1: a line matches '$3' in $(basename "$2"):"
    grep -E -- "$3" "$2" | sed 's/^/    /' | head -5
  fi
}
empty() {  # empty NAME FILE
  if [[ -s "$2" ]]; then
    fail "$1: $(basename "$2") should be empty:"
    sed 's/^/    /' "$2" | head -5
  fi
}

# --- help and version
t help 0 "$tool" --help && { has help "$out" '^Usage: rdmaemu'; has help "$out" '^  run '; has help "$out" '^  devices '; empty help "$err"; }
t help_short 0 "$tool" -h && has help_short "$out" '^Usage: rdmaemu'
t help_word 0 "$tool" help && has help_word "$out" '^Usage: rdmaemu'
t version 0 "$tool" --version && has version "$out" '^rdmaemu [0-9]+\.[0-9]+\.[0-9]+$'
for cmd in run devices list port event fault stats capture; do
  t "help_$cmd" 0 "$tool" help "$cmd" && has "help_$cmd" "$out" "^Usage: rdmaemu $cmd"
  t "${cmd}_help" 0 "$tool" "$cmd" --help && has "${cmd}_help" "$out" "^Usage: rdmaemu $cmd"
  t "${cmd}_h" 0 "$tool" "$cmd" -h && has "${cmd}_h" "$out" "^Usage: rdmaemu $cmd"
done
has help "$tmp/help.out" '^  list '
has help "$tmp/help.out" '^  port '
has help "$tmp/help.out" '^  event '
has help "$tmp/help.out" '^  fault '
has help "$tmp/help.out" '^  stats '
has help "$tmp/help.out" '^  capture '
# Only working commands are offered: nothing announced for later.
if grep -qE '^  (demo) ' "$tmp/help.out"; then
  fail "help lists a command that does not exist yet"
fi
t unimplemented 2 "$tool" demo && has unimplemented "$err" "unknown command 'demo'"
# The control commands' help needs no running process and names its options.
t port_help_text 0 "$tool" port --help && { has port_help_text "$out" '^  down '; has port_help_text "$out" '--pid PID'; }
t event_help_text 0 "$tool" help event && { has event_help_text "$out" '--qp QPN'; has event_help_text "$out" 'WQ_FATAL'; }

# --- usage errors: status 2, stderr names the culprit, stdout stays clean
t no_args 2 "$tool" && has no_args "$err" '^Usage: rdmaemu'
t bad_cmd 2 "$tool" frobnicate && { has bad_cmd "$err" "unknown command 'frobnicate'"; empty bad_cmd "$out"; }
t bad_top_opt 2 "$tool" --frob && has bad_top_opt "$err" "unknown option '--frob'"
t help_help 0 "$tool" help help && has help_help "$out" '^Usage: rdmaemu help COMMAND'
t help_bad 2 "$tool" help frobnicate && has help_bad "$err" "unknown command 'frobnicate'"
t run_bad_opt 2 "$tool" run --frob -- true && has run_bad_opt "$err" "unknown option '--frob'"
t run_no_prog 2 "$tool" run && has run_no_prog "$err" 'no PROGRAM'
t run_no_prog2 2 "$tool" run --log info -- && has run_no_prog2 "$err" 'no PROGRAM'
t run_missing_value 2 "$tool" run --log && has run_missing_value "$err" "'--log' needs a value"
t bad_level 2 "$tool" run --log loud -- true && { has bad_level "$err" "--log: 'loud' is not a level"; empty bad_level "$out"; }
t bad_engine 2 "$tool" run --engine dpdk -- true && has bad_engine "$err" "--engine: 'dpdk' is not an engine"
t bad_address 2 "$tool" run --address 300.1.1.1 -- true && has bad_address "$err" "--address: '300.1.1.1'"
t bad_address6 2 "$tool" run --address ::1 -- true && has bad_address6 "$err" "--address: '::1'"
t bad_port 2 "$tool" run --udp-port 0 -- true && has bad_port "$err" "--udp-port: '0'"
t bad_config 2 "$tool" run --config "$tmp/nope.conf" -- true && has bad_config "$err" "--config: cannot use '.*nope.conf'"
t bad_lib 1 "$tool" run --lib "$tmp" -- true && has bad_lib "$err" "--lib: no readable libibverbs.so.1 in"
t bad_lib_env 1 env RDMAEMU_LIB="$tmp/none" "$tool" run -- true && has bad_lib_env "$err" "RDMAEMU_LIB: '.*none' does not exist"
t devices_bad_opt 2 "$tool" devices --frob && has devices_bad_opt "$err" "unknown option '--frob'"
t devices_operand 2 "$tool" devices emu0 && has devices_operand "$err" "unexpected argument 'emu0'"
t devices_bad_level 2 "$tool" devices --log=loud && has devices_bad_level "$err" "--log: 'loud'"

# --- run: a missing program is 127, like a shell; not executable is 126
t missing_prog 127 "$tool" run -- no-such-program-xyz && has missing_prog "$err" 'no-such-program-xyz: command not found'
t missing_path 127 "$tool" run -- "$tmp/no/such/prog" && has missing_path "$err" 'no such file'
touch "$tmp/not-exec"
t not_exec 126 "$tool" run -- "$tmp/not-exec" && has not_exec "$err" 'cannot execute'

# --- run: exit status and arguments are the program's own
t status 3 "$tool" run -- sh -c 'exit 3'
t args_passed 0 "$tool" run -- sh -c 'printf "%s|" "$@"' sh --help -x "a b" && has args_passed "$out" '^--help\|-x\|a b\|$'
t no_dashdash 0 "$tool" run echo hello && has no_dashdash "$out" '^hello$'
t signal 143 "$tool" run -- sh -c 'kill -TERM $$'

# --- run: the environment the program gets
want_lib=$(readlink -f "$lib")
cfg="$tmp/dev.conf"
printf 'device emu7\nport\n' >"$cfg"
t env_all 0 env -u RDMAEMU_LOG LD_LIBRARY_PATH=/old/dir "$tool" run --log debug --config "$cfg" \
  --address 127.0.0.9 --udp-port 5000 --engine epoll --lib "$(dirname "$lib")" -- /usr/bin/env
if [[ $? -eq 0 || -s "$out" ]]; then
  has env_all "$out" '^RDMAEMU_LOG=debug$'
  has env_all "$out" "^RDMAEMU_CONFIG=$cfg\$"
  has env_all "$out" '^RDMAEMU_ADDRESS=127\.0\.0\.9$'
  has env_all "$out" '^RDMAEMU_UDP_PORT=5000$'
  has env_all "$out" '^RDMAEMU_ENGINE=epoll$'
  has env_all "$out" "^RDMAEMU_LIB=$(cd "$(dirname "$lib")" && pwd)\$"
  has env_all "$out" '^LD_LIBRARY_PATH=/.*:/old/dir$'
  first=$(sed -n 's/^LD_LIBRARY_PATH=\([^:]*\).*/\1/p' "$out")
  if [[ "$(readlink -f "$first/libibverbs.so.1")" != "$want_lib" ]]; then
    fail "env_all: LD_LIBRARY_PATH starts with '$first', which does not hold the built library ($want_lib)"
  fi
  # librdmacm.so.1 is built beside it (the tool's runfiles carry both), so a
  # program using the CM loads ours too.
  [[ -r "$first/librdmacm.so.1" ]] || fail "env_all: $first holds no librdmacm.so.1"
  # The directory holds our libraries only: nothing else for ld.so to pick up
  # (the checker's interposer is loaded only by name, through LD_PRELOAD).
  others=$(ls "$first" | grep -E '\.so(\.|$)' |
    grep -vx -e 'libibverbs.so.1' -e 'librdmacm.so.1' -e 'librdmaemu_interpose.so')
  [[ -z "$others" ]] || fail "env_all: $first holds other shared objects: $others"
  hasnt env_all "$out" '^LD_PRELOAD=.*librdmaemu_interpose'
fi
# --check preloads the interposer from beside the library, after what
# LD_PRELOAD held (AddressSanitizer's runtime must stay first).
t env_check 0 env LD_PRELOAD=/old/pre.so "$tool" run --check --lib "$(dirname "$lib")" -- /usr/bin/env
has env_check "$out" "^LD_PRELOAD=/old/pre.so:$(cd "$(dirname "$lib")" && pwd -P)/librdmaemu_interpose.so\$"
has env_check "$out" '^RDMAEMU_CHECK=warn$'
t env_check_off 0 "$tool" run --check=off --lib "$(dirname "$lib")" -- /usr/bin/env
hasnt env_check_off "$out" '^LD_PRELOAD='

# A relative --config becomes absolute, so the program may change directory.
(cd "$tmp" && "$tool" run --config dev.conf -- /usr/bin/env) >"$tmp/rel.out" 2>&1
has rel_config "$tmp/rel.out" "^RDMAEMU_CONFIG=$cfg\$"
# Options not given leave inherited variables alone.
t env_inherit 0 env RDMAEMU_LOG=trace "$tool" run -- /usr/bin/env && has env_inherit "$out" '^RDMAEMU_LOG=trace$'
t no_ld_path 0 env -u LD_LIBRARY_PATH "$tool" run -- /usr/bin/env && has no_ld_path "$out" '^LD_LIBRARY_PATH=/[^:]*$'

# --- --lib: a directory or the file itself
libdir=$(dirname "$want_lib")
t lib_dir 0 "$tool" run --lib "$libdir" -- /usr/bin/env && has lib_dir "$out" "^LD_LIBRARY_PATH=$libdir(:|\$)"
t lib_file 0 "$tool" run --lib "$want_lib" -- /usr/bin/env && has lib_file "$out" "^LD_LIBRARY_PATH=$libdir(:|\$)"
t lib_env 0 env RDMAEMU_LIB="$libdir" "$tool" run -- /usr/bin/env && has lib_env "$out" "^LD_LIBRARY_PATH=$libdir(:|\$)"

# --- found through the real path too (bazel-bin/tools/rdmaemu -> bazel-bin/verbs)
real_tool=$(readlink -f "$tool")
t real_path 0 env -u RUNFILES_DIR -u RUNFILES_MANIFEST_FILE "$real_tool" run -- /usr/bin/env
[[ $? -ne 0 ]] || {
  first=$(sed -n 's/^LD_LIBRARY_PATH=\([^:]*\).*/\1/p' "$out")
  [[ "$(readlink -f "$first/libibverbs.so.1")" == "$want_lib" ]] || fail "real_path: found '$first', not the built library"
}

# --- the control commands: processes found through their sockets
# A socket directory of our own, so other tests' processes are not seen.
export RDMAEMU_CONTROL_DIR="$tmp/ctl"
sockdir="$RDMAEMU_CONTROL_DIR"
none_dirs="$sockdir"
t pid_bad 2 "$tool" port --pid abc emu0 1 down && has pid_bad "$err" "--pid: 'abc' is not a process id"
t pid_missing 2 "$tool" list --pid && has pid_missing "$err" "'--pid' needs a value"
t pid_none 1 "$tool" list --pid 999999999 && has pid_none "$err" "no rdmaemu process with pid 999999999 \(looked in $none_dirs\)"
# A stale socket (its process is gone) is removed and not counted.
mkdir -p -m 0700 "$sockdir"
sh -c 'exit 0' & dead=$!; wait $dead
python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1])' "$sockdir/$dead.sock" 2>/dev/null ||
  touch "$sockdir/$dead.sock"
t pid_stale 1 "$tool" list --pid "$dead" && has pid_stale "$err" "no rdmaemu process with pid $dead"
[[ -e "$sockdir/$dead.sock" ]] && fail "pid_stale: the stale socket $sockdir/$dead.sock was not removed"
checks=$((checks + 1))

# A running program: ibv_asyncwatch opens emu0 and waits.
if command -v ibv_asyncwatch >/dev/null && command -v stdbuf >/dev/null; then
  "$tool" run -- stdbuf -oL ibv_asyncwatch >"$tmp/aw.out" 2>"$tmp/aw.err" &
  aw=$!
  for _ in $(seq 100); do [[ -S "$sockdir/$aw.sock" ]] && break; sleep 0.1; done
  checks=$((checks + 1))
  [[ -S "$sockdir/$aw.sock" ]] || fail "live: no socket $sockdir/$aw.sock after 10 s"
  t live_list 0 "$tool" list && { has live_list "$out" "^process $aw ibv_asyncwatch\$"; has live_list "$out" '^emu0 port 1 ACTIVE$'; empty live_list "$err"; }
  t live_list_pid 0 "$tool" list --pid "$aw" && has live_list_pid "$out" "^process $aw "
  t live_down 0 "$tool" port emu0 1 down && has live_down "$out" '^emu0 port 1: DOWN \(was ACTIVE\)$'
  t live_again 0 "$tool" port --pid="$aw" emu0 1 down && has live_again "$out" '^emu0 port 1: already DOWN$'
  t live_listed_down 0 "$tool" list && has live_listed_down "$out" '^emu0 port 1 DOWN$'
  t live_up 0 "$tool" port emu0 1 up --pid "$aw" && has live_up "$out" '^emu0 port 1: ACTIVE \(was DOWN\)$'
  t live_event 0 "$tool" event IBV_EVENT_LID_CHANGE --port emu0 1 && has live_event "$out" '^emu0 port 1: raised IBV_EVENT_LID_CHANGE$'
  # Errors the process finds: 1 for a failure, 2 for a usage error, with the words named.
  t live_bad_dev 1 "$tool" port emu5 1 down && { has live_bad_dev "$err" '^rdmaemu port: emu5 is not open in this process \(open: emu0\)$'; empty live_bad_dev "$out"; }
  t live_bad_port 1 "$tool" port emu0 9 up && has live_bad_port "$err" "^rdmaemu port: emu0 has no port '9'"
  t live_bad_action 2 "$tool" port emu0 1 sideways && { has live_bad_action "$err" "^rdmaemu port: unknown action 'sideways' \\(actions: down, up, lid, sm_lid, rereg, pkey, speed, width\\)$"; has live_bad_action "$err" "^Try 'rdmaemu port --help'.$"; }
  t live_bad_type 2 "$tool" event frob --qp 1 && has live_bad_type "$err" "'frob' is not an async event type"
  t live_mismatch 2 "$tool" event cq_err --qp 17 && has live_mismatch "$err" 'CQ_ERR is an event of a CQ: give --cq N, not --qp QPN'
  t live_no_qp 1 "$tool" event qp_fatal --qp 17 && has live_no_qp "$err" 'no qp 17 in this process'
  # Two processes: each block is headed by its pid; one failing fails all.
  "$tool" run -- stdbuf -oL ibv_asyncwatch >"$tmp/aw2.out" 2>"$tmp/aw2.err" &
  aw2=$!
  for _ in $(seq 100); do [[ -S "$sockdir/$aw2.sock" ]] && break; sleep 0.1; done
  t two_list 0 "$tool" list && { has two_list "$out" "^pid $aw:\$"; has two_list "$out" "^pid $aw2:\$"; has two_list "$out" "^process $aw2 "; }
  # A capture into one file from two programs would garble it: refused
  # before any starts; with %p each gets its own, relative to the tool's
  # directory.
  t two_capture 2 env -C "$tmp" "$tool" capture start same.pcap &&
    has two_capture "$err" "2 programs are running and would all write '$tmp/same.pcap': give --pid PID, or put %p"
  t two_capture_status 0 "$tool" capture status && has two_capture_status "$out" '^not capturing$'
  t two_capture_p 0 env -C "$tmp" "$tool" capture start "cap-%p.pcap" && {
    has two_capture_p "$out" "^capturing into '$tmp/cap-$aw.pcap'\$"
    has two_capture_p "$out" "^capturing into '$tmp/cap-$aw2.pcap'\$"
  }
  t two_capture_stop 0 "$tool" capture stop && {
    has two_capture_stop "$out" "^capture stopped: 0 packets in '$tmp/cap-$aw.pcap'\$"
    has two_capture_stop "$out" "^capture stopped: 0 packets in '$tmp/cap-$aw2.pcap'\$"
  }
  t two_fail 1 "$tool" port emu3 1 down && { has two_fail "$err" "^rdmaemu pid $aw: port: emu3 is not open"; has two_fail "$err" "^rdmaemu pid $aw2: port: emu3 is not open"; }
  kill -TERM "$aw" "$aw2"
  wait "$aw" "$aw2"
  checks=$((checks + 1))
  [[ -e "$sockdir/$aw.sock" || -e "$sockdir/$aw2.sock" ]] && fail "sockets left after SIGTERM: $(ls "$sockdir")"
  has aw_events "$tmp/aw.out" 'PORT_ERR'
  has aw_events "$tmp/aw.out" 'LID_CHANGE'
else
  fail "ibv_asyncwatch is not installed (run tools/setup)"
fi
t none_running 1 "$tool" port emu0 1 down && has none_running "$err" "^rdmaemu port: no running rdmaemu process found \(looked in $none_dirs\)$"

echo "$checks checks, $failures failures"
[[ $failures -eq 0 ]]
