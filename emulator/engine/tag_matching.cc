// Tag matching on SRQs (IBV_SRQT_TM), as a ConnectX does it: every SEND
// into a TM SRQ begins with a TMH (rdma-core's <infiniband/tm_types.h>),
// which the responder reads on the message's first packet to decide where
// the message goes (docs/tag-matching.md):
//   NO_TAG  whole, into an ordinary SRQ receive            -> TM_NO_TAG
//   EAGER   matched: what follows the TMH, into the tagged buffer
//                                            -> TM_RECV, MATCH | DATA_VALID
//   RNDV    matched: the RVH after the TMH names the sender's data; the
//           device READs it into the tagged buffer over the same
//           connection, then sends the sender a FIN
//                        -> TM_RECV MATCH, then TM_RECV DATA_VALID
//   else    unexpected: whole (TMH included), into an ordinary receive,
//           counted; matching stops until the software syncs -> TM_RECV
// Nothing new goes on the wire: TMHs ride in SENDs, the data in a READ.
#include <arpa/inet.h>

#include <algorithm>

#include <fmt/format.h>

#include "emulator/base/endian.h"
#include "emulator/base/log.h"
#include "emulator/engine/engine.h"
#include "emulator/engine/internal.h"

namespace rdmaemu::engine {
namespace {

// enum ibv_tmh_op, and the sizes of struct ibv_tmh and struct ibv_rvh.
constexpr uint8_t kTmhNoTag = 0;
constexpr uint8_t kTmhRndv = 1;
constexpr uint8_t kTmhFin = 2;
constexpr uint8_t kTmhEager = 3;
constexpr size_t kTmhSize = 16;
constexpr size_t kRvhSize = 16;

// The sgl `sges` cut to its first `len` bytes (a rendezvous reads only the
// message's length into the tagged buffer).
std::vector<Sge> Prefix(const std::vector<Sge>& sges, uint64_t len) {
  std::vector<Sge> out;
  for (const Sge& s : sges) {
    if (len == 0) break;
    Sge cut = s;
    cut.length = static_cast<uint32_t>(std::min<uint64_t>(s.length, len));
    len -= cut.length;
    out.push_back(cut);
  }
  return out;
}

}  // namespace

objects::Cqe FlushedRndv(const Qp& qp, const SendWqe& read) {
  objects::Cqe c;
  c.wr_id = read.rndv.recv_wr_id;
  c.status = objects::WcStatus::kWrFlushErr;
  c.opcode = objects::WcOpcode::kTmRecv;
  c.qp_num = qp.qpn;
  return c;
}

bool Engine::TakeTmRecv(Qp& qp, const wire::PacketView& packet) {
  using Kind = TmDelivery::Kind;
  std::span<const uint8_t> data = packet.payload();
  const uint32_t psn = packet.psn();
  if (data.size() < kTmhSize) {
    ResponderError(qp, wire::NakCode::kInvalidRequest, psn,
                   fmt::format("a SEND into a tag-matching SRQ begins with a {}-byte TMH, but its "
                               "first packet carries {} bytes",
                               kTmhSize, data.size()));
    return false;
  }
  TmDelivery tm;
  const uint8_t op = data[0];
  tm.app_ctx = LoadBe32(data.data() + 4);
  tm.tag = LoadBe64(data.data() + 8);
  if (op > kTmhEager) {
    ResponderError(qp, wire::NakCode::kInvalidRequest, psn,
                   fmt::format("TMH opcode {} is none of NO_TAG (0), RNDV (1), FIN (2), EAGER (3)", op));
    return false;
  }
  if (op == kTmhRndv) {
    if (data.size() < kTmhSize + kRvhSize) {
      ResponderError(qp, wire::NakCode::kInvalidRequest, psn,
                     fmt::format("a RNDV message carries a TMH and a {}-byte RVH, but its first "
                                 "packet has only {} bytes",
                                 kRvhSize, data.size()));
      return false;
    }
    tm.va = LoadBe64(data.data() + kTmhSize);
    tm.rkey = LoadBe32(data.data() + kTmhSize + 8);
    tm.len = LoadBe32(data.data() + kTmhSize + 12);
  }
  Srq& srq = *qp.srq;
  if (op == kTmhEager || op == kTmhRndv) {
    std::lock_guard lock(srq.mu);
    if (auto match = srq.tags->Match(tm.tag)) {
      tm.kind = op == kTmhEager ? Kind::kEager : Kind::kRndv;
      qp.recv.wr_id = match->recv_wr_id;
      qp.recv.sges = std::move(match->sges);
      qp.recv.length = match->length;
    }
  }
  bool unexpected_now = false;
  if (tm.kind == Kind::kNone) {
    // An ordinary receive: NO_TAG, and every tagged message that found no
    // buffer (or came while matching was suspended), FIN included.
    if (!TakeRecv(qp, &qp.recv)) {
      SendRnrNak(qp, psn);  // nothing changed: the retry decides again
      return false;
    }
    if (op == kTmhNoTag) {
      tm.kind = Kind::kNoTag;
    } else {
      tm.kind = Kind::kUnexpected;
      std::lock_guard lock(srq.mu);
      srq.tags->CountUnexpected();
      unexpected_now = true;
    }
  }
  // The TMH is the device's: a matched message's data starts after it, and
  // a rendezvous message has none (its data is at the sender).
  if (tm.kind == Kind::kEager) tm.skip = kTmhSize;
  if (tm.kind == Kind::kRndv) tm.skip = UINT64_MAX;
  qp.tm = tm;
  if (DebugOn()) {
    Log().debug("{} qp#{}: TMH {} tag {:#x} app_ctx {:#x}: {}{}", device_->name(), qp.qpn, op,
                tm.tag, tm.app_ctx,
                tm.kind == Kind::kEager  ? "matched (eager)"
                : tm.kind == Kind::kRndv ? "matched (rendezvous)"
                : tm.kind == Kind::kNoTag ? "no tag"
                                          : "unexpected",
                tm.kind == Kind::kEager || tm.kind == Kind::kRndv
                    ? fmt::format(", into the buffer of WR {}", qp.recv.wr_id)
                    : "");
  }
  if (unexpected_now) {
    RDMAEMU_LOG_LIMITED(spdlog::level::debug,
                        "{} qp#{}: tag {:#x} is unexpected; matching waits for a sync (IBV_OPS_TM_SYNC)",
                        device_->name(), qp.qpn, tm.tag);
  }
  return true;
}

void Engine::FinishTmRecv(Qp& qp, objects::Cqe& c) {
  using Kind = TmDelivery::Kind;
  const TmDelivery& tm = qp.tm;
  switch (tm.kind) {
    case Kind::kNone:
      return;
    case Kind::kNoTag:
      c.opcode = objects::WcOpcode::kTmNoTag;
      return;
    case Kind::kUnexpected:
      // No tag info, as a ConnectX reports it (test_tag_matching.py reads
      // tag 0): the software finds the tag in the TMH it received.
      c.opcode = objects::WcOpcode::kTmRecv;
      return;
    case Kind::kEager:
      c.opcode = objects::WcOpcode::kTmRecv;
      c.wc_flags |= objects::kWcTmMatch | objects::kWcTmDataValid;
      c.tm_tag = tm.tag;
      c.tm_priv = tm.app_ctx;
      return;
    case Kind::kRndv:
      break;
  }
  c.opcode = objects::WcOpcode::kTmRecv;
  c.wc_flags |= objects::kWcTmMatch;
  c.tm_tag = tm.tag;
  c.tm_priv = tm.app_ctx;
  c.byte_len = 0;
  if (tm.len > qp.recv.length) {
    // More than the tagged buffer holds: the device does not read it; the
    // software does the rendezvous itself (IBV_WC_TM_RNDV_INCOMPLETE).
    RDMAEMU_WARN_LIMITED("{} qp#{}: rendezvous of {} bytes for tag {:#x} exceeds the {}-byte "
                         "buffer of WR {}: left to the software (TM_RNDV_INCOMPLETE)",
                         device_->name(), qp.qpn, tm.len, tm.tag, qp.recv.length, qp.recv.wr_id);
    c.status = objects::WcStatus::kTmRndvIncomplete;
    return;
  }
  SendWqe read;
  read.wr_id = qp.recv.wr_id;
  read.op = SendOp::kRdmaRead;
  read.sges = Prefix(qp.recv.sges, tm.len);
  read.remote_addr = tm.va;
  read.rkey = tm.rkey;
  read.length = tm.len;
  read.device_work = DeviceWork::kRndvRead;
  read.rndv = {qp.recv.wr_id, tm.tag, tm.app_ctx};
  qp.sq.push_back(std::move(read));
  if (DebugOn()) {
    Log().debug("{} qp#{}: rendezvous for tag {:#x}: READ of {} bytes at {:#x} rkey {:#x} queued",
                device_->name(), qp.qpn, tm.tag, tm.len, tm.va, tm.rkey);
  }
}

void Engine::CompleteDeviceWork(Qp& qp, const SendWqe& w, objects::WcStatus status) {
  if (w.device_work == DeviceWork::kRndvFin) {
    if (status != objects::WcStatus::kSuccess) {
      RDMAEMU_WARN_LIMITED("{} qp#{}: the rendezvous FIN for tag {:#x} failed ({})",
                           device_->name(), qp.qpn, w.rndv.tag, WcStatusName(status));
    }
    return;
  }
  objects::Cqe c;
  c.wr_id = w.rndv.recv_wr_id;
  c.status = status;
  c.opcode = objects::WcOpcode::kTmRecv;
  c.qp_num = qp.qpn;
  c.byte_len = static_cast<uint32_t>(w.length);
  // No tag info: the MATCH completion gave it (a ConnectX's data-valid CQE
  // carries none, and test_tag_matching.py reads tag 0 there).
  if (status == objects::WcStatus::kSuccess) c.wc_flags = objects::kWcTmDataValid;
  PushRecvCqe(qp, c);
  if (status != objects::WcStatus::kSuccess || qp.attrs.state == QpState::kErr) return;
  // The sender learns its data was taken: a SEND carrying a TMH with opcode
  // FIN and the message's tag, which consumes one of its receives.
  SendWqe fin;
  fin.op = SendOp::kSend;
  fin.is_inline = true;
  fin.inline_data.assign(kTmhSize, 0);
  fin.inline_data[0] = kTmhFin;
  StoreBe32(fin.inline_data.data() + 4, w.rndv.app_ctx);
  StoreBe64(fin.inline_data.data() + 8, w.rndv.tag);
  fin.length = kTmhSize;
  fin.device_work = DeviceWork::kRndvFin;
  fin.rndv = w.rndv;
  qp.sq.push_back(std::move(fin));
}

}  // namespace rdmaemu::engine
