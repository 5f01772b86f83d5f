#include "tests/emulator/engine/protection_model.h"

#include <algorithm>
#include <cassert>
#include <cstring>

#include <fmt/format.h>

namespace rdmaemu::testing::model {
namespace {

// [va, va+length) inside [base, base+size), without overflow.
bool Inside(uint64_t va, uint64_t length, uint64_t base, uint64_t size) {
  if (va < base) return false;
  const uint64_t offset = va - base;
  return offset <= size && length <= size - offset;
}

// The man page of ibv_reg_mr: remote write and remote atomic rights need
// local write.
bool ValidRegionAccess(uint32_t access) {
  return !(access & (kRemoteWrite | kRemoteAtomic)) || (access & kLocalWrite);
}

const char* RightName(uint32_t need) {
  return need == kRemoteWrite ? "REMOTE_WRITE" : need == kRemoteRead ? "REMOTE_READ" : "REMOTE_ATOMIC";
}

}  // namespace

const char* ToString(Op op) {
  switch (op) {
    case Op::kWrite: return "WRITE";
    case Op::kWriteWithImm: return "WRITE_IMM";
    case Op::kRead: return "READ";
    case Op::kCompareSwap: return "CMP_SWP";
    case Op::kFetchAdd: return "FETCH_ADD";
    case Op::kSend: return "SEND";
    case Op::kSendWithInvalidate: return "SEND_INV";
  }
  return "?";
}

const char* ToString(Reply reply) {
  switch (reply) {
    case Reply::kAck: return "ACK";
    case Reply::kReadResponse: return "READ_RESPONSE";
    case Reply::kAtomicAck: return "ATOMIC_ACK";
    case Reply::kNakSequence: return "NAK_PSN_SEQUENCE";
    case Reply::kNakInvalidRequest: return "NAK_INVALID_REQUEST";
    case Reply::kNakRemoteAccess: return "NAK_REMOTE_ACCESS";
    case Reply::kNothing: return "NOTHING";
  }
  return "?";
}

const char* ToString(RecvStatus status) {
  switch (status) {
    case RecvStatus::kNone: return "none";
    case RecvStatus::kSuccess: return "SUCCESS";
    case RecvStatus::kLocLenErr: return "LOC_LEN_ERR";
    case RecvStatus::kRemInvReqErr: return "REM_INV_REQ_ERR";
  }
  return "?";
}

uint32_t PacketCount(const Request& r, uint32_t mtu) {
  const uint64_t bytes = r.op == Op::kRead ? r.length : r.data.size();
  if (r.op == Op::kCompareSwap || r.op == Op::kFetchAdd || bytes == 0) return 1;
  return static_cast<uint32_t>((bytes + mtu - 1) / mtu);
}

// ---------------------------------------------------------------- memory

void Model::AddMemory(uint64_t host, std::vector<uint8_t> bytes) {
  memory_[host] = std::move(bytes);
}

uint8_t* Model::MutableImage(uint64_t host, uint64_t length) {
  auto it = memory_.upper_bound(host);
  assert(it != memory_.begin());
  --it;
  assert(host >= it->first && host - it->first + length <= it->second.size());
  (void)length;
  return it->second.data() + (host - it->first);
}

const uint8_t* Model::Image(uint64_t host, uint64_t length) const {
  return const_cast<Model*>(this)->MutableImage(host, length);
}

// ---------------------------------------------------------------- objects

int Model::AddQp(const Qp& qp) {
  qps_.push_back(qp);
  return static_cast<int>(qps_.size()) - 1;
}

void Model::Reconnect(int i, uint32_t epsn) {
  Qp& q = qps_[static_cast<size_t>(i)];
  q.epsn = epsn;
  q.nak_sent = false;
  q.error = false;
  q.last = {};
  q.partial = {};
}

bool Model::KeyInUse(uint32_t key) const {
  for (const auto& [h, r] : regions_) {
    if (r.key == key) return true;
  }
  for (const auto& [h, w] : windows_) {
    if (w.key == key) return true;
  }
  return false;
}

int Model::CheckRegister(int /*pd*/, uint64_t host, uint64_t length, uint32_t access) const {
  if (!ValidRegionAccess(access)) return EINVAL;
  // The kernel pins the pages a region touches; zero bytes at a page
  // boundary touch none and are refused (docs/errors.md).
  if (length == 0 && host % 4096 == 0) return EINVAL;
  return 0;
}

std::optional<int> Model::Registered(const Region& region, std::string* why) {
  if (KeyInUse(region.key)) {
    *why = fmt::format("the new region's key {:#x} is a live object's already", region.key);
    return std::nullopt;
  }
  const int h = next_handle_++;
  regions_[h] = region;
  regions_[h].windows = 0;
  return h;
}

int Model::CheckDeregister(int region) const {
  // A region with bound windows stays (IBA 10.6.7: windows must go first).
  return regions_.at(region).windows > 0 ? EBUSY : 0;
}

void Model::Deregistered(int region) { regions_.erase(region); }

int Model::CheckReregister(int region, uint32_t access) const {
  if (regions_.at(region).windows > 0) return EBUSY;
  if (!ValidRegionAccess(access)) return EINVAL;
  return 0;
}

bool Model::Reregistered(int region, int pd, uint64_t host, uint64_t length, uint32_t access,
                         uint32_t key, std::string* why) {
  Region& r = regions_.at(region);
  if (key != r.key && KeyInUse(key)) {
    *why = fmt::format("the re-registered region's key {:#x} is a live object's already", key);
    return false;
  }
  if (host != r.host || length != r.length) r.iova = host;
  r.pd = pd;
  r.host = host;
  r.length = length;
  r.access = access;
  r.key = key;
  ++r.generation;
  return true;
}

std::optional<int> Model::Allocated(const Window& window, std::string* why) {
  if (KeyInUse(window.key)) {
    *why = fmt::format("the new window's key {:#x} is a live object's already", window.key);
    return std::nullopt;
  }
  const int h = next_handle_++;
  windows_[h] = window;
  windows_[h].bound = false;
  return h;
}

void Model::Deallocated(int window) {
  Window& w = windows_.at(window);
  if (w.bound && w.region >= 0) --regions_.at(w.region).windows;
  windows_.erase(window);
}

bool Model::Bind(int qp, int window, int region, uint64_t va, uint64_t length, uint32_t access,
                 uint32_t new_key, std::string* why) {
  Qp& q = qps_[static_cast<size_t>(qp)];
  Window& w = windows_.at(window);
  auto fail = [&](std::string reason) {
    *why = std::move(reason);
    q.error = true;  // a bind that fails completes in error and the QP goes to ERR
    return false;
  };
  if (q.pd != w.pd) return fail("the QP is of another PD than the window");
  if ((new_key & ~0xffu) != (w.key & ~0xffu)) return fail("the new key names another window");
  const bool type2 = w.type == 2;
  if (type2 && w.bound) return fail("a type 2 window is bound already (invalidate it first)");
  if (type2 && length == 0) return fail("a type 2 window binds a non-empty range");
  const Region* r = nullptr;
  if (region >= 0) {
    auto it = regions_.find(region);
    if (it == regions_.end()) return fail("the region is gone");
    r = &it->second;
    if (r->pd != w.pd) return fail("the region is of another PD than the window");
    if (!(r->access & kMwBind)) return fail("the region has no MW_BIND right");
    if ((access & (kRemoteWrite | kRemoteAtomic)) && !(r->access & kLocalWrite)) {
      return fail("remote write or atomic through a window needs LOCAL_WRITE on its region");
    }
    if (!Inside(va, length, r->iova, r->length)) return fail("the range is outside the region");
  } else if (type2) {
    return fail("a type 2 bind names a region");
  }
  if (w.bound && w.region >= 0) --regions_.at(w.region).windows;
  ++w.generation;
  w.key = new_key;
  w.bound = r != nullptr;
  w.region = r != nullptr ? region : -1;
  if (r != nullptr) {
    ++regions_.at(region).windows;
    w.host = r->host + (va - r->iova);
    w.base = (access & kZeroBased) ? 0 : va;
    w.length = length;
    w.access = access & (kRemoteWrite | kRemoteRead | kRemoteAtomic);
    w.qp = type2 ? qp : -1;
  }
  return true;
}

bool Model::LocalInvalidate(int qp, uint32_t key, std::string* why) {
  Qp& q = qps_[static_cast<size_t>(qp)];
  for (auto& [h, w] : windows_) {
    if (w.key != key) continue;
    if (w.type != 2) {
      *why = "type 1 windows are not invalidated";
    } else if (!w.bound) {
      *why = "the window is not bound";
    } else if (w.pd != q.pd) {
      *why = "the window is of another PD than the QP";
    } else {
      --regions_.at(w.region).windows;
      w.bound = false;
      w.region = -1;
      ++w.generation;
      return true;
    }
    q.error = true;
    return false;
  }
  *why = "no window answers to the key (a region's cannot be invalidated)";
  q.error = true;
  return false;
}

// ---------------------------------------------------------------- requests

std::optional<uint64_t> Model::Translate(int qp, uint32_t rkey, uint64_t va, uint64_t length,
                                         uint32_t need, std::string* why,
                                         std::pair<bool, int>* found) const {
  const Qp& q = qps_[static_cast<size_t>(qp)];
  for (const auto& [h, r] : regions_) {
    if (r.key != rkey) continue;
    if (r.pd != q.pd) {
      *why = "the region is of another PD than the QP";
    } else if (!(r.access & need)) {
      *why = fmt::format("the region does not grant {}", RightName(need));
    } else if (!Inside(va, length, r.iova, r.length)) {
      *why = fmt::format("[{:#x}, +{}) is outside the region [{:#x}, +{})", va, length, r.iova,
                         r.length);
    } else {
      if (found != nullptr) *found = {false, h};
      return r.host + (va - r.iova);
    }
    return std::nullopt;
  }
  for (const auto& [h, w] : windows_) {
    if (w.key != rkey || !w.bound) continue;
    if (w.pd != q.pd) {
      *why = "the window is of another PD than the QP";
    } else if (w.type == 2 && w.qp != qp) {
      *why = "the type 2 window was bound through another QP";
    } else if (!(w.access & need)) {
      *why = fmt::format("the window does not grant {}", RightName(need));
    } else if (!Inside(va, length, w.base, w.length)) {
      *why = fmt::format("[{:#x}, +{}) is outside the window [{:#x}, +{})", va, length, w.base,
                         w.length);
    } else {
      if (found != nullptr) *found = {true, h};
      return w.host + (va - w.base);
    }
    return std::nullopt;
  }
  *why = fmt::format("no region or bound window answers to rkey {:#x}", rkey);
  return std::nullopt;
}

Prediction Model::Fatal(Qp& q, Reply nak, uint32_t psn, std::string why) {
  // Invalid requests and access violations are fatal to an RC QP: NAKed,
  // and the QP goes to ERR (IBA 9.9.2, class C errors).
  q.error = true;
  Prediction p;
  p.reply = nak;
  p.psn = psn;
  p.qp_error = true;
  p.why = std::move(why);
  return p;
}

Prediction Model::Execute(const Request& r) {
  Qp& q = qps_[static_cast<size_t>(r.qp)];
  assert(!q.error);
  Prediction p;
  const uint32_t packets = PacketCount(r, q.mtu);
  const int32_t distance = PsnDistance(r.psn, q.epsn);

  if (distance > 0) {
    // A gap: one sequence NAK for the PSN expected, then silence until the
    // gap closes (IBA 9.7.5.1.2, class B). Nothing executes.
    p.psn = q.epsn;
    if (q.nak_sent) {
      p.reply = Reply::kNothing;
      p.why = "ahead of the expected PSN, the gap already NAKed";
    } else {
      q.nak_sent = true;
      p.reply = Reply::kNakSequence;
      p.why = "ahead of the expected PSN";
    }
    return p;
  }
  if (distance < 0) {
    // A duplicate (IBA 9.7.5.1.3): SENDs and WRITEs are not executed again,
    // only acknowledged, with the last PSN executed; a READ is executed
    // again, and so checked again against the memory's current rights; an
    // atomic returns its first result without touching memory again.
    if (r.op == Op::kRead) {
      if (!q.last.valid || q.last.atomic || q.last.psn != r.psn || q.last.va != r.va ||
          q.last.rkey != r.rkey || q.last.length != r.length) {
        p.reply = Reply::kNothing;
        p.why = "a duplicate READ the model does not keep (not generated)";
        return p;
      }
      if (r.length > 0) {
        std::string why;
        auto host = Translate(r.qp, r.rkey, r.va, r.length, kRemoteRead, &why);
        if (!host) return Fatal(q, Reply::kNakRemoteAccess, r.psn, "duplicate READ: " + why);
        const uint8_t* src = Image(*host, r.length);
        p.read_data.assign(src, src + r.length);
      }
      p.reply = Reply::kReadResponse;
      p.psn = r.psn;
      p.why = "duplicate READ, read again";
      return p;
    }
    if (r.op == Op::kCompareSwap || r.op == Op::kFetchAdd) {
      if (!q.last.valid || !q.last.atomic || q.last.psn != r.psn) {
        p.reply = Reply::kNothing;
        p.why = "a duplicate atomic the model does not keep (not generated)";
        return p;
      }
      p.reply = Reply::kAtomicAck;
      p.psn = r.psn;
      p.atomic_orig = q.last.orig;
      p.why = "duplicate atomic, first result replayed";
      return p;
    }
    p.reply = Reply::kAck;
    p.psn = PsnAdd(q.epsn, -1);
    p.why = "duplicate, acknowledged again";
    return p;
  }
  q.nak_sent = false;

  switch (r.op) {
    case Op::kWrite:
    case Op::kWriteWithImm: {
      if (!(q.access & kRemoteWrite)) {
        return Fatal(q, Reply::kNakInvalidRequest, r.psn, "the QP does not allow remote writes");
      }
      uint64_t host = 0;
      std::pair<bool, int> found{false, -1};
      if (r.length > 0) {
        // A zero-length WRITE carries no key to check (IBA C9-88).
        std::string why;
        auto at = Translate(r.qp, r.rkey, r.va, r.length, kRemoteWrite, &why, &found);
        if (!at) return Fatal(q, Reply::kNakRemoteAccess, r.psn, "WRITE: " + why);
        host = *at;
      }
      if (r.pause_after_first) {
        // Only a WRITE of several packets that carries its length exactly.
        assert(packets > 1 && r.data.size() == r.length);
        std::memcpy(MutableImage(host, q.mtu), r.data.data(), q.mtu);
        q.partial.active = true;
        q.partial.window = found.first;
        q.partial.handle = found.second;
        q.partial.generation = found.first ? windows_.at(found.second).generation
                                           : regions_.at(found.second).generation;
        q.partial.host = host + q.mtu;
        q.epsn = PsnAdd(r.psn, 1);
        p.reply = Reply::kAck;
        p.psn = r.psn;
        p.why = "the first packet of a WRITE, acknowledged";
        return p;
      }
      uint64_t left = r.length;
      for (uint32_t i = 0; i < packets; ++i) {
        const uint64_t size = std::min<uint64_t>(q.mtu, r.data.size() - uint64_t{i} * q.mtu);
        const bool last = i + 1 == packets;
        if (size > left || (last && size != left)) {
          p = Fatal(q, Reply::kNakInvalidRequest, PsnAdd(r.psn, i),
                    fmt::format("the WRITE's payload ({} bytes) does not match its length {}",
                                r.data.size(), r.length));
          // The packets before landed inside the granted range, or did not:
          // a failed message's target is undefined.
          if (r.length > 0) p.undefined.push_back({host, r.length});
          return p;
        }
        left -= size;
      }
      if (!r.data.empty()) std::memcpy(MutableImage(host, r.data.size()), r.data.data(), r.data.size());
      q.epsn = PsnAdd(r.psn, packets);
      p.reply = Reply::kAck;
      p.psn = PsnAdd(r.psn, packets - 1);
      p.why = r.length == 0 ? "zero-length WRITE" : "WRITE granted";
      if (r.op == Op::kWriteWithImm) {
        // Its immediate takes a receive (and only a WRITE that is carried
        // out does: a refused one leaves the receive posted).
        p.recv = RecvStatus::kSuccess;
        p.rdma_with_imm = true;
        p.byte_len = r.length;
      }
      return p;
    }
    case Op::kRead: {
      if (!(q.access & kRemoteRead)) {
        return Fatal(q, Reply::kNakInvalidRequest, r.psn, "the QP does not allow remote reads");
      }
      if (r.length > 0) {
        std::string why;
        auto host = Translate(r.qp, r.rkey, r.va, r.length, kRemoteRead, &why);
        if (!host) return Fatal(q, Reply::kNakRemoteAccess, r.psn, "READ: " + why);
        const uint8_t* src = Image(*host, r.length);
        p.read_data.assign(src, src + r.length);
      }
      q.epsn = PsnAdd(r.psn, packets);
      q.last = {true, false, r.psn, r.va, r.rkey, r.length, 0};
      p.reply = Reply::kReadResponse;
      p.psn = r.psn;
      p.why = r.length == 0 ? "zero-length READ" : "READ granted";
      return p;
    }
    case Op::kCompareSwap:
    case Op::kFetchAdd: {
      if (!(q.access & kRemoteAtomic)) {
        return Fatal(q, Reply::kNakInvalidRequest, r.psn, "the QP does not allow remote atomics");
      }
      if (r.va % 8 != 0) {
        return Fatal(q, Reply::kNakInvalidRequest, r.psn, "the atomic's address is not 8-byte aligned");
      }
      std::string why;
      auto host = Translate(r.qp, r.rkey, r.va, 8, kRemoteAtomic, &why);
      if (!host) return Fatal(q, Reply::kNakRemoteAccess, r.psn, "atomic: " + why);
      uint8_t* target = MutableImage(*host, 8);
      uint64_t orig;
      std::memcpy(&orig, target, 8);  // the responder's own byte order
      uint64_t now = orig;
      if (r.op == Op::kCompareSwap) {
        if (orig == r.compare) now = r.swap_add;
      } else {
        now = orig + r.swap_add;
      }
      std::memcpy(target, &now, 8);
      q.epsn = PsnAdd(r.psn, 1);
      q.last = {true, true, r.psn, r.va, r.rkey, 8, orig};
      p.reply = Reply::kAtomicAck;
      p.psn = r.psn;
      p.atomic_orig = orig;
      p.why = "atomic granted";
      return p;
    }
    case Op::kSend:
    case Op::kSendWithInvalidate: {
      const HostRange buffer{q.recv_host, q.recv_length};
      uint64_t offset = 0;
      for (uint32_t i = 0; i < packets; ++i) {
        const uint64_t size = std::min<uint64_t>(q.mtu, r.data.size() - uint64_t{i} * q.mtu);
        if (offset + size > q.recv_length) {
          p = Fatal(q, Reply::kNakInvalidRequest, PsnAdd(r.psn, i),
                    "the message is longer than the receive buffer");
          p.recv = RecvStatus::kLocLenErr;
          p.undefined.push_back(buffer);
          return p;
        }
        offset += size;
      }
      const uint32_t last_psn = PsnAdd(r.psn, packets - 1);
      if (r.op == Op::kSendWithInvalidate) {
        // Only a type 2 window of the QP's PD, bound through this QP, can
        // be invalidated by the peer; a region of ibv_reg_mr never.
        Window* target = nullptr;
        for (auto& [h, w] : windows_) {
          if (w.key == r.invalidate_rkey && w.bound && w.type == 2 && w.pd == q.pd && w.qp == r.qp) {
            target = &w;
          }
        }
        if (target == nullptr) {
          p = Fatal(q, Reply::kNakInvalidRequest, last_psn,
                    fmt::format("nothing this QP may invalidate answers to {:#x}", r.invalidate_rkey));
          p.recv = RecvStatus::kRemInvReqErr;
          p.undefined.push_back(buffer);
          return p;
        }
        --regions_.at(target->region).windows;
        target->bound = false;
        target->region = -1;
        ++target->generation;
        p.with_invalidate = true;
      }
      if (!r.data.empty()) std::memcpy(MutableImage(q.recv_host, r.data.size()), r.data.data(), r.data.size());
      q.epsn = PsnAdd(r.psn, packets);
      p.reply = Reply::kAck;
      p.psn = last_psn;
      p.recv = RecvStatus::kSuccess;
      p.byte_len = static_cast<uint32_t>(r.data.size());
      p.why = r.op == Op::kSend ? "SEND delivered" : "SEND delivered, window invalidated";
      return p;
    }
  }
  return p;
}

Prediction Model::Continue(const Request& r) {
  Qp& q = qps_[static_cast<size_t>(r.qp)];
  assert(q.partial.active && !q.error);
  const Qp::Partial partial = q.partial;
  q.partial = {};
  const uint32_t packets = PacketCount(r, q.mtu);
  bool same = false;
  if (partial.window) {
    auto it = windows_.find(partial.handle);
    same = it != windows_.end() && it->second.generation == partial.generation;
  } else {
    auto it = regions_.find(partial.handle);
    same = it != regions_.end() && it->second.generation == partial.generation;
  }
  if (!same) {
    return Fatal(q, Reply::kNakRemoteAccess, PsnAdd(r.psn, 1),
                 fmt::format("the {} of the WRITE in progress changed after its first packet",
                             partial.window ? "window" : "region"));
  }
  const size_t rest = r.data.size() - q.mtu;
  std::memcpy(MutableImage(partial.host, rest), r.data.data() + q.mtu, rest);
  q.epsn = PsnAdd(r.psn, packets);
  Prediction p;
  p.reply = Reply::kAck;
  p.psn = PsnAdd(r.psn, packets - 1);
  p.why = "the rest of the WRITE, its grant unchanged";
  return p;
}

}  // namespace rdmaemu::testing::model
