# Sourced by the tests that run Debian's rping as a server.
#
# rping_lost_teardown_race STATUS LOG: true when a server that exited with
# STATUS (output, stdout and stderr together, in LOG) lost rping's own
# teardown race, not the emulator's (fixed upstream in rdma-core f3ae6534a,
# "rping: terminate CM event thread before exiting", after Debian 12's
# 44.0): its CM thread acks DISCONNECTED and calls rdma_get_cm_event again
# while main, woken by that ack, goes on to rdma_destroy_event_channel. If
# the thread was already reading, the read of the closed fd is EBADF (as
# from the kernel's channel); if it comes after the destroy, the library
# refuses the destroyed channel (EINVAL, with a line saying so). Either way
# the thread exits 255, after the session's pings had all been checked.
#
# The perror line is looked for anywhere in LOG, not as its last line:
# rping's stdout goes to a file fully buffered and is written at exit,
# after stderr's lines (CI saw "server ping data:" lines follow it).
rping_lost_teardown_race() {
  local status="$1" log="$2"
  [[ "$status" == 255 ]] || return 1
  grep -q "DISCONNECT EVENT" "$log" || return 1
  grep -qx "rdma_get_cm_event: Bad file descriptor" "$log" && return 0
  grep -qx "rdma_get_cm_event: Invalid argument" "$log" &&
    grep -q "rdma_get_cm_event: .* is not an event channel of this process: destroyed already" "$log"
}
