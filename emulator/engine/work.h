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
  // Local operations: the device executes them when it reaches them in the
  // send queue; no packet leaves.
  kBindMw, kLocalInv,
};

inline bool IsLocalOp(SendOp op) { return op == SendOp::kBindMw || op == SendOp::kLocalInv; }

// Where a UD send goes (the AH, resolved by the provider).
struct UdDestination {
  uint32_t dst_ip = 0;  // network order
  uint32_t remote_qpn = 0;
  uint32_t remote_qkey = 0;
  uint8_t traffic_class = 0;  // the AH's GRH traffic class
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
  UdDestination ud;
  uint64_t length = 0;  // total bytes (SGEs or inline)
};

struct RecvWqe {
  uint64_t wr_id = 0;
  std::vector<Sge> sges;
  uint64_t length = 0;
};

}  // namespace rdmaemu::engine
