#include "emulator/engine/trace.h"

#include <array>

#include <fmt/format.h>

#include "emulator/net/udp_socket.h"

namespace rdmaemu::engine {

std::string_view SendOpName(SendOp op) {
  switch (op) {
    case SendOp::kSend: return "SEND";
    case SendOp::kSendWithImm: return "SEND_WITH_IMM";
    case SendOp::kSendWithInv: return "SEND_WITH_INV";
    case SendOp::kRdmaWrite: return "RDMA_WRITE";
    case SendOp::kRdmaWriteWithImm: return "RDMA_WRITE_WITH_IMM";
    case SendOp::kRdmaRead: return "RDMA_READ";
    case SendOp::kCompareSwap: return "ATOMIC_CMP_AND_SWP";
    case SendOp::kFetchAdd: return "ATOMIC_FETCH_AND_ADD";
    case SendOp::kAtomicWrite: return "ATOMIC_WRITE";
    case SendOp::kFlush: return "FLUSH";
    case SendOp::kBindMw: return "BIND_MW";
    case SendOp::kLocalInv: return "LOCAL_INV";
  }
  return "?";
}

std::string_view QpStateName(QpState state) {
  static constexpr std::array<std::string_view, 7> kNames = {"RESET", "INIT", "RTR", "RTS",
                                                             "SQD",   "SQE",  "ERR"};
  const auto i = static_cast<size_t>(state);
  return i < kNames.size() ? kNames[i] : "?";
}

std::string_view WcOpcodeName(objects::WcOpcode op) {
  using O = objects::WcOpcode;
  switch (op) {
    case O::kSend: return "SEND";
    case O::kRdmaWrite: return "RDMA_WRITE";
    case O::kRdmaRead: return "RDMA_READ";
    case O::kCompSwap: return "COMP_SWAP";
    case O::kFetchAdd: return "FETCH_ADD";
    case O::kBindMw: return "BIND_MW";
    case O::kLocalInv: return "LOCAL_INV";
    case O::kTso: return "TSO";
    case O::kFlush: return "FLUSH";
    case O::kAtomicWrite: return "ATOMIC_WRITE";
    case O::kRecv: return "RECV";
    case O::kRecvRdmaWithImm: return "RECV_RDMA_WITH_IMM";
    case O::kTmAdd: return "TM_ADD";
    case O::kTmDel: return "TM_DEL";
    case O::kTmSync: return "TM_SYNC";
    case O::kTmRecv: return "TM_RECV";
    case O::kTmNoTag: return "TM_NO_TAG";
  }
  return "?";
}

std::string_view WcStatusName(objects::WcStatus status) {
  // Indexed by enum ibv_wc_status, worded as ibv_wc_status_str.
  static constexpr std::array<std::string_view, 24> kNames = {
      "success", "local length error", "local QP operation error", "local EE context operation error",
      "local protection error", "Work Request Flushed Error", "memory management operation error",
      "bad response error", "local access error", "remote invalid request error",
      "remote access error", "remote operation error", "transport retry counter exceeded",
      "RNR retry counter exceeded", "local RDD violation error", "remote invalid RD request",
      "aborted error", "invalid EE context number", "invalid EE context state",
      "fatal error", "response timeout error", "general error",
      "TM error", "TM software rendezvous"};
  const auto i = static_cast<size_t>(status);
  return i < kNames.size() ? kNames[i] : "unknown";
}

std::string_view EventName(device::AsyncEventType type) {
  // Indexed by enum ibv_event_type.
  static constexpr std::array<std::string_view, 21> kNames = {
      "CQ_ERR", "QP_FATAL", "QP_REQ_ERR", "QP_ACCESS_ERR", "COMM_EST", "SQ_DRAINED",
      "PATH_MIG", "PATH_MIG_ERR", "DEVICE_FATAL", "PORT_ACTIVE", "PORT_ERR", "LID_CHANGE",
      "PKEY_CHANGE", "SM_CHANGE", "SRQ_ERR", "SRQ_LIMIT_REACHED", "QP_LAST_WQE_REACHED",
      "CLIENT_REREGISTER", "GID_CHANGE", "WQ_FATAL", "DEVICE_SPEED_CHANGE"};
  const auto i = static_cast<size_t>(type);
  return i < kNames.size() ? kNames[i] : "unknown";
}

std::string AethText(uint8_t syndrome, uint32_t msn) {
  const wire::AethType type = wire::SyndromeType(syndrome);
  const uint8_t value = wire::SyndromeValue(syndrome);
  if (type == wire::AethType::kAck) return fmt::format(" ACK msn {}", msn);
  if (type == wire::AethType::kNak) {
    return fmt::format(" NAK {}", wire::ToString(static_cast<wire::NakCode>(value)));
  }
  return fmt::format(" {} code {}", wire::ToString(type), value);
}

bool PacketTracer::Allow(RateLimit& limit, std::string_view direction) {
  uint64_t suppressed = 0;
  if (!limit.Allow(&suppressed)) return false;
  if (suppressed > 0) {
    Log().trace("{}: {} {} packet lines suppressed (more than {} a second)", device_, suppressed,
                direction, kLinesPerSecond);
  }
  return true;
}

void PacketTracer::Sent(uint32_t qpn, const wire::PacketFields& fields, size_t payload_bytes,
                        uint32_t dst_ip) {
  if (!Allow(tx_, "tx")) return;
  const wire::OpcodeInfo& info = wire::InfoOf(fields.opcode);
  Log().trace("{} qp#{} tx {} psn {} len {}{} → {} qp#{}", device_, qpn, info.name, fields.bth.psn,
              payload_bytes,
              info.Has(wire::kAethMask) ? AethText(fields.aeth.syndrome, fields.aeth.msn) : "",
              net::ToString(in_addr{dst_ip}), fields.bth.dest_qpn);
}

void PacketTracer::Received(uint32_t qpn, const wire::PacketView& packet, const sockaddr_in& from) {
  if (!Allow(rx_, "rx")) return;
  Log().trace("{} qp#{} rx {} psn {} len {}{} ← {}", device_, qpn, packet.info().name,
              packet.psn(), packet.payload().size(),
              packet.Has(wire::kAethMask) ? AethText(packet.aeth().syndrome(), packet.aeth().msn())
                                          : "",
              net::ToString(from));
}

}  // namespace rdmaemu::engine
