// Fuzz target: the engine's receive path, what any process that can send UDP
// to the device's port reaches. One device is opened once, through the
// public verbs API as a program would, with an RC, a UC, a UD and an XRC
// target QP in RTS (the connected ones connected to a peer address nobody
// else uses, the UD one attached to a multicast group, the XRC target with
// an XRC SRQ in its domain) and three registered regions (every remote
// right, REMOTE_READ only, none). Before each input every QP is
// reset and brought back to RTS with the same PSNs, receives are posted,
// and the RC QP has posted a READ, an atomic, a SEND and a WRITE, so
// responses and ACKs find requests to answer. Then the input's datagrams go
// through Engine::InjectForTest on this thread, exactly as the engine's
// socket would deliver them, and the completions and async events they
// caused are drained.
//
// Input: records of  ctl(1) length(2, little-endian) bytes(length)  (a
// short last record takes what is left). `bytes` is the UDP payload, BTH to
// ICRC. Bits of `ctl` let a seed taken from a real capture, or a mutation of
// it, land on this process's QPs and regions rather than on numbers that
// only meant something in the captured run:
//   0x01 recompute the ICRC for the addresses it is delivered with
//   0x02 send it to this target's QP of the opcode's transport (RC, UC, UD,
//        XRC with the XRC SRQ's number in its XRCETH; raw frames and QP1
//        keep theirs)
//   0x04 the PSN is an offset from the QP's expected PSN (its rq_psn for a
//        request, sq_psn for a response)
//   0x08 a RETH's, AtomicETH's or IETH's R_Key picks one of the regions
//        (R_Key % 3) and its VA is an offset into it (signed 16 bits, so
//        the bytes just before and after a region are aimed at too)
//   0x10 from an address that is not the connected peer's
//   0x20 to the UD QP's multicast group rather than the device's address
// Without 0x01 the ICRC stays as given: mostly a bad one, the first check.
#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <spdlog/sinks/null_sink.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "emulator/base/endian.h"
#include "emulator/base/log.h"
#include "emulator/engine/engine.h"
#include "emulator/net/loop.h"
#include "emulator/wire/headers.h"
#include "emulator/wire/icrc.h"
#include "emulator/wire/opcode.h"
#include "emulator/wire/packet.h"

namespace {

using namespace rdmaemu;

constexpr uint32_t kPeerQpn = 0xabcd;
constexpr uint32_t kRqPsn = 0x100;   // what the QPs expect from the peer
constexpr uint32_t kSqPsn = 0x500;   // what the RC QP sends from
constexpr uint32_t kUdQkey = 0x11111111;  // ibv_ud_pingpong's, so its captures match
constexpr size_t kRegionBytes = 16384;

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "receive_fuzzer: setup failed: %s (errno %d)\n", what, errno);
  std::abort();
}

struct Region {
  std::unique_ptr<uint8_t[]> bytes;
  ibv_mr* mr = nullptr;
  uint64_t addr() const { return reinterpret_cast<uintptr_t>(bytes.get()); }
};

class Target {
 public:
  Target() {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (list == nullptr || n < 1) Die("no device");
    ctx_ = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    if (ctx_ == nullptr) Die("ibv_open_device");
    ibv_gid gid;
    if (ibv_query_gid(ctx_, 1, 0, &gid) != 0) Die("ibv_query_gid");
    std::memcpy(&emu_ip_, gid.raw + 12, 4);  // network order
    // A peer address of this process alone (outside the device's auto
    // range), as the engine tests' fake peer picks one.
    peer_ip_ = htonl((127u << 24) | (80u << 16) | (static_cast<uint32_t>(getpid()) & 0xffff));
    stranger_ip_ = htonl(ntohl(peer_ip_) ^ 0x8000);
    group_ip_ = htonl((239u << 24) | (77u << 16) | (static_cast<uint32_t>(getpid()) & 0xffff));
    if (fcntl(ctx_->async_fd, F_SETFL, fcntl(ctx_->async_fd, F_GETFL) | O_NONBLOCK) != 0) {
      Die("async fd");
    }
    pd_ = ibv_alloc_pd(ctx_);
    cq_ = ibv_create_cq(ctx_, 1024, nullptr, nullptr, 0);
    if (pd_ == nullptr || cq_ == nullptr) Die("pd/cq");
    const int all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                    IBV_ACCESS_REMOTE_ATOMIC;
    for (int access : {all, int{IBV_ACCESS_REMOTE_READ}, int{IBV_ACCESS_LOCAL_WRITE}}) {
      Region r;
      r.bytes = std::make_unique<uint8_t[]>(kRegionBytes);
      r.mr = ibv_reg_mr(pd_, r.bytes.get(), kRegionBytes, access);
      if (r.mr == nullptr) Die("ibv_reg_mr");
      regions_.push_back(std::move(r));
    }
    rc_ = CreateQp(IBV_QPT_RC);
    uc_ = CreateQp(IBV_QPT_UC);
    ud_ = CreateQp(IBV_QPT_UD);
    CreateXrc();
    ibv_gid mgid{};
    mgid.raw[10] = mgid.raw[11] = 0xff;
    std::memcpy(mgid.raw + 12, &group_ip_, 4);
    if (ibv_attach_mcast(ud_, &mgid, 0) != 0) Die("ibv_attach_mcast");
    auto engine = engine::AcquireEngine(0);
    if (!engine.ok()) Die("AcquireEngine");
    engine_ = *engine;
    // Every log line is formatted (a bad format argument is a crash too) at
    // the most verbose level, per-packet trace included, and thrown away:
    // printing them would be most of the run's time. With RDMAEMU_LOG set
    // the log is left as it asks, to see what an input did.
    if (std::getenv("RDMAEMU_LOG") == nullptr) {
      Log().sinks().clear();
      Log().sinks().push_back(std::make_shared<spdlog::sinks::null_sink_mt>());
      Log().set_level(spdlog::level::trace);
    }
  }

  void Run(const uint8_t* data, size_t size) {
    Reset();
    std::vector<std::vector<uint8_t>> packets;
    std::vector<net::Datagram> batch;
    while (size > 0) {
      const uint8_t ctl = data[0];
      size_t len = size >= 3 ? LoadLe16(data + 1) : 0;
      const size_t header = size >= 3 ? 3 : size;
      data += header;
      size -= header;
      if (len > size) len = size;
      packets.emplace_back(data, data + len);
      data += len;
      size -= len;
      batch.push_back(Prepare(ctl, packets.back()));
    }
    // One datagram per call: the engine's batches are as small as one, and
    // the work round after each (OnWork) is where timers and sends happen.
    for (const net::Datagram& d : batch) engine_->InjectForTest(std::span<const net::Datagram>(&d, 1));
    Drain();
  }

 private:
  static uint16_t LoadLe16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

  ibv_qp* CreateQp(ibv_qp_type type) {
    ibv_qp_init_attr attr{};
    attr.send_cq = cq_;
    attr.recv_cq = cq_;
    attr.qp_type = type;
    attr.cap.max_send_wr = 16;
    attr.cap.max_recv_wr = 16;
    attr.cap.max_send_sge = 2;
    attr.cap.max_recv_sge = 2;
    attr.cap.max_inline_data = 64;
    ibv_qp* qp = ibv_create_qp(pd_, &attr);
    if (qp == nullptr) Die("ibv_create_qp");
    return qp;
  }

  void CreateXrc() {
    ibv_xrcd_init_attr x{};
    x.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    x.fd = -1;
    xrcd_ = ibv_open_xrcd(ctx_, &x);
    if (xrcd_ == nullptr) Die("ibv_open_xrcd");
    ibv_srq_init_attr_ex s{};
    s.attr.max_wr = 16;
    s.attr.max_sge = 2;
    s.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ |
                  IBV_SRQ_INIT_ATTR_PD;
    s.srq_type = IBV_SRQT_XRC;
    s.xrcd = xrcd_;
    s.cq = cq_;
    s.pd = pd_;
    xsrq_ = ibv_create_srq_ex(ctx_, &s);
    if (xsrq_ == nullptr || ibv_get_srq_num(xsrq_, &xsrq_num_) != 0) Die("XRC SRQ");
    ibv_qp_init_attr_ex q{};
    q.qp_type = IBV_QPT_XRC_RECV;
    q.comp_mask = IBV_QP_INIT_ATTR_XRCD;
    q.xrcd = xrcd_;
    xrc_ = ibv_create_qp_ex(ctx_, &q);
    if (xrc_ == nullptr) Die("XRC target QP");
  }

  void Modify(ibv_qp* qp, ibv_qp_attr& a, int mask) {
    if (ibv_modify_qp(qp, &a, mask) != 0) Die("ibv_modify_qp");
  }

  // RESET -> RTS with the same attributes each time, so every input starts
  // from the same state whatever the previous one did (ERR included).
  void Connect(ibv_qp* qp, ibv_qp_type type) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RESET;
    Modify(qp, a, IBV_QP_STATE);
    a = {};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.pkey_index = 0;
    if (type == IBV_QPT_UD) {
      a.qkey = kUdQkey;
      Modify(qp, a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
    } else {
      a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                          (type != IBV_QPT_UC ? IBV_ACCESS_REMOTE_ATOMIC : 0);
      Modify(qp, a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    }
    a = {};
    a.qp_state = IBV_QPS_RTR;
    int mask = IBV_QP_STATE;
    if (type != IBV_QPT_UD) {
      a.path_mtu = IBV_MTU_1024;
      a.dest_qp_num = kPeerQpn;
      a.rq_psn = kRqPsn;
      a.ah_attr.is_global = 1;
      a.ah_attr.port_num = 1;
      a.ah_attr.grh.hop_limit = 64;
      a.ah_attr.grh.dgid.raw[10] = a.ah_attr.grh.dgid.raw[11] = 0xff;
      std::memcpy(a.ah_attr.grh.dgid.raw + 12, &peer_ip_, 4);
      mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
      if (type != IBV_QPT_UC) {  // RC and the XRC target answer READs and atomics
        a.max_dest_rd_atomic = 4;
        a.min_rnr_timer = 1;
        mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
      }
    }
    Modify(qp, a, mask);
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = kSqPsn;
    mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
    if (type == IBV_QPT_RC) {
      // No transport timer: nothing is resent behind the input's back.
      a.timeout = 0;
      a.retry_cnt = 1;
      a.rnr_retry = 1;
      a.max_rd_atomic = 4;
      mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    } else if (type == IBV_QPT_XRC_RECV) {
      a.timeout = 0;
      mask |= IBV_QP_TIMEOUT;
    }
    Modify(qp, a, mask);
  }

  void PostRecvs(ibv_qp* qp, int n) {
    const Region& r = regions_[0];
    for (int i = 0; i < n; ++i) {
      // Two SGEs, the second short, so a message can overflow or straddle.
      ibv_sge sge[2] = {{r.addr() + 4096u * static_cast<unsigned>(i & 1), 2048, r.mr->lkey},
                        {r.addr() + 12288, 64, r.mr->lkey}};
      ibv_recv_wr wr{};
      wr.wr_id = static_cast<uint64_t>(i);
      wr.sg_list = sge;
      wr.num_sge = 2;
      ibv_recv_wr* bad = nullptr;
      if (ibv_post_recv(qp, &wr, &bad) != 0) Die("ibv_post_recv");
    }
  }

  // The XRC SRQ outlives the resets: topped up, never past its size.
  void PostXrcRecvs(int n) {
    const Region& r = regions_[0];
    for (int i = 0; i < n; ++i) {
      ibv_sge sge{r.addr() + 4096, 1024, r.mr->lkey};
      ibv_recv_wr wr{};
      wr.wr_id = 200 + static_cast<uint64_t>(i);
      wr.sg_list = &sge;
      wr.num_sge = 1;
      ibv_recv_wr* bad = nullptr;
      if (ibv_post_srq_recv(xsrq_, &wr, &bad) != 0) return;  // full
    }
  }

  void PostRcRequests() {
    const Region& r = regions_[0];
    ibv_sge sge{r.addr() + 8192, 64, r.mr->lkey};
    ibv_sge atomic_sge{r.addr() + 8192 + 64, 8, r.mr->lkey};
    ibv_send_wr wr[4]{};
    wr[0].opcode = IBV_WR_RDMA_READ;
    wr[0].sg_list = &sge;
    wr[0].wr.rdma = {0x10000, 0x1234};
    wr[1].opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
    wr[1].sg_list = &atomic_sge;
    wr[1].wr.atomic = {0x20000, 1, 0, 0x1234};
    wr[2].opcode = IBV_WR_SEND;
    wr[2].sg_list = &sge;
    wr[3].opcode = IBV_WR_RDMA_WRITE;
    wr[3].sg_list = &sge;
    wr[3].wr.rdma = {0x30000, 0x1234};
    for (int i = 0; i < 4; ++i) {
      wr[i].wr_id = 100 + static_cast<uint64_t>(i);
      wr[i].num_sge = 1;
      wr[i].send_flags = IBV_SEND_SIGNALED;
      wr[i].next = i < 3 ? &wr[i + 1] : nullptr;
    }
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(rc_, wr, &bad) != 0) Die("ibv_post_send");
  }

  void Reset() {
    Connect(rc_, IBV_QPT_RC);
    Connect(uc_, IBV_QPT_UC);
    Connect(ud_, IBV_QPT_UD);
    Connect(xrc_, IBV_QPT_XRC_RECV);
    Drain();
    PostRecvs(rc_, 4);
    PostRecvs(uc_, 4);
    PostRecvs(ud_, 4);
    PostXrcRecvs(4);
    PostRcRequests();
    // Let the requests leave (and their PSNs be taken) before the input.
    engine_->InjectForTest({});
  }

  // The completions and async events an input caused: nobody else reads
  // them, and a CQ or event queue left to fill would change later inputs.
  void Drain() {
    ibv_wc wc[32];
    while (ibv_poll_cq(cq_, 32, wc) > 0) {
    }
    ibv_async_event event;
    while (ibv_get_async_event(ctx_, &event) == 0) ibv_ack_async_event(&event);
  }

  net::Datagram Prepare(uint8_t ctl, std::vector<uint8_t>& bytes) {
    net::Datagram d{};
    d.src.sin_family = AF_INET;
    d.src.sin_port = htons(wire::kRoceUdpPort);
    d.src.sin_addr.s_addr = (ctl & 0x10) ? stranger_ip_ : peer_ip_;
    d.dst.s_addr = (ctl & 0x20) ? group_ip_ : emu_ip_;
    d.socket = 0;
    Rewrite(ctl, bytes);
    if ((ctl & 0x01) && bytes.size() >= wire::kBthBytes + wire::kIcrcBytes) {
      const wire::IcrcAddressing addr{ntohl(d.src.sin_addr.s_addr), ntohl(d.dst.s_addr),
                                      wire::kRoceUdpPort, wire::kRoceUdpPort};
      wire::WriteIcrc(addr, bytes);
    }
    d.data = bytes;
    return d;
  }

  // The rewrites ctl asks for, on a packet that parses (a header in place);
  // anything else goes as it came.
  void Rewrite(uint8_t ctl, std::vector<uint8_t>& bytes) {
    if ((ctl & 0x0e) == 0) return;
    auto parsed = wire::ParsePacket(bytes);
    if (!parsed.ok()) return;
    const wire::PacketView& p = *parsed;
    wire::BthView bth{std::span<uint8_t>(bytes)};
    if ((ctl & 0x02) && p.dest_qpn() != 1) {
      switch (p.info().transport) {
        case wire::Transport::kRc: bth.set_dest_qpn(rc_->qp_num); break;
        case wire::Transport::kUc: bth.set_dest_qpn(uc_->qp_num); break;
        case wire::Transport::kUd: bth.set_dest_qpn(ud_->qp_num); break;
        case wire::Transport::kXrc:
          bth.set_dest_qpn(xrc_->qp_num);
          if (p.Has(wire::kXrcethMask)) {
            wire::XrcethView{std::span<uint8_t>(bytes).subspan(
                                 static_cast<size_t>(p.xrceth().bytes().data() - bytes.data()))}
                .set_srqn(xsrq_num_);
          }
          break;
      }
    }
    if (ctl & 0x04) {
      const uint32_t base = p.Has(wire::kResponseMask) ? kSqPsn : kRqPsn;
      bth.set_psn((base + p.psn()) & wire::k24BitMask);
    }
    if (ctl & 0x08) {
      auto offset_of = [&](std::span<const uint8_t> h) { return static_cast<size_t>(h.data() - bytes.data()); };
      auto aim = [&](uint32_t rkey, uint64_t va, uint32_t* new_rkey, uint64_t* new_va) {
        const Region& r = regions_[rkey % regions_.size()];
        *new_rkey = r.mr->rkey;
        *new_va = r.addr() + static_cast<uint64_t>(static_cast<int64_t>(static_cast<int16_t>(va)));
      };
      uint32_t rkey;
      uint64_t va;
      if (p.Has(wire::kRethMask)) {
        wire::RethView reth{std::span<uint8_t>(bytes).subspan(offset_of(p.reth().bytes()))};
        aim(reth.rkey(), reth.va(), &rkey, &va);
        reth.set_rkey(rkey);
        reth.set_va(va);
      }
      if (p.Has(wire::kAtomicEthMask)) {
        wire::AtomicEthView eth{std::span<uint8_t>(bytes).subspan(offset_of(p.atomic_eth().bytes()))};
        aim(eth.rkey(), eth.va(), &rkey, &va);
        eth.set_rkey(rkey);
        eth.set_va(va);
      }
      if (p.Has(wire::kIethMask)) {
        wire::IethView ieth{std::span<uint8_t>(bytes).subspan(offset_of(p.ieth().bytes()))};
        ieth.set_rkey(regions_[ieth.rkey() % regions_.size()].mr->rkey);
      }
    }
  }

  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_qp* rc_ = nullptr;
  ibv_qp* uc_ = nullptr;
  ibv_qp* ud_ = nullptr;
  ibv_xrcd* xrcd_ = nullptr;
  ibv_srq* xsrq_ = nullptr;
  uint32_t xsrq_num_ = 0;
  ibv_qp* xrc_ = nullptr;
  std::vector<Region> regions_;
  std::shared_ptr<engine::Engine> engine_;
  uint32_t emu_ip_ = 0, peer_ip_ = 0, stranger_ip_ = 0, group_ip_ = 0;  // network order
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Built on the first input and kept: opening a device per input would
  // make the run a benchmark of ibv_open_device.
  static Target* const target = new Target();
  target->Run(data, size);
  return 0;
}
