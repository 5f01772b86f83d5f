// UD soak: the client sends every message of the plan as a UD SEND with
// its index as the immediate, in batches; after each batch the server
// takes what arrived until the line goes quiet. UD may lose a message (the
// network, a fault rule), but every message that arrives must be exactly
// what was sent: the right length, the right bytes, from the right QP.
#include <arpa/inet.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "tests/e2e/soak/modes.h"
#include "tests/e2e/soak/rdma.h"
#include "tests/e2e/soak/stats.h"

namespace soak {
namespace {

constexpr uint32_t kGrh = 40;
constexpr uint32_t kQkey = 0x50A4;
// Once a batch is sent, the server stops waiting for it after this long
// without a completion.
constexpr int kQuietMs = 50;

struct BatchEnd {
  uint32_t sent = 0;  // messages sent so far
  uint32_t last = 0;  // 1: no more batches
};
struct Tally {
  uint64_t received = 0;
  uint64_t duplicates = 0;
  uint64_t bytes = 0;
};

std::string Describe(uint32_t index, uint32_t size) {
  return fmt::format("UD message {} ({} bytes)", index, size);
}

}  // namespace

int RunUdClient(const Options& o, Channel& ctl) {
  Params p = o.params;
  Verbs v = OpenVerbs(o, static_cast<int>(p.depth + 16));
  const uint32_t port_mtu = MtuBytes(static_cast<ibv_mtu>(v.port.active_mtu));
  p.max_size = std::min(p.max_size, port_mtu);
  p.mtu = port_mtu;
  const uint64_t slot_bytes = (uint64_t{p.max_size} + 63) / 64 * 64;
  std::vector<uint8_t> slots(slot_bytes * p.depth);
  ibv_mr* mr = Register(v, slots.data(), slots.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_qp_cap cap{};
  cap.max_send_wr = p.depth;
  cap.max_recv_wr = 1;
  cap.max_send_sge = 1;
  cap.max_recv_sge = 1;
  ibv_qp* qp = CreateQp(v, IBV_QPT_UD, cap);
  ReadyUd(v, qp, kQkey, static_cast<uint32_t>(Mix(p.seed) & 0xffffff));
  ctl.Send(p);
  ctl.Send(LocalEndpoint(v, qp, 0));
  Endpoint server;
  ctl.Recv(&server);
  uint8_t go = 0;
  ctl.Recv(&go);
  ibv_ah* ah = CreateAh(v, server);

  const auto start = std::chrono::steady_clock::now();
  std::vector<ibv_wc> wc(p.depth);
  uint64_t bytes = 0;
  uint32_t next_post = 0, next_complete = 0;
  while (next_complete < p.messages) {
    const uint32_t batch_end = std::min(p.messages, (next_complete / p.batch + 1) * p.batch);
    while (next_post < batch_end && next_post - next_complete < p.depth) {
      const uint32_t size = UdSize(p, next_post);
      uint8_t* buf = slots.data() + uint64_t{next_post % p.depth} * slot_bytes;
      FillPayload(p.seed, next_post, buf, size);
      ibv_sge sge{reinterpret_cast<uintptr_t>(buf), size, mr->lkey};
      ibv_send_wr wr{};
      wr.wr_id = next_post;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = IBV_WR_SEND_WITH_IMM;
      wr.imm_data = htonl(next_post);
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.wr.ud.ah = ah;
      wr.wr.ud.remote_qpn = server.qpn;
      wr.wr.ud.remote_qkey = kQkey;
      ibv_send_wr* bad = nullptr;
      if (int e = ibv_post_send(qp, &wr, &bad); e != 0) {
        Die(fmt::format("ibv_post_send of UD message {}: {}", next_post, std::strerror(e)));
      }
      bytes += size;
      ++next_post;
    }
    const int n = WaitCompletions(v, wc.data(), static_cast<int>(wc.size()), ctl);
    for (int k = 0; k < n; ++k) {
      if (wc[k].wr_id != next_complete || wc[k].status != IBV_WC_SUCCESS || wc[k].opcode != IBV_WC_SEND) {
        Mismatch(fmt::format("{}: send completion wr_id {} status {} opcode {}",
                             Describe(next_complete, UdSize(p, next_complete)), wc[k].wr_id,
                             ibv_wc_status_str(wc[k].status), static_cast<int>(wc[k].opcode)));
      }
      ++next_complete;
    }
    SetProgress(next_complete, p.messages);
    if (next_complete == batch_end) {
      // The batch is on the wire: let the server take it before the next.
      ctl.Send(BatchEnd{next_complete, next_complete == p.messages ? 1u : 0u});
      uint8_t ack = 0;
      ctl.Recv(&ack);
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Tally t;
  ctl.Recv(&t);
  fmt::print("soak ud ok: sent={} received={} lost={} duplicates={} bytes_sent={} bytes_received={} "
             "time={:.1f}s mtu={} seed={} (every received message verified)\n",
             p.messages, t.received, p.messages - (t.received - t.duplicates), t.duplicates, bytes, t.bytes,
             secs, p.max_size, p.seed);
  fmt::print("soak client counters: {}\n", DeviceCounters(v.ctx));
  fmt::print("soak client faults: {}\n", FaultRules(v.ctx));
  std::fflush(stdout);
  ibv_destroy_ah(ah);
  ibv_destroy_qp(qp);
  ibv_dereg_mr(mr);
  CloseVerbs(v);
  return kExitOk;
}

int RunUdServer(const Options& o, Channel& ctl) {
  Params p;
  ctl.Recv(&p);
  Endpoint client;
  ctl.Recv(&client);
  if (p.messages == 0 || p.batch == 0 || p.depth == 0 || p.max_size > (1u << 16)) {
    Die("the client sent parameters that make no plan");
  }
  const uint32_t recvs = 2 * p.batch;
  Verbs v = OpenVerbs(o, static_cast<int>(recvs + 16));
  const uint64_t buf_bytes = kGrh + p.max_size + 64;  // 64 bytes that must stay untouched
  std::vector<uint8_t> bufs(buf_bytes * recvs, kPoison);
  ibv_mr* mr = Register(v, bufs.data(), bufs.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_qp_cap cap{};
  cap.max_send_wr = 1;
  cap.max_recv_wr = recvs;
  cap.max_send_sge = 1;
  cap.max_recv_sge = 1;
  ibv_qp* qp = CreateQp(v, IBV_QPT_UD, cap);
  ReadyUd(v, qp, kQkey, 0);
  auto post = [&](uint32_t k) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(bufs.data() + k * buf_bytes), static_cast<uint32_t>(kGrh + p.max_size),
                mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = k;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    if (int e = ibv_post_recv(qp, &wr, &bad); e != 0) Die(fmt::format("ibv_post_recv: {}", std::strerror(e)));
  };
  for (uint32_t k = 0; k < recvs; ++k) post(k);
  Endpoint me = LocalEndpoint(v, qp, 0);
  me.qkey = kQkey;
  ctl.Send(me);
  ctl.Send(uint8_t{1});

  std::vector<bool> seen(p.messages);
  Tally t;
  std::vector<ibv_wc> wc(recvs);
  auto take = [&](const ibv_wc& c) {
    if (c.status != IBV_WC_SUCCESS) {
      Mismatch(fmt::format("a UD receive completed with status {}", ibv_wc_status_str(c.status)));
    }
    const uint32_t i = ntohl(c.imm_data);
    if (c.opcode != IBV_WC_RECV || !(c.wc_flags & IBV_WC_WITH_IMM) || !(c.wc_flags & IBV_WC_GRH) ||
        i >= p.messages) {
      Mismatch(fmt::format("a UD receive with opcode {} flags {:#x} immediate {}: not a message of the plan",
                           static_cast<int>(c.opcode), c.wc_flags, i));
    }
    const uint32_t size = UdSize(p, i);
    if (c.byte_len != kGrh + size || c.src_qp != client.qpn) {
      Mismatch(fmt::format("{}: byte_len {} (want {} with the GRH) from QP {} (want {})", Describe(i, size),
                           c.byte_len, kGrh + size, c.src_qp, client.qpn));
    }
    uint8_t* buf = bufs.data() + c.wr_id * buf_bytes;
    std::string why;
    if (!CheckPayload(p.seed, i, 0, buf + kGrh, size, &why)) Mismatch(fmt::format("{}: {}", Describe(i, size), why));
    if (!CheckPoison(buf + kGrh + size, buf_bytes - kGrh - size, &why)) {
      Mismatch(fmt::format("{}: written past its length: {}", Describe(i, size), why));
    }
    std::memset(buf, kPoison, kGrh + size);
    if (seen[i]) ++t.duplicates;
    seen[i] = true;
    ++t.received;
    t.bytes += size;
    post(static_cast<uint32_t>(c.wr_id));
  };
  for (;;) {
    BatchEnd end;
    ctl.Recv(&end);
    for (;;) {
      const int n = WaitCompletionsFor(v, wc.data(), static_cast<int>(wc.size()), ctl, kQuietMs);
      if (n == 0) break;
      for (int k = 0; k < n; ++k) take(wc[k]);
    }
    SetProgress(end.sent, p.messages);
    ctl.Send(uint8_t{1});
    if (end.last) break;
  }
  ctl.Send(t);
  fmt::print("soak ud server: received={} duplicates={} bytes={} (every one verified)\n", t.received,
             t.duplicates, t.bytes);
  fmt::print("soak server counters: {}\n", DeviceCounters(v.ctx));
  fmt::print("soak server faults: {}\n", FaultRules(v.ctx));
  std::fflush(stdout);
  ibv_destroy_qp(qp);
  ibv_dereg_mr(mr);
  CloseVerbs(v);
  return kExitOk;
}

}  // namespace soak
