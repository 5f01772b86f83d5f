// Many RC QPs at once (issue 13, item 5): `qps` RC QPs in one process
// connected one to one to `qps` in a second (forked) process, each its own
// emulated host; every QP carries a verified message each way per round;
// then `cycles` create/connect/send/destroy cycles of a QP pair. Memory is
// read from /proc/self/statm at each step, so growth per QP and growth
// under traffic show. Used by tools/bench --scale (10,000 QPs, 100,000
// cycles) and by tests/integration:scale_test (1,000 QPs).
#pragma once

#include <cstdint>
#include <string>

namespace rdmaemu::bench {

struct ScaleOptions {
  int qps = 1000;
  int rounds = 3;
  int cycles = 1000;
  uint32_t message_bytes = 64;
  int stall_seconds = 60;  // no completion for this long is a failure
};

// Resident memory of one process, KiB, at each step; and the bytes its
// heap has in use (mallinfo2), which page-touching and the allocator's
// trimming do not blur: the measure of a leak.
struct ScaleRss {
  long start = 0;      // device open, PD, CQs and MR made; no QP
  long connected = 0;  // every QP in RTS with a receive posted
  long round1 = 0;     // after the first round of traffic
  long mid = 0;        // after half the rounds
  long end = 0;        // after the last round
  long heap_mid = 0;   // KiB of heap in use after half the rounds
  long heap_end = 0;   // ... and after the last
};

struct ScaleResult {
  std::string error;  // empty when everything worked
  int qps = 0;
  int rounds = 0;
  uint64_t verified = 0;  // messages received and checked, both processes
  double connect_seconds = 0;  // creating and connecting this process's QPs
  double traffic_seconds = 0;  // every round, measured by the first process
  ScaleRss first;   // the process that sends first
  ScaleRss second;  // the forked one
  int cycles = 0;
  double cycle_seconds = 0;
  long cycles_rss_early = 0;  // KiB after a tenth of the cycles
  long cycles_rss_end = 0;    // KiB after the last
};

ScaleResult RunScale(const ScaleOptions& options);

// A table of the result, for people.
std::string Describe(const ScaleResult& result);

}  // namespace rdmaemu::bench
