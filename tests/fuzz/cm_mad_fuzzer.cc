// Fuzz target: the connection manager's MADs, what arrives on QP1 from any
// peer. Each input runs against a fresh cm::Manager (its own, not the
// process's) on one device, as the engine hands it MADs: TCP listeners on
// ports 7174 and 7471 and a UDP listener on 7471 (rping's, ucmatose's and
// udaddy's defaults, so captured REQs and SIDR_REQs find them), an RC id
// that has sent a REQ and a UD id that has sent a SIDR_REQ. Every MAD also
// goes through the pure
// decoders (CheckMad, DescribeMad, DecodeHead and the message's Decode*),
// and every MAD the manager sends must pass CheckMad itself.
//
// Input: records of  ctl(1) MAD(256)  (a short last record is a short MAD).
// Bits of ctl, so that captured MADs and their mutations meet this run's
// connections (whose comm IDs are random) rather than the captured run's:
//   0x01 answer the manager: the message's Remote Comm ID (REP, REJ, MRA,
//        RTU, DREQ, DREP) becomes the last Local Comm ID the manager sent,
//        the TID that of the last MAD it sent, a SIDR_REP's Request ID its
//        SIDR_REQ's, a DREQ's QPN its ids' QPN; a REQ's or SIDR_REQ's
//        destination IP becomes ours
//   0x02 then act as the program on the events it caused: accept a
//        CONNECT_REQUEST, establish a CONNECT_RESPONSE, disconnect an
//        ESTABLISHED or DISCONNECTED id
//   0x04 ... reject the CONNECT_REQUEST instead of accepting it
//   0x08 from an address that is not the peer's
//
// Memory: each input's Manager starts (and joins) its timer thread, and
// AddressSanitizer keeps about 190 bytes for every thread ever started (a
// bare create/join loop under clang-14's ASan grows the same), so this
// target's RSS grows by that much per input: about 400 MB in ten minutes.
// The Manager does not seem to keep anything: with ASan's quarantine off
// this target grows about 200 bytes an input, the parsers not at all.
// Runs much past half an hour need RDMAEMU_FUZZ_RSS_MB above 2048.
#include <arpa/inet.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "emulator/base/endian.h"
#include "emulator/cm/mad.h"
#include "emulator/cm/manager.h"
#include "emulator/cm/messages.h"
#include "emulator/cm/uapi.h"

namespace {

using namespace rdmaemu::cm;

const uint32_t kOurIp = htonl(0x7f000002);   // 127.0.0.2
const uint32_t kPeerIp = htonl(0x7f000003);  // 127.0.0.3
const uint32_t kOtherIp = htonl(0x7f000009);
constexpr uint16_t kPort = 7471;       // ucmatose's and udaddy's
constexpr uint16_t kRpingPort = 7174;
constexpr uint32_t kQpn = 0x42;  // the QP of every id here

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "cm_mad_fuzzer: %s\n", what);
  std::abort();
}

// What the manager said, for the input's next MADs and the program's moves.
// Delivery happens under the manager's lock: record only, act afterwards.
struct Record {
  std::vector<rdmaemu_cm_event> events;
  uint32_t last_comm_id = 0;  // the Local Comm ID of the last MAD sent that has one
  uint64_t last_tid = 0;
  uint32_t sidr_request_id = 0;
};
Record* record = nullptr;
std::mutex record_mu;

uint64_t Deliver(const rdmaemu_cm_event* e) {
  std::lock_guard lock(record_mu);
  record->events.push_back(*e);
  // A child's handle: nonzero, so the library "accepts" the new id.
  return e->event == RDMAEMU_CM_EVENT_CONNECT_REQUEST ? 1000 + record->events.size() : e->handle;
}

class FakeWire : public Wire {
 public:
  void SendMad(uint8_t, uint32_t, uint8_t, uint8_t, std::span<const uint8_t> mad) override {
    auto kind = CheckMad(mad);
    if (!kind.ok()) Fail("the manager sent a MAD CheckMad refuses");
    const std::span<const uint8_t> m = MessageBytes(mad);
    std::lock_guard lock(record_mu);
    record->last_tid = ConstMadHeaderView(mad.first(kMadHeaderBytes)).transaction_id();
    switch (*kind) {
      case AttributeId::kSidrReq:
        record->sidr_request_id = ConstSidrReqView(m).request_id();
        break;
      case AttributeId::kSidrRep:
      case AttributeId::kLap:
      case AttributeId::kApr:
        break;
      default:
        // Every other CM message starts with the sender's Local Comm ID.
        record->last_comm_id = rdmaemu::LoadBe32(m.data());
        break;
    }
  }
  void Flush(std::chrono::steady_clock::time_point) override {}
};

sockaddr_in Addr(uint32_t ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = ip;
  a.sin_port = htons(port);
  return a;
}

rdmaemu_cm_param Param(uint8_t qp_type) {
  rdmaemu_cm_param p{};
  p.qp_num = kQpn;
  p.qkey = 0x01234567;
  p.starting_psn = 0x123456;
  p.qp_type = qp_type;
  p.retry_count = 7;
  p.rnr_retry_count = 7;
  p.path_mtu = 5;
  p.local_ack_timeout = 10;
  p.responder_resources = 1;
  p.initiator_depth = 1;
  p.private_data_len = 4;
  return p;
}

void Check(const rdmaemu::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "cm_mad_fuzzer: setup: %s: %s\n", what, s.message().c_str());
    std::abort();
  }
}

// Pure decoding: must never crash, whatever the bytes.
void Decode(std::span<const uint8_t> mad) {
  (void)DescribeMad(mad);
  auto head = DecodeHead(mad);
  auto kind = CheckMad(mad);
  if (head.ok() != kind.ok()) Fail("DecodeHead and CheckMad disagree");
  if (!head.ok()) return;
  switch (head->kind) {
    case Kind::kReq: (void)DecodeReq(mad); break;
    case Kind::kRep: (void)DecodeRep(mad); break;
    case Kind::kRtu:
    case Kind::kDrep: (void)DecodeCommIds(mad); break;
    case Kind::kDreq: (void)DecodeDreq(mad); break;
    case Kind::kRej: (void)DecodeRej(mad); break;
    case Kind::kMra: (void)DecodeMra(mad); break;
    case Kind::kSidrReq: (void)DecodeSidrReq(mad); break;
    case Kind::kSidrRep: (void)DecodeSidrRep(mad); break;
    case Kind::kLap:
    case Kind::kApr: break;
  }
}

// The rewrites of ctl 0x01 on a MAD CheckMad accepts.
void Aim(std::span<uint8_t> mad) {
  auto kind = CheckMad(mad);
  if (!kind.ok()) return;
  std::span<uint8_t> m = MessageBytes(mad);
  std::lock_guard lock(record_mu);
  switch (*kind) {
    case AttributeId::kReq:
      CmaHeaderView(m.subspan(ReqView::kPrivateDataOffset)).set_dst_ipv4(ntohl(kOurIp));
      return;
    case AttributeId::kSidrReq:
      CmaHeaderView(m.subspan(SidrReqView::kPrivateDataOffset)).set_dst_ipv4(ntohl(kOurIp));
      return;
    case AttributeId::kSidrRep:
      SidrRepView(m).set_request_id(record->sidr_request_id);
      break;
    case AttributeId::kLap:
    case AttributeId::kApr:
      return;
    case AttributeId::kDreq:
      // The receiver checks the QPN a DREQ names: every id here has kQpn.
      DreqView(m).set_remote_qpn_eecn(kQpn);
      [[fallthrough]];
    default:
      // Remote Comm ID is bytes 4-7 of every other message.
      rdmaemu::StoreBe32(m.data() + 4, record->last_comm_id);
      break;
  }
  MadHeaderView(mad.first(kMadHeaderBytes)).set_transaction_id(record->last_tid);
}

// What a program does on the events of the last MAD.
void Act(Manager& manager, uint8_t ctl) {
  std::vector<rdmaemu_cm_event> events;
  {
    std::lock_guard lock(record_mu);
    events.swap(record->events);
  }
  for (const rdmaemu_cm_event& e : events) {
    switch (e.event) {
      case RDMAEMU_CM_EVENT_CONNECT_REQUEST:
        if (ctl & 0x04) {
          (void)manager.Reject(e.child, 28, {});
        } else {
          rdmaemu_cm_param p = Param(e.param.qp_type);
          (void)manager.Accept(e.child, p);
        }
        break;
      case RDMAEMU_CM_EVENT_CONNECT_RESPONSE:
        (void)manager.Establish(e.id);
        break;
      case RDMAEMU_CM_EVENT_ESTABLISHED:
      case RDMAEMU_CM_EVENT_DISCONNECTED:
        (void)manager.Disconnect(e.id);
        break;
      default:
        break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Record rec;
  {
    std::lock_guard lock(record_mu);
    record = &rec;
  }
  FakeWire wire;
  {
    // Slow timers (the defaults): nothing is retried while an input runs.
    Manager manager;
    Check(manager.Init(RDMAEMU_CM_ABI_VERSION, Deliver), "init");
    manager.AttachDevice(0, 0x1111, {{kOurIp, 5}}, &wire);
    for (auto [ps, port] : {std::pair<uint16_t, uint16_t>{RDMAEMU_CM_PS_TCP, kRpingPort},
                            std::pair<uint16_t, uint16_t>{RDMAEMU_CM_PS_TCP, kPort},
                            std::pair<uint16_t, uint16_t>{RDMAEMU_CM_PS_UDP, kPort}}) {
      auto id = manager.CreateId(ps + port, ps);
      Check(id.status(), "create listener");
      sockaddr_in a = Addr(kOurIp, port);
      Check(manager.Bind(*id, 0, 1, &a), "bind listener");
      Check(manager.Listen(*id, 0), "listen");
    }
    for (auto [ps, qp_type] : {std::pair{RDMAEMU_CM_PS_TCP, RDMAEMU_CM_QPT_RC},
                               std::pair{RDMAEMU_CM_PS_UDP, RDMAEMU_CM_QPT_UD}}) {
      auto id = manager.CreateId(10 + ps, ps);
      Check(id.status(), "create active id");
      sockaddr_in a = Addr(kOurIp, 0);
      Check(manager.Bind(*id, 0, 1, &a), "bind active id");
      Check(manager.Connect(*id, Addr(kPeerIp, kPort + 1), Param(qp_type)), "connect");
    }
    while (size > 0) {
      const uint8_t ctl = data[0];
      const size_t len = std::min(size - 1, kMadBytes);
      std::vector<uint8_t> mad(data + 1, data + 1 + len);
      data += 1 + len;
      size -= 1 + len;
      Decode(mad);
      if (ctl & 0x01) Aim(mad);
      manager.OnMad(0, 1, (ctl & 0x08) ? kOtherIp : kPeerIp, mad);
      if (ctl & 0x02) Act(manager, ctl);
    }
  }
  std::lock_guard lock(record_mu);
  record = nullptr;
  return 0;
}
