// The data path's pieces, timed alone (issue 13, item 6): ICRC in GB/s,
// building and parsing a packet in ns, an MR lookup in ns. Run by
// `tools/bench --micro`; a benchmark, not a test: it checks nothing but
// that each piece still works, and its numbers say where a packet's time
// goes, to compare with the whole (tools/bench's rows).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "emulator/objects/mr.h"
#include "emulator/wire/icrc.h"
#include "emulator/wire/packet.h"

namespace rdmaemu {
namespace {

using Clock = std::chrono::steady_clock;

// Calls `step` in batches until `seconds` have passed; returns ns per call.
template <typename Step>
double NanosPerCall(double seconds, Step step) {
  const auto budget = std::chrono::duration<double>(seconds);
  const Clock::time_point start = Clock::now();
  uint64_t calls = 0;
  Clock::duration spent{};
  do {
    for (int i = 0; i < 1024; ++i) step();
    calls += 1024;
    spent = Clock::now() - start;
  } while (spent < budget);
  return std::chrono::duration<double, std::nano>(spent).count() / static_cast<double>(calls);
}

void Row(const std::string& what, double ns, size_t bytes) {
  if (bytes == 0) {
    fmt::print("{:<44} {:>10.1f} ns\n", what, ns);
  } else {
    fmt::print("{:<44} {:>10.1f} ns {:>8.2f} GB/s\n", what, ns, static_cast<double>(bytes) / ns);
  }
}

int Run(double seconds) {
  volatile uint64_t sink = 0;
  std::vector<uint8_t> data(4096);
  std::mt19937 random(1);
  for (auto& b : data) b = static_cast<uint8_t>(random());

  Row("crc32 of 4096 B (the fastest the CPU has)",
      NanosPerCall(seconds, [&] { sink = sink + wire::Crc32(0, data); }), data.size());
  if (wire::Crc32Vclmul512(0, data)) {
    Row("crc32 of 4096 B (VPCLMULQDQ, 512-bit)",
        NanosPerCall(seconds, [&] { sink = sink + *wire::Crc32Vclmul512(0, data); }), data.size());
  }
  if (wire::Crc32Vclmul(0, data)) {
    Row("crc32 of 4096 B (VPCLMULQDQ, 256-bit)",
        NanosPerCall(seconds, [&] { sink = sink + *wire::Crc32Vclmul(0, data); }), data.size());
  }
  if (wire::Crc32Clmul(0, data)) {
    Row("crc32 of 4096 B (PCLMULQDQ, 128-bit)",
        NanosPerCall(seconds, [&] { sink = sink + *wire::Crc32Clmul(0, data); }), data.size());
  }
  Row("crc32 of 4096 B (table, portable)",
      NanosPerCall(seconds, [&] { sink = sink + wire::Crc32Portable(0, data); }), data.size());

  const wire::IcrcAddressing addr{0x7f000001, 0x7f000002, 4791, 4791};
  std::vector<uint8_t> packet(wire::kMaxPacketBytes);
  wire::PacketFields fields;
  fields.opcode = wire::Opcode::RC_SEND_MIDDLE;
  fields.bth.dest_qpn = 0x11;
  fields.bth.psn = 1000;
  auto built = wire::BuildPacket(fields, std::span<const uint8_t>(data), packet, &addr);
  if (!built.ok()) {
    fmt::print(stderr, "microbench: BuildPacket: {}\n", built.status().message());
    return 1;
  }
  const size_t full = *built;
  Row("build RC_SEND_MIDDLE, 4096 B payload, ICRC", NanosPerCall(seconds, [&] {
        sink = sink + *wire::BuildPacket(fields, std::span<const uint8_t>(data), packet, &addr);
      }), full);
  std::span<const uint8_t> one(data.data(), 1);
  fields.opcode = wire::Opcode::RC_SEND_ONLY;
  Row("build RC_SEND_ONLY, 1 B payload, ICRC", NanosPerCall(seconds, [&] {
        sink = sink + *wire::BuildPacket(fields, one, packet, &addr);
      }), 0);

  fields.opcode = wire::Opcode::RC_SEND_MIDDLE;
  (void)wire::BuildPacket(fields, std::span<const uint8_t>(data), packet, &addr);
  std::span<const uint8_t> wire_bytes(packet.data(), full);
  if (!wire::ParsePacket(wire_bytes).ok() || !wire::CheckIcrc(addr, wire_bytes).ok()) {
    fmt::print(stderr, "microbench: the packet built does not parse or check\n");
    return 1;
  }
  Row("parse a 4096 B packet", NanosPerCall(seconds, [&] {
        sink = sink + wire::ParsePacket(wire_bytes).ok();
      }), 0);
  Row("check the ICRC of a 4096 B packet", NanosPerCall(seconds, [&] {
        sink = sink + wire::CheckIcrc(addr, wire_bytes).ok();
      }), full);

  // An MR table as a busy process has it: 1000 regions.
  objects::MrTable table;
  std::vector<uint8_t> memory(1000 * 4096);
  std::vector<uint32_t> lkeys, rkeys;
  for (int i = 0; i < 1000; ++i) {
    uint8_t* at = memory.data() + static_cast<size_t>(i) * 4096;
    auto mr = table.Register(1, at, 4096, reinterpret_cast<uint64_t>(at),
                             objects::kLocalWrite | objects::kRemoteWrite | objects::kRemoteRead);
    if (!mr.ok()) {
      fmt::print(stderr, "microbench: Register: {}\n", mr.status().message());
      return 1;
    }
    lkeys.push_back((*mr)->lkey);
    rkeys.push_back((*mr)->rkey);
  }
  size_t next = 0;
  Row("MR lookup by lkey (1000 regions)", NanosPerCall(seconds, [&] {
        next = (next * 7 + 13) % lkeys.size();
        sink = sink + table.FindByLkey(lkeys[next])->length;
      }), 0);
  Row("MR lookup by rkey and bounds check", NanosPerCall(seconds, [&] {
        next = (next * 7 + 13) % rkeys.size();
        auto mr = table.FindByRkey(rkeys[next]);
        sink = sink + mr->Contains(mr->iova + 100, 1000);
      }), 0);
  Row("MR access guard (shared lock and unlock)", NanosPerCall(seconds, [&] {
        auto guard = table.AccessGuard();
        sink = sink + 1;
      }), 0);
  return sink == 42 ? 2 : 0;  // never: keeps the work from being optimized away
}

}  // namespace
}  // namespace rdmaemu

int main(int argc, char** argv) {
  double seconds = 0.3;
  if (argc == 3 && std::string_view(argv[1]) == "--seconds") seconds = std::atof(argv[2]);
  if (argc != 1 && !(argc == 3 && seconds > 0)) {
    std::fprintf(stderr, "usage: microbench [--seconds S]   (time per piece, default 0.3)\n");
    return 2;
  }
  return rdmaemu::Run(seconds);
}
