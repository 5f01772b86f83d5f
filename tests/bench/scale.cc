#include "tests/bench/scale.h"

#include <errno.h>
#include <infiniband/verbs.h>
#include <malloc.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

namespace rdmaemu::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

long RssKib() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  const int n = std::fscanf(f, "%ld %ld", &pages, &resident);
  std::fclose(f);
  return n == 2 ? resident * (sysconf(_SC_PAGESIZE) / 1024) : -1;
}

long HeapKib() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<long>((m.uordblks + m.hblkhd) / 1024);
}

// The two processes tell each other their GID and QP numbers, wait for each
// other between steps and pass the second one's figures back, over a
// socketpair. A side that fails closes it, so the other stops waiting.
class Channel {
 public:
  explicit Channel(int fd) : fd_(fd) {}
  bool Write(const void* data, size_t n) {
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      p += w;
      n -= static_cast<size_t>(w);
    }
    return true;
  }
  bool Read(void* data, size_t n) {
    auto* p = static_cast<char*>(data);
    while (n > 0) {
      const ssize_t r = ::read(fd_, p, n);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      p += r;
      n -= static_cast<size_t>(r);
    }
    return true;
  }
  bool Barrier() {
    char b = 1;
    return Write(&b, 1) && Read(&b, 1);
  }

 private:
  int fd_;
};

// What the second process reports back when its rounds are done.
struct PeerReport {
  ScaleRss rss;
  uint64_t verified = 0;
};

// Message bytes: a function of who sent it, on which QP, in which round, so
// a message delivered to the wrong QP, twice or torn shows.
uint8_t PatternByte(int sender, int qp, int round, uint32_t k) {
  return static_cast<uint8_t>(sender * 101 + qp * 7 + round * 13 + static_cast<int>(k) * 3 + (qp >> 8));
}

// One process's device objects and QPs. Every method returns "" or what
// went wrong.
class Side {
 public:
  Side(const ScaleOptions& o, int id) : o_(o), id_(id) {}
  ~Side() { Close(); }

  std::string Open() {
    int n = 0;
    list_ = ibv_get_device_list(&n);
    if (list_ == nullptr || n == 0) return "no RDMA device";
    ctx_ = ibv_open_device(list_[0]);
    if (ctx_ == nullptr) return fmt::format("ibv_open_device: {}", std::strerror(errno));
    pd_ = ibv_alloc_pd(ctx_);
    if (pd_ == nullptr) return fmt::format("ibv_alloc_pd: {}", std::strerror(errno));
    send_cq_ = ibv_create_cq(ctx_, o_.qps, nullptr, nullptr, 0);
    recv_cq_ = ibv_create_cq(ctx_, o_.qps, nullptr, nullptr, 0);
    if (send_cq_ == nullptr || recv_cq_ == nullptr) return fmt::format("ibv_create_cq({}): {}", o_.qps, std::strerror(errno));
    // A receive slot and a send slot per QP.
    buf_.assign(static_cast<size_t>(o_.qps) * 2 * o_.message_bytes, 0);
    mr_ = ibv_reg_mr(pd_, buf_.data(), buf_.size(), IBV_ACCESS_LOCAL_WRITE);
    if (mr_ == nullptr) return fmt::format("ibv_reg_mr: {}", std::strerror(errno));
    if (ibv_query_gid(ctx_, 1, 0, &gid_) != 0) return "ibv_query_gid failed";
    return "";
  }

  std::string CreateQps() {
    qps_.reserve(o_.qps);
    for (int i = 0; i < o_.qps; ++i) {
      ibv_qp* qp = CreateRc(send_cq_, recv_cq_);
      if (qp == nullptr) return fmt::format("ibv_create_qp number {}: {}", i + 1, std::strerror(errno));
      qps_.push_back(qp);
    }
    return "";
  }

  std::vector<uint32_t> Qpns() const {
    std::vector<uint32_t> v;
    v.reserve(qps_.size());
    for (ibv_qp* qp : qps_) v.push_back(qp->qp_num);
    return v;
  }

  std::string Connect(const ibv_gid& peer_gid, const std::vector<uint32_t>& peer_qpns) {
    for (int i = 0; i < o_.qps; ++i) {
      if (std::string e = ConnectRc(qps_[i], peer_gid, peer_qpns[i]); !e.empty()) {
        return fmt::format("QP {} of {}: {}", i + 1, o_.qps, e);
      }
      if (std::string e = PostRecv(qps_[i], i); !e.empty()) return e;
    }
    return "";
  }

  // The first process: sends on every QP, then takes every reply and every
  // send completion.
  std::string SendRound(int round) {
    for (int i = 0; i < o_.qps; ++i) {
      if (std::string e = PostSend(qps_[i], i, round); !e.empty()) return e;
    }
    return Drain(round, o_.qps, o_.qps, /*reply=*/false);
  }

  // The second process: takes every message, answers each on its QP, and
  // takes every send completion.
  std::string AnswerRound(int round) {
    return Drain(round, o_.qps, o_.qps, /*reply=*/true);
  }

  uint64_t verified() const { return verified_; }
  const ibv_gid& gid() const { return gid_; }

  // Creates two QPs, connects them to each other, moves one message from
  // one to the other, checks it and destroys both; `n` times.
  std::string Cycles(int n, long* rss_early) {
    for (int c = 0; c < n; ++c) {
      ibv_qp* a = CreateRc(send_cq_, send_cq_);
      ibv_qp* b = CreateRc(recv_cq_, recv_cq_);
      if (a == nullptr || b == nullptr) return fmt::format("cycle {}: ibv_create_qp: {}", c + 1, std::strerror(errno));
      std::string e = ConnectRc(a, gid_, b->qp_num);
      if (e.empty()) e = ConnectRc(b, gid_, a->qp_num);
      if (e.empty()) e = PostRecv(b, 0);
      if (e.empty()) e = PostSend(a, 0, c);
      if (e.empty()) e = Drain(c, 1, 1, /*reply=*/false, /*expect_sender=*/id_);
      if (ibv_destroy_qp(a) != 0 || ibv_destroy_qp(b) != 0) {
        if (e.empty()) e = fmt::format("ibv_destroy_qp: {}", std::strerror(errno));
      }
      if (!e.empty()) return fmt::format("cycle {} of {}: {}", c + 1, n, e);
      if (c + 1 == n / 10) *rss_early = RssKib();
    }
    return "";
  }

  std::string DestroyQps() {
    for (ibv_qp* qp : qps_) {
      if (ibv_destroy_qp(qp) != 0) return fmt::format("ibv_destroy_qp: {}", std::strerror(errno));
    }
    qps_.clear();
    return "";
  }

 private:
  ibv_qp* CreateRc(ibv_cq* scq, ibv_cq* rcq) {
    ibv_qp_init_attr a{};
    a.send_cq = scq;
    a.recv_cq = rcq;
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = 2;
    a.cap.max_recv_wr = 2;
    a.cap.max_send_sge = 1;
    a.cap.max_recv_sge = 1;
    return ibv_create_qp(pd_, &a);
  }

  static std::string ConnectRc(ibv_qp* qp, const ibv_gid& gid, uint32_t peer) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
      return fmt::format("to INIT: {}", std::strerror(errno));
    }
    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = peer;
    a.rq_psn = 1;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = gid;
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.port_num = 1;
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0) {
      return fmt::format("to RTR: {}", std::strerror(errno));
    }
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 1;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                          IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
      return fmt::format("to RTS: {}", std::strerror(errno));
    }
    return "";
  }

  uint8_t* RecvSlot(int i) { return buf_.data() + static_cast<size_t>(i) * o_.message_bytes; }
  uint8_t* SendSlot(int i) { return buf_.data() + static_cast<size_t>(o_.qps + i) * o_.message_bytes; }

  std::string PostRecv(ibv_qp* qp, int i) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(RecvSlot(i)), o_.message_bytes, mr_->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = static_cast<uint64_t>(i);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    if (int rc = ibv_post_recv(qp, &wr, &bad)) return fmt::format("ibv_post_recv: {}", std::strerror(rc));
    return "";
  }

  std::string PostSend(ibv_qp* qp, int i, int round) {
    uint8_t* p = SendSlot(i);
    for (uint32_t k = 0; k < o_.message_bytes; ++k) p[k] = PatternByte(id_, i, round, k);
    ibv_sge sge{reinterpret_cast<uintptr_t>(p), o_.message_bytes, mr_->lkey};
    ibv_send_wr wr{};
    wr.wr_id = static_cast<uint64_t>(i);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(qp, &wr, &bad)) return fmt::format("ibv_post_send: {}", std::strerror(rc));
    return "";
  }

  std::string Check(const ibv_wc& wc, int round, int sender) {
    if (wc.status != IBV_WC_SUCCESS) {
      return fmt::format("qp#{} wr_id {}: {} completed {}", wc.qp_num, wc.wr_id,
                         wc.opcode == IBV_WC_RECV ? "receive" : "send", ibv_wc_status_str(wc.status));
    }
    if (wc.opcode != IBV_WC_RECV) return "";
    const int i = static_cast<int>(wc.wr_id);
    if (wc.byte_len != o_.message_bytes) {
      return fmt::format("qp#{}: received {} bytes, sent {}", wc.qp_num, wc.byte_len, o_.message_bytes);
    }
    const uint8_t* p = RecvSlot(i);
    for (uint32_t k = 0; k < o_.message_bytes; ++k) {
      if (p[k] != PatternByte(sender, i, round, k)) {
        return fmt::format("qp#{} (QP {}), round {}: byte {} is {:#x}, the sender wrote {:#x}", wc.qp_num, i,
                           round, k, p[k], PatternByte(sender, i, round, k));
      }
    }
    ++verified_;
    return "";
  }

  // Polls until `want_sends` send and `want_recvs` receive completions
  // came, checking each. A CQ is polled only while more is wanted from it:
  // the peer's next round may already be arriving.
  std::string Drain(int round, int want_sends, int want_recvs, bool reply, int expect_sender = -1) {
    const int sender = expect_sender >= 0 ? expect_sender : 1 - id_;
    Clock::time_point last = Clock::now();
    ibv_wc wc[64];
    int sends = 0, recvs = 0;
    while (sends < want_sends || recvs < want_recvs) {
      int got = 0;
      for (ibv_cq* cq : {send_cq_, recv_cq_}) {
        const int left = cq == send_cq_ ? want_sends - sends : want_recvs - recvs;
        if (left == 0) continue;
        const int n = ibv_poll_cq(cq, std::min(left, 64), wc);
        if (n < 0) return "ibv_poll_cq failed";
        got += n;
        for (int k = 0; k < n; ++k) {
          if (std::string e = Check(wc[k], round, sender); !e.empty()) return e;
          if (wc[k].opcode != IBV_WC_RECV) {
            ++sends;
            continue;
          }
          ++recvs;
          if (expect_sender >= 0) continue;  // a cycle's QP: used once
          const int i = static_cast<int>(wc[k].wr_id);
          if (std::string e = PostRecv(qps_[i], i); !e.empty()) return e;
          if (reply) {
            if (std::string e = PostSend(qps_[i], i, round); !e.empty()) return e;
          }
        }
      }
      if (got > 0) {
        last = Clock::now();
      } else if (Seconds(last) > o_.stall_seconds) {
        return fmt::format("round {}: no completion for {} s with {} of {} sends and {} of {} receives done",
                           round, o_.stall_seconds, sends, want_sends, recvs, want_recvs);
      }
    }
    return "";
  }

  void Close() {
    for (ibv_qp* qp : qps_) ibv_destroy_qp(qp);
    qps_.clear();
    if (mr_ != nullptr) ibv_dereg_mr(mr_);
    if (send_cq_ != nullptr) ibv_destroy_cq(send_cq_);
    if (recv_cq_ != nullptr) ibv_destroy_cq(recv_cq_);
    if (pd_ != nullptr) ibv_dealloc_pd(pd_);
    if (ctx_ != nullptr) ibv_close_device(ctx_);
    if (list_ != nullptr) ibv_free_device_list(list_);
    mr_ = nullptr;
    send_cq_ = recv_cq_ = nullptr;
    pd_ = nullptr;
    ctx_ = nullptr;
    list_ = nullptr;
  }

  const ScaleOptions o_;
  const int id_;  // 0: the first process, 1: the second
  ibv_device** list_ = nullptr;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* send_cq_ = nullptr;
  ibv_cq* recv_cq_ = nullptr;
  ibv_mr* mr_ = nullptr;
  ibv_gid gid_{};
  std::vector<uint8_t> buf_;
  std::vector<ibv_qp*> qps_;
  uint64_t verified_ = 0;
};

// Both processes' common steps up to a connected set of QPs.
std::string Setup(Side& side, Channel& ch, ScaleRss* rss, double* connect_seconds, int qps) {
  if (std::string e = side.Open(); !e.empty()) return e;
  rss->start = RssKib();
  const Clock::time_point t0 = Clock::now();
  if (std::string e = side.CreateQps(); !e.empty()) return e;
  const std::vector<uint32_t> mine = side.Qpns();
  std::vector<uint32_t> theirs(static_cast<size_t>(qps));
  ibv_gid peer{};
  if (!ch.Write(&side.gid(), sizeof(ibv_gid)) || !ch.Write(mine.data(), mine.size() * sizeof(uint32_t)) ||
      !ch.Read(&peer, sizeof peer) || !ch.Read(theirs.data(), theirs.size() * sizeof(uint32_t))) {
    return "the other process went away while exchanging QP numbers";
  }
  if (std::string e = side.Connect(peer, theirs); !e.empty()) return e;
  *connect_seconds = Seconds(t0);
  rss->connected = RssKib();
  // Every receive is posted on both sides before the first send.
  if (!ch.Barrier()) return "the other process went away before the first round";
  return "";
}

std::string RunSecond(const ScaleOptions& o, Channel& ch) {
  Side side(o, 1);
  PeerReport report;
  double connect_seconds = 0;
  if (std::string e = Setup(side, ch, &report.rss, &connect_seconds, o.qps); !e.empty()) return e;
  for (int r = 0; r < o.rounds; ++r) {
    if (std::string e = side.AnswerRound(r); !e.empty()) return e;
    if (r == 0) report.rss.round1 = RssKib();
    if (r == o.rounds / 2) {
      report.rss.mid = RssKib();
      report.rss.heap_mid = HeapKib();
    }
  }
  report.rss.end = RssKib();
  report.rss.heap_end = HeapKib();
  report.verified = side.verified();
  if (!ch.Write(&report, sizeof report)) return "the first process went away";
  return side.DestroyQps();
}

}  // namespace

ScaleResult RunScale(const ScaleOptions& o) {
  ScaleResult res;
  res.qps = o.qps;
  res.rounds = o.rounds;
  res.cycles = o.cycles;
  if (o.qps < 1 || o.rounds < 1 || o.cycles < 0 || o.message_bytes < 1) {
    res.error = "qps and rounds must be at least 1, message_bytes at least 1 and cycles not negative";
    return res;
  }
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    res.error = fmt::format("socketpair: {}", std::strerror(errno));
    return res;
  }
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child < 0) {
    res.error = fmt::format("fork: {}", std::strerror(errno));
    return res;
  }
  if (child == 0) {
    // The second process: its own emulated host. It says what failed on
    // stderr; the first sees the channel close.
    ::close(sv[0]);
    Channel ch(sv[1]);
    const std::string e = RunSecond(o, ch);
    if (!e.empty()) std::fprintf(stderr, "scale: second process: %s\n", e.c_str());
    std::fflush(nullptr);
    _exit(e.empty() ? 0 : 1);
  }
  ::close(sv[1]);
  Channel ch(sv[0]);
  std::string e;
  {
    Side side(o, 0);
    e = Setup(side, ch, &res.first, &res.connect_seconds, o.qps);
    const Clock::time_point t0 = Clock::now();
    for (int r = 0; e.empty() && r < o.rounds; ++r) {
      e = side.SendRound(r);
      if (r == 0) res.first.round1 = RssKib();
      if (r == o.rounds / 2) {
        res.first.mid = RssKib();
        res.first.heap_mid = HeapKib();
      }
    }
    res.traffic_seconds = Seconds(t0);
    res.first.end = RssKib();
    res.first.heap_end = HeapKib();
    PeerReport report;
    if (e.empty() && !ch.Read(&report, sizeof report)) e = "the second process went away before reporting";
    res.second = report.rss;
    res.verified = side.verified() + report.verified;
    if (e.empty()) e = side.DestroyQps();
    if (e.empty() && o.cycles > 0) {
      const Clock::time_point c0 = Clock::now();
      e = side.Cycles(o.cycles, &res.cycles_rss_early);
      res.cycle_seconds = Seconds(c0);
      res.cycles_rss_end = RssKib();
    }
  }
  ::close(sv[0]);
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (e.empty() && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    e = "the second process failed (its message is above)";
  }
  res.error = e;
  return res;
}

std::string Describe(const ScaleResult& r) {
  auto per_qp = [&](const ScaleRss& s) {
    return r.qps > 0 ? static_cast<double>(s.connected - s.start) * 1024.0 / r.qps : 0.0;
  };
  std::string out;
  out += fmt::format("{} RC QPs in each of two processes, {} round(s), one verified message each way per QP and round\n",
                     r.qps, r.rounds);
  out += fmt::format("  connect (create + INIT/RTR/RTS + post receive): {:.2f} s ({:.1f} us per QP)\n",
                     r.connect_seconds, r.qps ? r.connect_seconds * 1e6 / r.qps : 0.0);
  out += fmt::format("  traffic: {:.2f} s, {} messages verified\n", r.traffic_seconds, r.verified);
  for (const auto& [name, s] : {std::pair{"first ", r.first}, std::pair{"second", r.second}}) {
    out += fmt::format(
        "  {} process RSS KiB: {} without QPs, {} connected ({:.0f} bytes per QP); under traffic {} after "
        "round 1, {} after half the rounds, {} at the end ({:+} KiB in the second half; heap in use "
        "{:+} KiB)\n",
        name, s.start, s.connected, per_qp(s), s.round1, s.mid, s.end, s.end - s.mid, s.heap_end - s.heap_mid);
  }
  if (r.cycles > 0) {
    out += fmt::format("  {} create/connect/send/destroy cycles of a QP pair: {:.2f} s ({:.1f} us each), RSS KiB "
                       "{} after a tenth, {} at the end ({:+} KiB)\n",
                       r.cycles, r.cycle_seconds, r.cycle_seconds * 1e6 / r.cycles, r.cycles_rss_early,
                       r.cycles_rss_end, r.cycles_rss_end - r.cycles_rss_early);
  }
  out += r.error.empty() ? "  result: OK\n" : fmt::format("  result: FAILED: {}\n", r.error);
  return out;
}

}  // namespace rdmaemu::bench
