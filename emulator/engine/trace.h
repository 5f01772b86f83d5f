// The engine's debug and trace lines (RDMAEMU_LOG=debug|trace).
//
// debug: one line per work request, completion, state change, async event,
// fault rule decision, retransmission, NAK and dropped packet.
// trace: all of debug, plus one line per packet sent and received.
// Each line names its device and object first, e.g.
//   emu0 qp#17 tx RC_RDMA_WRITE_FIRST psn 123 len 1024 → 127.0.0.2 qp#18
//   emu0 qp#17 WR 5 RDMA_WRITE 4096 bytes, psn 123..126
//   emu0 qp#17 completion WR 5 RDMA_WRITE success, 4096 bytes
//   emu0 qp#17 event COMM_EST
// Callers check the level before formatting (TraceOn/DebugOn), so a quiet
// log costs one comparison per packet. Per-packet lines go through rate
// limits: packets arrive as fast as a peer sends them, and the ACKs we send
// back follow them, so neither direction may write without bound.
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "emulator/base/log.h"
#include "emulator/device/device.h"
#include "emulator/engine/qp.h"
#include "emulator/engine/work.h"
#include "emulator/objects/cq.h"
#include "emulator/wire/packet.h"

namespace rdmaemu::engine {

inline bool TraceOn() { return Log().should_log(spdlog::level::trace); }
inline bool DebugOn() { return Log().should_log(spdlog::level::debug); }

std::string_view SendOpName(SendOp op);
std::string_view QpStateName(QpState state);  // RESET, INIT, RTR, RTS, SQD, SQE, ERR
std::string_view WcOpcodeName(objects::WcOpcode op);
// As ibv_wc_status_str says it ("success", "transport retry counter exceeded", ...).
std::string_view WcStatusName(objects::WcStatus status);
// IBV_EVENT_* without the prefix ("COMM_EST", "QP_FATAL", ...).
std::string_view EventName(device::AsyncEventType type);
// " ACK msn 5", " NAK PSN sequence error", " RNR NAK code 12": what an AETH says.
std::string AethText(uint8_t syndrome, uint32_t msn);

// The per-packet trace lines of one device, at most kLinesPerSecond a second
// in each direction; the first line after a suppressed stretch is preceded
// by one saying how many lines were left out. Callers check TraceOn() first.
class PacketTracer {
 public:
  static constexpr uint32_t kLinesPerSecond = 200;

  explicit PacketTracer(std::string device) : device_(std::move(device)) {}

  // A packet `qpn` (0: none) built and handed on for sending.
  void Sent(uint32_t qpn, const wire::PacketFields& fields, size_t payload_bytes, uint32_t dst_ip);
  // A packet that passed the device's checks and reached `qpn`.
  void Received(uint32_t qpn, const wire::PacketView& packet, const sockaddr_in& from);

 private:
  bool Allow(RateLimit& limit, std::string_view direction);

  const std::string device_;
  RateLimit tx_{kLinesPerSecond};
  RateLimit rx_{kLinesPerSecond};
};

}  // namespace rdmaemu::engine
