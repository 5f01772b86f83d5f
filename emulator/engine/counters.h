// Counters: what the engine counts, per port and per QP, from one list.
//
// RDMAEMU_COUNTERS is the only place a counter is named: the atomic set the
// data path bumps, the plain snapshot readers get, the C API's struct fields
// (verbs/include/rdmaemu/rdmaemu.h, checked against this list at compile
// time) and the names `rdmaemu stats` prints all come from it. To add one,
// add a line here and the same field at the end of struct rdmaemu_counters.
//
// Bytes are whole RoCEv2 packets as they cross the socket (BTH to ICRC).
// A QP counts what reached it or left it; a port counts everything that
// crossed its socket, including packets no QP accepted; a device is the sum
// of its ports.
//
// The fault_ counters are what fault rules and link shaping did
// (docs/faults.md), counted on the packet's port and on its local QP: the
// sender of a packet sent, the destination of a packet received (when that
// is a QP of this device). A packet dropped on sending still counts in its
// QP's packets_sent (it was built) but not in the port's (it never crossed
// the socket); one dropped on receipt counts in the port's packets_received
// but never reaches its QP's.
//
// Thread safety: Counters are relaxed atomics, bumped on the engine thread
// and read from any thread; a snapshot is not a transaction.
#pragma once

#include <atomic>
#include <cstdint>

// X(name, description)
#define RDMAEMU_COUNTERS(X)                                                                   \
  X(packets_sent, "RoCEv2 packets sent")                                                      \
  X(bytes_sent, "bytes sent (BTH to ICRC)")                                                   \
  X(packets_received, "RoCEv2 packets received")                                              \
  X(bytes_received, "bytes received (BTH to ICRC)")                                           \
  X(retransmissions, "request packets sent again (timeouts, sequence NAKs, RNR NAKs)")        \
  X(timeouts, "transport timer expiries")                                                     \
  X(rnr_naks_sent, "RNR NAKs sent: a SEND found no receive WQE")                              \
  X(rnr_naks_received, "RNR NAKs received")                                                   \
  X(out_of_sequence, "requests or read responses with a PSN past the expected one")           \
  X(duplicates, "duplicate requests (PSN already executed)")                                  \
  X(dropped_malformed, "received packets dropped: not a RoCEv2 packet this device speaks")    \
  X(dropped_icrc, "received packets dropped: ICRC mismatch")                                  \
  X(dropped_pkey, "received packets dropped: P_Key violation")                                \
  X(dropped_qkey, "received UD packets dropped: Q_Key violation")                             \
  X(rkey_violations, "requests refused: rkey, bounds or access rights (NAK remote access)")  \
  X(dropped_unknown_qpn, "received packets dropped: no such destination QP")                  \
  X(dropped_bad_state, "received packets dropped: wrong QP state, transport or source")       \
  X(dropped_no_receive, "UD/UC messages dropped: no receive WQE")                             \
  X(dropped_port_down, "packets dropped: the port is down")                                 \
  X(dropped_device_dead, "packets dropped: the device had a fatal error")                    \
  X(dropped_no_route, "packets dropped: their DLID belongs to no port of the subnet")        \
  X(fault_dropped, "packets dropped by a fault rule (drop)")                                  \
  X(fault_duplicated, "extra copies of packets made by a fault rule (dup)")                   \
  X(fault_corrupted, "packets corrupted by a fault rule (corrupt)")                           \
  X(fault_delayed, "packets held back by a fault rule (delay)")                               \
  X(fault_reordered, "packets held back by a fault rule until later ones passed (reorder)")  \
  X(fault_forced, "RNR NAKs, NAKs and QP errors forced by a fault rule (rnr, nak, error)")    \
  X(fault_shaped, "packets that waited for a shaped link (rate, latency)")                    \
  X(fault_overflows, "packets dropped: a fault or shaping hold queue was full")               \
  X(dropped_no_flow, "raw Ethernet frames dropped: no flow rule of the port matched")

namespace rdmaemu::engine {

// A snapshot.
struct CounterValues {
#define RDMAEMU_FIELD(name, text) uint64_t name = 0;
  RDMAEMU_COUNTERS(RDMAEMU_FIELD)
#undef RDMAEMU_FIELD

  CounterValues& operator+=(const CounterValues& o) {
#define RDMAEMU_ADD(name, text) name += o.name;
    RDMAEMU_COUNTERS(RDMAEMU_ADD)
#undef RDMAEMU_ADD
    return *this;
  }
};

// The live set.
struct Counters {
#define RDMAEMU_FIELD(name, text) std::atomic<uint64_t> name{0};
  RDMAEMU_COUNTERS(RDMAEMU_FIELD)
#undef RDMAEMU_FIELD

  CounterValues Snapshot() const {
    CounterValues v;
#define RDMAEMU_LOAD(name, text) v.name = name.load(std::memory_order_relaxed);
    RDMAEMU_COUNTERS(RDMAEMU_LOAD)
#undef RDMAEMU_LOAD
    return v;
  }
};

// Calls f(name, description, value) for each counter, in list order.
template <typename F>
void ForEachCounter(const CounterValues& v, F&& f) {
#define RDMAEMU_EACH(name, text) f(#name, text, v.name);
  RDMAEMU_COUNTERS(RDMAEMU_EACH)
#undef RDMAEMU_EACH
}

}  // namespace rdmaemu::engine
