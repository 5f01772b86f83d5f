// Work requests in the device's own format, as the provider posts them.
#pragma once

#include <cstdint>
#include <vector>

#include "emulator/objects/mw.h"

namespace rdmaemu::engine {

struct Sge {
  uint64_t addr = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
};

enum class SendOp : uint8_t {
  kSend, kSendWithImm, kSendWithInv, kRdmaWrite, kRdmaWriteWithImm, kRdmaRead,
  kCompareSwap, kFetchAdd,
  // The Memory Placement Extensions (RC only): 8 bytes written at once
  // (carried inline in the WQE), and a FLUSH of earlier writes.
  kAtomicWrite, kFlush,
  // Local operations: the device executes them when it reaches them in the
  // send queue; no packet leaves.
  kBindMw, kLocalInv,
};

inline bool IsLocalOp(SendOp op) { return op == SendOp::kBindMw || op == SendOp::kLocalInv; }

// One request packet answered by the responder from a responder resource
// (a READ response, an atomic ACK, or for the placement operations a
// zero-length READ response): bounded by max_rd_atomic, waited for by a fence.
inline bool UsesResponderResource(SendOp op) {
  return op == SendOp::kRdmaRead || op == SendOp::kCompareSwap || op == SendOp::kFetchAdd ||
         op == SendOp::kAtomicWrite || op == SendOp::kFlush;
}

// Where a UD send goes (the AH, resolved by the provider).
struct UdDestination {
  uint32_t dst_ip = 0;  // network order
  uint32_t remote_qpn = 0;
  uint32_t remote_qkey = 0;
  uint8_t traffic_class = 0;  // the AH's GRH traffic class
};

// Work a tag-matching receiver's device queues on its own QP for a matched
// rendezvous (docs/tag-matching.md), never posted by the application: the
// READ of the sender's data, then the message that tells the sender it is
// done. Its completions are the receive side's, never the send CQ's.
enum class DeviceWork : uint8_t { kNone, kRndvRead, kRndvFin };

struct RndvContext {
  uint64_t recv_wr_id = 0;  // the matched tag's
  uint64_t tag = 0;         // the message's TMH tag
  uint32_t app_ctx = 0;     // and app_ctx
};

struct SendWqe {
  uint64_t wr_id = 0;
  SendOp op = SendOp::kSend;
  bool signaled = false;
  bool solicited = false;
  bool fence = false;
  bool is_inline = false;
  uint32_t imm_data = 0;  // network order, as the application wrote it
  uint32_t invalidate_rkey = 0;  // SEND with invalidate, LOCAL_INV
  objects::BindRequest bind;     // kBindMw (qp_pd and qpn are the engine's to fill)
  std::vector<Sge> sges;
  std::vector<uint8_t> inline_data;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint64_t compare_add = 0;
  uint64_t swap = 0;
  uint8_t flush_type = 0;   // kFlush: IBV_FLUSH_GLOBAL | IBV_FLUSH_PERSISTENT
  uint8_t flush_level = 0;  // kFlush: IBV_FLUSH_RANGE or IBV_FLUSH_MR
  UdDestination ud;
  uint32_t xrc_remote_srqn = 0;  // XRC_SEND: the XRC SRQ at the target (XRCETH)
  uint64_t length = 0;  // total bytes (SGEs or inline)
  DeviceWork device_work = DeviceWork::kNone;
  RndvContext rndv;  // kRndvRead
};

struct RecvWqe {
  uint64_t wr_id = 0;
  std::vector<Sge> sges;
  uint64_t length = 0;
};

}  // namespace rdmaemu::engine
