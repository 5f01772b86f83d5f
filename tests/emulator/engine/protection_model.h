// An independent model of the protection boundary of an RC responder: what
// the IB spec lets a remote request do to registered memory, and what the
// responder answers. It is written from the spec's rules (IBA 9.7.4 and
// 9.7.5 for the responder's checks and duplicates, 10.6 for regions and
// windows, 11.6 for the completion statuses), not from the emulator's code,
// and shares nothing with it: the property test (protection_runner.h) runs
// the same random requests through both and compares every answer and
// every byte.
//
// The model keeps its own image of the memory the test owns. Execute()
// predicts one request's answer and applies its effects to the image and
// to the model's objects: afterwards the real memory must equal the image,
// except in the ranges the prediction calls undefined (the spec leaves a
// failed message's target undefined: those bytes may change, but only
// inside memory the request was granted).
//
// Where the spec leaves the order of two checks open (a request that breaks
// two rules at once), the model takes the order docs/errors.md documents,
// so that a change of it is noticed: the QP's rights, then the atomic's
// alignment, then the key, PD, QP, rights and bounds of the region or
// window, then the payload against the RETH length; for a SEND the receive
// buffer's length before the key to invalidate.
//
// Keys are the device's to choose: the model is told each new key and only
// checks that no two live objects share one.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace rdmaemu::testing::model {

// Access rights, as the IBA numbers them (and libibverbs copies).
inline constexpr uint32_t kLocalWrite = 1u << 0;
inline constexpr uint32_t kRemoteWrite = 1u << 1;
inline constexpr uint32_t kRemoteRead = 1u << 2;
inline constexpr uint32_t kRemoteAtomic = 1u << 3;
inline constexpr uint32_t kMwBind = 1u << 4;
inline constexpr uint32_t kZeroBased = 1u << 5;

// 24-bit PSN arithmetic.
inline uint32_t PsnAdd(uint32_t psn, int64_t n) { return static_cast<uint32_t>(psn + n) & 0xffffff; }
// a - b as a signed distance in the 24-bit circle.
inline int32_t PsnDistance(uint32_t a, uint32_t b) {
  return static_cast<int32_t>(((a - b) & 0xffffff) << 8) >> 8;
}

struct Region {
  uint32_t key = 0;  // lkey == rkey
  int pd = 0;
  uint64_t host = 0;   // address of its first byte in this process
  uint64_t iova = 0;   // the address a peer names that byte by
  uint64_t length = 0;
  uint32_t access = 0;
  int windows = 0;     // windows bound to it
  uint64_t generation = 0;  // bumped by every change (re-registration)
};

struct Window {
  int type = 1;
  int pd = 0;
  uint32_t key = 0;   // the key it answers to (when bound)
  bool bound = false;
  int region = -1;    // while bound
  uint64_t host = 0;  // host address of the byte at `base`
  uint64_t base = 0;  // the first address a peer names (0 if zero-based)
  uint64_t length = 0;
  uint32_t access = 0;
  int qp = -1;        // type 2: the QP it was bound through
  uint64_t generation = 0;  // bumped by every bind and invalidation
};

struct Qp {
  int pd = 0;
  uint32_t access = 0;  // qp_access_flags
  uint32_t mtu = 1024;
  uint32_t epsn = 0;
  bool nak_sent = false;  // a sequence NAK went out for the current gap
  bool error = false;
  // Its one posted receive buffer.
  uint64_t recv_host = 0;
  uint32_t recv_length = 0;
  // The newest READ or atomic, which a duplicate may ask for again.
  struct Last {
    bool valid = false;
    bool atomic = false;
    uint32_t psn = 0;
    uint64_t va = 0;
    uint32_t rkey = 0;
    uint32_t length = 0;
    uint64_t orig = 0;
  } last;
  // A WRITE paused after its first packet (Request::pause_after_first):
  // the object its key named then, as it was.
  struct Partial {
    bool active = false;
    bool window = false;
    int handle = 0;
    uint64_t generation = 0;
    uint64_t host = 0;  // where the next byte goes
  } partial;
};

enum class Op { kWrite, kWriteWithImm, kRead, kCompareSwap, kFetchAdd, kSend, kSendWithInvalidate };
const char* ToString(Op op);

struct Request {
  int qp = 0;
  Op op = Op::kWrite;
  uint32_t psn = 0;
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint32_t length = 0;          // RETH DMA length (WRITE, READ)
  std::vector<uint8_t> data;    // WRITE and SEND payload (a WRITE's may differ from `length`)
  uint64_t compare = 0;         // atomics
  uint64_t swap_add = 0;
  uint32_t invalidate_rkey = 0; // SEND with invalidate
  // A WRITE of several packets whose first packet is sent alone (and
  // acknowledged); Continue() takes the rest, after whatever the test did
  // to the regions and windows in between.
  bool pause_after_first = false;
};

// How many packets a request's message travels in at `mtu` (a READ: its
// responses).
uint32_t PacketCount(const Request& r, uint32_t mtu);

enum class Reply {
  kAck,
  kReadResponse,
  kAtomicAck,
  kNakSequence,
  kNakInvalidRequest,
  kNakRemoteAccess,
  kNothing,
};
const char* ToString(Reply reply);

enum class RecvStatus { kNone, kSuccess, kLocLenErr, kRemInvReqErr };
const char* ToString(RecvStatus status);

struct HostRange {
  uint64_t host = 0;
  uint64_t length = 0;
};

struct Prediction {
  Reply reply = Reply::kNothing;
  uint32_t psn = 0;                // the answer's (first) PSN
  std::vector<uint8_t> read_data;  // kReadResponse: every byte, in order
  uint64_t atomic_orig = 0;        // kAtomicAck
  RecvStatus recv = RecvStatus::kNone;
  uint32_t byte_len = 0;           // a successful receive's
  bool with_invalidate = false;
  bool rdma_with_imm = false;      // the receive is a WRITE with immediate's
  std::vector<HostRange> undefined;
  bool qp_error = false;
  std::string why;                 // the rule that decided
};

class Model {
 public:
  // The memory the test owns, as it is now: every byte of it is checked.
  void AddMemory(uint64_t host, std::vector<uint8_t> bytes);
  // The model's image of `length` bytes at `host` (all inside one piece).
  const uint8_t* Image(uint64_t host, uint64_t length) const;
  uint8_t* MutableImage(uint64_t host, uint64_t length);
  const std::map<uint64_t, std::vector<uint8_t>>& memory() const { return memory_; }

  int AddQp(const Qp& qp);
  Qp& qp(int i) { return qps_[static_cast<size_t>(i)]; }
  const Qp& qp(int i) const { return qps_[static_cast<size_t>(i)]; }
  size_t qp_count() const { return qps_.size(); }
  // The QP was taken through RESET back to RTS with a new expected PSN.
  void Reconnect(int qp, uint32_t epsn);

  // ---- verbs on regions and windows: the errno each should return.
  // ibv_reg_mr / ibv_reg_mr_iova.
  int CheckRegister(int pd, uint64_t host, uint64_t length, uint32_t access) const;
  // Returns the region's handle, or nullopt (with `why`) when `key` is
  // already a live object's.
  std::optional<int> Registered(const Region& region, std::string* why);
  int CheckDeregister(int region) const;
  void Deregistered(int region);
  // ibv_rereg_mr with IBV_REREG_MR_CHANGE_* `change_*`; a new translation
  // answers to its host address (the verb has no iova argument).
  int CheckReregister(int region, uint32_t access) const;
  bool Reregistered(int region, int pd, uint64_t host, uint64_t length, uint32_t access,
                    uint32_t key, std::string* why);
  std::optional<int> Allocated(const Window& window, std::string* why);
  void Deallocated(int window);
  // A bind executed on `qp` (type 1 through ibv_bind_mw, type 2 through a
  // bind WR); true when it succeeds, and then the window answers to
  // new_key. A type 1 bind of length 0 leaves the window bound to nothing.
  bool Bind(int qp, int window, int region, uint64_t va, uint64_t length, uint32_t access,
            uint32_t new_key, std::string* why);
  // IBV_WR_LOCAL_INV of `key` posted on `qp`.
  bool LocalInvalidate(int qp, uint32_t key, std::string* why);

  // ---- a remote request: the answer, and its effects applied.
  Prediction Execute(const Request& request);
  // The packets after the first of a paused WRITE: a message in progress
  // may not touch memory its region or window no longer grants as it did
  // (deregistered, re-registered, invalidated, bound again, deallocated),
  // since after the verb returns the old grant is void: the rest is NAKed
  // remote access error and writes nothing more.
  Prediction Continue(const Request& request);

  const std::map<int, Region>& regions() const { return regions_; }
  const std::map<int, Window>& windows() const { return windows_; }

 private:
  // Where the bytes [va, va+length) a key grants `need` on for `qp` are,
  // or nullopt with why not.
  // `found` (if not null) says which object it was: {is a window, handle}.
  std::optional<uint64_t> Translate(int qp, uint32_t rkey, uint64_t va, uint64_t length,
                                    uint32_t need, std::string* why,
                                    std::pair<bool, int>* found = nullptr) const;
  bool KeyInUse(uint32_t key) const;
  Prediction Fatal(Qp& qp, Reply nak, uint32_t psn, std::string why);

  std::map<uint64_t, std::vector<uint8_t>> memory_;
  std::vector<Qp> qps_;
  std::map<int, Region> regions_;
  std::map<int, Window> windows_;
  int next_handle_ = 1;
};

}  // namespace rdmaemu::testing::model
