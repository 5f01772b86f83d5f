// The semantics of ibv_get_cq_event(3) and ibv_get_async_event(3), through
// the public verbs API with real traffic: RC QPs of one process connected to
// each other over the engine. The BUILD runs this binary once per engine
// backend: RDMAEMU_TEST_ENGINE=uring or =epoll becomes RDMAEMU_ENGINE before
// any test runs, so a suite-wide --test_env=RDMAEMU_ENGINE=... leaves it be.
//
// Waits are measured, not slept: a destroy is "blocked" when its thread is
// asleep in the kernel and has not returned, and "prompt" is the time from
// the ack to its return.
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <rdmaemu/rdmaemu.h>

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Generous for a loaded 2-core machine under TSan; an ack-driven wake-up
// takes microseconds, a destroy that polls on a timer would take longer.
constexpr auto kPrompt = 500ms;

class PinEngine : public ::testing::Environment {
 public:
  // Runs on the main thread before any test, while no other thread exists.
  void SetUp() override {
    if (const char* engine = std::getenv("RDMAEMU_TEST_ENGINE")) ::setenv("RDMAEMU_ENGINE", engine, 1);
  }
};
[[maybe_unused]] ::testing::Environment* const kPinEngine =
    ::testing::AddGlobalTestEnvironment(new PinEngine);

// --- readiness, three ways ---------------------------------------------------

bool PollReadable(int fd, int timeout_ms = 0) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

bool SelectReadable(int fd) {
  fd_set set;
  FD_ZERO(&set);
  FD_SET(fd, &set);
  timeval zero{0, 0};
  return ::select(fd + 1, &set, nullptr, nullptr, &zero) == 1 && FD_ISSET(fd, &set);
}

// A level-triggered epoll set watching one fd for reading.
class Epoll {
 public:
  explicit Epoll(int fd) : ep_(::epoll_create1(EPOLL_CLOEXEC)) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    ok_ = ep_ >= 0 && ::epoll_ctl(ep_, EPOLL_CTL_ADD, fd, &ev) == 0;
  }
  ~Epoll() {
    if (ep_ >= 0) ::close(ep_);
  }
  bool ok() const { return ok_; }
  bool Readable(int timeout_ms = 0) {
    epoll_event ev{};
    return ::epoll_wait(ep_, &ev, 1, timeout_ms) == 1 && (ev.events & EPOLLIN);
  }

 private:
  int ep_;
  bool ok_ = false;
};

// poll, select and epoll agree with `want`.
void ExpectReadiness(int fd, Epoll& ep, bool want, const char* when) {
  EXPECT_EQ(PollReadable(fd), want) << "poll, " << when;
  EXPECT_EQ(SelectReadable(fd), want) << "select, " << when;
  EXPECT_EQ(ep.Readable(), want) << "epoll, " << when;
}

void SetNonBlocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  ASSERT_GE(flags, 0);
  ASSERT_EQ(::fcntl(fd, F_SETFL, flags | O_NONBLOCK), 0);
}

std::string FdTarget(int fd) {
  char buf[256];
  std::string link = "/proc/self/fd/" + std::to_string(fd);
  ssize_t n = ::readlink(link.c_str(), buf, sizeof buf - 1);
  return n < 0 ? std::string() : std::string(buf, static_cast<size_t>(n));
}

// A field of /proc/self/fdinfo/FD ("eventfd-count", "eventfd-semaphore"),
// in hex as the kernel prints eventfd's; -1 if absent.
long FdInfo(int fd, const std::string& key) {
  std::ifstream f("/proc/self/fdinfo/" + std::to_string(fd));
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::stol(line.substr(key.size() + 1), nullptr, 16);
  }
  return -1;
}

// The eventfd's counter, read without taking anything from it.
long EventfdCount(int fd) { return FdInfo(fd, "eventfd-count"); }

// Waits up to 5 s for the eventfd's counter to reach `want` (events are
// queued by the engine thread just after their completion is visible).
bool WaitForCount(int fd, long want) {
  auto until = Clock::now() + 5s;
  while (EventfdCount(fd) != want && Clock::now() < until) std::this_thread::sleep_for(1ms);
  return EventfdCount(fd) == want;
}

// --- blocking calls, measured -------------------------------------------------

// The scheduler state of one of our threads: 'S' while asleep in the kernel
// (a futex wait, a blocking read), 'R' while running.
char ThreadState(pid_t tid) {
  std::ifstream f("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t p = s.rfind(')');
  return p == std::string::npos || p + 2 >= s.size() ? '?' : s[p + 2];
}

// Runs `call` (a destroy) on its own thread.
class BlockingCall {
 public:
  explicit BlockingCall(std::function<int()> call)
      : thread_([this, call = std::move(call)] {
          tid_ = ::gettid();
          int rc = call();
          returned_at_ = Clock::now();
          rc_ = rc;
          done_ = true;
        }) {}
  ~BlockingCall() { thread_.join(); }

  // True when the call is asleep and stays unreturned for `hold` after it was
  // first seen asleep; false as soon as it returns.
  bool Blocked(std::chrono::milliseconds hold = 150ms) {
    auto give_up = Clock::now() + 10s;
    while (!done_ && (tid_ == 0 || ThreadState(tid_) != 'S')) {
      if (Clock::now() > give_up) return false;
      std::this_thread::sleep_for(1ms);
    }
    auto until = Clock::now() + hold;
    while (Clock::now() < until) {
      if (done_) return false;
      std::this_thread::sleep_for(1ms);
    }
    return !done_;
  }

  // Waits for the return; the time from `since` to it, or nullopt-like -1.
  std::chrono::microseconds ReturnedAfter(Clock::time_point since, std::chrono::seconds limit = 10s) {
    auto give_up = Clock::now() + limit;
    while (!done_ && Clock::now() < give_up) std::this_thread::sleep_for(100us);
    if (!done_) return std::chrono::microseconds(-1);
    return std::chrono::duration_cast<std::chrono::microseconds>(returned_at_ - since);
  }
  bool done() const { return done_; }
  int rc() const { return rc_; }

 private:
  std::atomic<pid_t> tid_{0};
  std::atomic<bool> done_{false};
  std::atomic<int> rc_{-1};
  Clock::time_point returned_at_;  // written before done_ is set
  std::thread thread_;
};

// Runs `destroy` on a thread and checks that it waits for every ack: after
// each of `acks` but the last it is still blocked, and after the last it
// returns 0 within kPrompt.
void ExpectDestroyWaitsFor(std::function<int()> destroy, std::vector<std::function<void()>> acks) {
  BlockingCall call(std::move(destroy));
  for (size_t i = 0; i + 1 < acks.size(); ++i) {
    EXPECT_TRUE(call.Blocked()) << "destroy returned before ack " << i + 1 << " of " << acks.size();
    acks[i]();
  }
  EXPECT_TRUE(call.Blocked()) << "destroy returned with an unacknowledged event";
  Clock::time_point acked = Clock::now();
  acks.back()();
  auto latency = call.ReturnedAfter(acked);
  ASSERT_GE(latency.count(), 0) << "destroy did not return after the last ack";
  EXPECT_LT(latency, kPrompt) << "destroy returned " << latency.count() << " us after the ack";
  ::testing::Test::RecordProperty("destroy_after_ack_us", static_cast<int>(latency.count()));
  EXPECT_EQ(call.rc(), 0);
}

// A destroy with nothing to wait for returns within kPrompt.
void ExpectDestroyReturnsAtOnce(std::function<int()> destroy) {
  Clock::time_point start = Clock::now();
  BlockingCall call(std::move(destroy));
  auto latency = call.ReturnedAfter(start);
  ASSERT_GE(latency.count(), 0) << "destroy waited for events the application never read";
  EXPECT_LT(latency, kPrompt);
  EXPECT_EQ(call.rc(), 0);
}

// Sends fd 2 to a file for a while, so the test can read the log as it grows.
class StderrFile {
 public:
  StderrFile() {
    char path[] = "/tmp/event_semantics_stderr_XXXXXX";
    fd_ = ::mkstemp(path);
    ::unlink(path);
    std::fflush(stderr);
    saved_ = ::dup(2);
    ::dup2(fd_, 2);
  }
  ~StderrFile() {
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    ::close(fd_);
  }
  std::string Read() const {
    std::string out;
    char buf[4096];
    off_t off = 0;
    ssize_t n;
    while ((n = ::pread(fd_, buf, sizeof buf, off)) > 0) {
      out.append(buf, static_cast<size_t>(n));
      off += n;
    }
    return out;
  }

 private:
  int fd_ = -1;
  int saved_ = -1;
};

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

std::string PointerText(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

// --- the fixture: one context, RC pairs over the engine ----------------------

struct Pair {
  ibv_qp* sender;
  ibv_qp* receiver;
};

class EventSemanticsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* pinned = std::getenv("RDMAEMU_TEST_ENGINE");
    const char* engine = std::getenv("RDMAEMU_ENGINE");
    ASSERT_TRUE(pinned != nullptr && engine != nullptr) << "the BUILD picks the engine for each run";
    ASSERT_STREQ(engine, pinned);
    list_ = ibv_get_device_list(nullptr);
    ASSERT_NE(list_, nullptr);
    ctx_ = ibv_open_device(list_[0]);
    ASSERT_NE(ctx_, nullptr);
    pd_ = ibv_alloc_pd(ctx_);
    ASSERT_NE(pd_, nullptr);
    buf_.assign(1 << 16, 0);
    mr_ = ibv_reg_mr(pd_, buf_.data(), buf_.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    ASSERT_NE(mr_, nullptr);
    ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &gid_), 0);
    ch_ = ibv_create_comp_channel(ctx_);
    ASSERT_NE(ch_, nullptr);
    send_cq_ = ibv_create_cq(ctx_, 256, nullptr, nullptr, 0);
    ASSERT_NE(send_cq_, nullptr);
    recv_cq_ = ibv_create_cq(ctx_, 256, &tag_, ch_, 0);
    ASSERT_NE(recv_cq_, nullptr);
  }

  void TearDown() override {
    for (ibv_qp* qp : qps_) EXPECT_EQ(ibv_destroy_qp(qp), 0);
    for (ibv_srq* srq : srqs_) EXPECT_EQ(ibv_destroy_srq(srq), 0);
    for (ibv_cq* cq : cqs_) EXPECT_EQ(ibv_destroy_cq(cq), 0);
    if (recv_cq_ != nullptr) {
      EXPECT_EQ(ibv_destroy_cq(recv_cq_), 0);
    }
    if (send_cq_ != nullptr) {
      EXPECT_EQ(ibv_destroy_cq(send_cq_), 0);
    }
    if (ch_ != nullptr) {
      EXPECT_EQ(ibv_destroy_comp_channel(ch_), 0);
    }
    if (mr_ != nullptr) {
      EXPECT_EQ(ibv_dereg_mr(mr_), 0);
    }
    if (pd_ != nullptr) {
      EXPECT_EQ(ibv_dealloc_pd(pd_), 0);
    }
    if (ctx_ != nullptr) {
      EXPECT_EQ(ibv_close_device(ctx_), 0);
    }
    if (list_ != nullptr) ibv_free_device_list(list_);
  }

  ibv_cq* NewCq(void* cq_context, ibv_comp_channel* channel, int cqe = 64) {
    ibv_cq* cq = ibv_create_cq(ctx_, cqe, cq_context, channel, 0);
    if (cq != nullptr) cqs_.push_back(cq);
    return cq;
  }

  ibv_srq* NewSrq() {
    ibv_srq_init_attr a{};
    a.attr.max_wr = 16;
    a.attr.max_sge = 1;
    ibv_srq* srq = ibv_create_srq(pd_, &a);
    if (srq != nullptr) srqs_.push_back(srq);
    return srq;
  }

  ibv_qp* NewRc(ibv_cq* send_cq, ibv_cq* recv_cq, ibv_srq* srq = nullptr) {
    ibv_qp_init_attr a{};
    a.send_cq = send_cq;
    a.recv_cq = recv_cq;
    a.srq = srq;
    a.qp_type = IBV_QPT_RC;
    a.cap = {16, 16, 1, 1, 0};
    ibv_qp* qp = ibv_create_qp(pd_, &a);
    if (qp != nullptr) qps_.push_back(qp);
    return qp;
  }

  // INIT -> RTR -> RTS towards `peer` on this device.
  void Connect(ibv_qp* qp, uint32_t peer) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = peer;
    a.rq_psn = 7;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = gid_;
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.port_num = 1;
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                        IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
              0);
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 7;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                        IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC),
              0);
  }

  // A sender and a receiver whose receives complete into `recv_cq`.
  Pair NewPair(ibv_cq* recv_cq) {
    Pair p{NewRc(send_cq_, send_cq_), NewRc(send_cq_, recv_cq)};
    EXPECT_NE(p.sender, nullptr);
    EXPECT_NE(p.receiver, nullptr);
    if (p.sender == nullptr || p.receiver == nullptr) return p;
    Connect(p.sender, p.receiver->qp_num);
    Connect(p.receiver, p.sender->qp_num);
    return p;
  }

  int PostRecv(ibv_qp* qp, uint64_t wr_id) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf_.data() + 32768), 256, mr_->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad;
    return ibv_post_recv(qp, &wr, &bad);
  }

  // An unsignaled SEND of 16 bytes: only the receiver completes.
  int PostSend(ibv_qp* qp, unsigned flags = 0) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf_.data()), 16, mr_->lkey};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = flags;
    ibv_send_wr* bad;
    return ibv_post_send(qp, &wr, &bad);
  }

  // Polls until one completion arrives (or 5 s pass).
  bool PollOne(ibv_cq* cq, ibv_wc* wc) {
    auto until = Clock::now() + 5s;
    while (Clock::now() < until) {
      int n = ibv_poll_cq(cq, 1, wc);
      if (n == 1) return true;
      if (n < 0) return false;
    }
    return false;
  }

  // Gets one completion event, waiting at most 5 s for it.
  bool GetCqEvent(ibv_cq** cq, void** cq_context) {
    return PollReadable(ch_->fd, 5000) && ibv_get_cq_event(ch_, cq, cq_context) == 0;
  }

  bool GetAsyncEvent(ibv_async_event* ev) {
    return PollReadable(ctx_->async_fd, 5000) && ibv_get_async_event(ctx_, ev) == 0;
  }

  int Raise(ibv_event_type type, ibv_qp* qp = nullptr, ibv_cq* cq = nullptr, ibv_srq* srq = nullptr,
            int port = 0) {
    ibv_async_event ev{};
    ev.event_type = type;
    if (qp != nullptr) ev.element.qp = qp;
    if (cq != nullptr) ev.element.cq = cq;
    if (srq != nullptr) ev.element.srq = srq;
    if (port != 0) ev.element.port_num = port;
    return rdmaemu_raise_async_event(ctx_, &ev);
  }

  // Removes `qp` from the QPs TearDown destroys (the test destroyed it).
  void Forget(ibv_qp* qp) { std::erase(qps_, qp); }
  void Forget(ibv_srq* srq) { std::erase(srqs_, srq); }
  void Forget(ibv_cq* cq) { std::erase(cqs_, cq); }

  int tag_ = 0;
  ibv_device** list_ = nullptr;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_mr* mr_ = nullptr;
  ibv_gid gid_{};
  std::vector<uint8_t> buf_;
  ibv_comp_channel* ch_ = nullptr;
  ibv_cq* send_cq_ = nullptr;
  ibv_cq* recv_cq_ = nullptr;
  std::vector<ibv_cq*> cqs_;
  std::vector<ibv_srq*> srqs_;
  std::vector<ibv_qp*> qps_;
};

// --- item 1: completion channels ---------------------------------------------

TEST_F(EventSemanticsTest, ChannelFdAndAsyncFdAreEventfds) {
  EXPECT_EQ(FdTarget(ch_->fd), "anon_inode:[eventfd]");
  EXPECT_EQ(FdTarget(ctx_->async_fd), "anon_inode:[eventfd]");
  // Semaphore mode: each read takes one count, so one event per get.
  EXPECT_EQ(FdInfo(ch_->fd, "eventfd-semaphore"), 1);
  EXPECT_EQ(FdInfo(ctx_->async_fd, "eventfd-semaphore"), 1);
  EXPECT_EQ(EventfdCount(ch_->fd), 0);
  EXPECT_FALSE(::fcntl(ch_->fd, F_GETFL) & O_NONBLOCK) << "blocking until the application says otherwise";
  EXPECT_FALSE(::fcntl(ctx_->async_fd, F_GETFL) & O_NONBLOCK);
}

// ibv_get_cq_event(3), first example: arm, wait (blocking), ack, re-arm, empty
// the CQ; repeated for a stream of messages sent by another thread.
TEST_F(EventSemanticsTest, ManPageBlockingFlow) {
  ibv_cq* cq = NewCq(&tag_, ch_, 1);  // the man page's ibv_create_cq(ctx, 1, ev_ctx, channel, 0)
  ASSERT_NE(cq, nullptr);
  Pair p = NewPair(cq);
  constexpr int kMessages = 20;
  ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);  // before any completion can be created

  std::atomic<int> received{0};
  std::atomic<bool> stop{false};
  std::thread sender([&] {
    // One message at a time, each a little after the receiver has taken the
    // previous one and gone back into ibv_get_cq_event, which must then block.
    for (int i = 0; i < kMessages && !stop; ++i) {
      while (received < i && !stop) std::this_thread::sleep_for(1ms);
      std::this_thread::sleep_for(5ms);
      if (PostRecv(p.receiver, i) != 0 || PostSend(p.sender) != 0) break;
    }
  });
  while (received < kMessages) {
    ibv_cq* ev_cq = nullptr;
    void* ev_ctx = nullptr;
    ASSERT_EQ(ibv_get_cq_event(ch_, &ev_cq, &ev_ctx), 0) << std::strerror(errno);  // blocks
    EXPECT_EQ(ev_cq, cq);
    EXPECT_EQ(ev_ctx, &tag_);
    ibv_ack_cq_events(ev_cq, 1);
    ASSERT_EQ(ibv_req_notify_cq(ev_cq, 0), 0);
    ibv_wc wc;
    int ne;
    do {
      ne = ibv_poll_cq(cq, 1, &wc);
      ASSERT_GE(ne, 0);
      if (ne == 0) continue;  // an extra event may have no completion
      EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
      EXPECT_EQ(wc.wr_id, static_cast<uint64_t>(received));
      ++received;
    } while (ne);
  }
  stop = true;
  sender.join();
  EXPECT_EQ(received, kMessages);
}

// ibv_get_cq_event(3), second example: O_NONBLOCK through fcntl, poll the
// channel until it has an event, get it, ack it.
TEST_F(EventSemanticsTest, ManPageNonBlockingFlow) {
  Pair p = NewPair(recv_cq_);
  int flags = ::fcntl(ch_->fd, F_GETFL);
  ASSERT_EQ(::fcntl(ch_->fd, F_SETFL, flags | O_NONBLOCK), 0);
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  errno = 0;
  EXPECT_EQ(ibv_get_cq_event(ch_, &ev_cq, &ev_ctx), -1) << "no event queued";
  EXPECT_EQ(errno, EAGAIN);

  ASSERT_EQ(ibv_req_notify_cq(recv_cq_, 0), 0);
  ASSERT_EQ(PostRecv(p.receiver, 5), 0);
  ASSERT_EQ(PostSend(p.sender), 0);
  pollfd my_pollfd{ch_->fd, POLLIN, 0};
  int rc;
  int rounds = 0;
  do {
    rc = ::poll(&my_pollfd, 1, 10);  // ms_timeout
  } while (rc == 0 && ++rounds < 500);
  ASSERT_EQ(rc, 1);
  ASSERT_EQ(ibv_get_cq_event(ch_, &ev_cq, &ev_ctx), 0);
  EXPECT_EQ(ev_cq, recv_cq_);
  EXPECT_EQ(ev_ctx, &tag_);
  ibv_ack_cq_events(ev_cq, 1);
  errno = 0;
  EXPECT_EQ(ibv_get_cq_event(ch_, &ev_cq, &ev_ctx), -1) << "the one event was taken";
  EXPECT_EQ(errno, EAGAIN);
  ibv_wc wc;
  ASSERT_EQ(ibv_poll_cq(recv_cq_, 1, &wc), 1);
  EXPECT_EQ(wc.wr_id, 5u);
}

TEST_F(EventSemanticsTest, PollSelectAndEpollReportReadinessExactlyWhileAnEventIsQueued) {
  ibv_cq* second = NewCq(nullptr, ch_);
  ASSERT_NE(second, nullptr);
  Pair p1 = NewPair(recv_cq_);
  Pair p2 = NewPair(second);
  Epoll ep(ch_->fd);
  ASSERT_TRUE(ep.ok());
  ExpectReadiness(ch_->fd, ep, false, "nothing queued");

  ASSERT_EQ(ibv_req_notify_cq(recv_cq_, 0), 0);
  ASSERT_EQ(ibv_req_notify_cq(second, 0), 0);
  ASSERT_EQ(PostRecv(p1.receiver, 1), 0);
  ASSERT_EQ(PostRecv(p2.receiver, 2), 0);
  ASSERT_EQ(PostSend(p1.sender), 0);
  ASSERT_EQ(PostSend(p2.sender), 0);
  ibv_wc wc;
  ASSERT_TRUE(PollOne(recv_cq_, &wc));
  ASSERT_TRUE(PollOne(second, &wc));
  ASSERT_TRUE(PollReadable(ch_->fd, 5000));
  ExpectReadiness(ch_->fd, ep, true, "two events queued");

  ibv_cq* ev_cq;
  void* ev_ctx;
  ASSERT_EQ(ibv_get_cq_event(ch_, &ev_cq, &ev_ctx), 0);
  ibv_ack_cq_events(ev_cq, 1);
  // The second event may still be on its way from the engine thread.
  ASSERT_TRUE(PollReadable(ch_->fd, 5000));
  ExpectReadiness(ch_->fd, ep, true, "one event still queued");
  ASSERT_EQ(ibv_get_cq_event(ch_, &ev_cq, &ev_ctx), 0);
  ibv_ack_cq_events(ev_cq, 1);
  ExpectReadiness(ch_->fd, ep, false, "both events taken");
}

TEST_F(EventSemanticsTest, EachCompletionEventGoesToExactlyOneOfSeveralWaitingThreads) {
  constexpr int kThreads = 6;
  std::vector<ibv_cq*> cqs;
  std::vector<Pair> pairs;
  for (int i = 0; i < kThreads; ++i) {
    cqs.push_back(NewCq(nullptr, ch_));
    ASSERT_NE(cqs.back(), nullptr);
    pairs.push_back(NewPair(cqs.back()));
  }
  std::mutex mu;
  std::map<ibv_cq*, int> got;  // events per CQ
  std::atomic<int> returned{0};
  std::vector<std::thread> waiters;
  for (int t = 0; t < kThreads; ++t) {
    waiters.emplace_back([&] {
      ibv_cq* ev_cq = nullptr;
      void* ev_ctx = nullptr;
      if (ibv_get_cq_event(ch_, &ev_cq, &ev_ctx) != 0) {
        ADD_FAILURE() << "ibv_get_cq_event: " << std::strerror(errno);
      } else {
        std::lock_guard lock(mu);
        ++got[ev_cq];
      }
      ++returned;
    });
  }
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(returned, 0) << "a waiter returned with nothing queued";
  for (int i = 0; i < kThreads; ++i) {
    ASSERT_EQ(ibv_req_notify_cq(cqs[i], 0), 0);
    ASSERT_EQ(PostRecv(pairs[i].receiver, i), 0);
    ASSERT_EQ(PostSend(pairs[i].sender), 0);
  }
  auto until = Clock::now() + 10s;
  while (returned < kThreads && Clock::now() < until) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(returned, kThreads) << "an event reached no waiter (or two events one waiter)";
  // Release any waiter left behind so the test ends: one more event each.
  int stuck = kThreads - returned;
  for (int i = 0; i < stuck; ++i) {
    ASSERT_EQ(ibv_req_notify_cq(cqs[i], 0), 0);
    ASSERT_EQ(PostRecv(pairs[i].receiver, 100), 0);
    ASSERT_EQ(PostSend(pairs[i].sender), 0);
  }
  for (auto& t : waiters) t.join();
  EXPECT_EQ(got.size(), static_cast<size_t>(kThreads)) << "each CQ's event went to one waiter";
  for (auto& [cq, n] : got) {
    EXPECT_EQ(n, 1) << "CQ " << cq << " delivered " << n << " times";
    ibv_ack_cq_events(cq, n);
  }
  EXPECT_FALSE(PollReadable(ch_->fd, 50));
  ibv_wc wc;
  for (ibv_cq* cq : cqs) EXPECT_TRUE(PollOne(cq, &wc));
}

TEST_F(EventSemanticsTest, ReqNotifyArmsOneEventForTheNextCompletion) {
  Pair p = NewPair(recv_cq_);
  ibv_wc wc;
  // Not armed: a completion raises no event.
  ASSERT_EQ(PostRecv(p.receiver, 1), 0);
  ASSERT_EQ(PostSend(p.sender), 0);
  ASSERT_TRUE(PollOne(recv_cq_, &wc));
  EXPECT_FALSE(PollReadable(ch_->fd, 100)) << "an event without ibv_req_notify_cq";

  // Armed once: three completions, one event.
  ASSERT_EQ(ibv_req_notify_cq(recv_cq_, 0), 0);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(PostRecv(p.receiver, 10 + i), 0);
    ASSERT_EQ(PostSend(p.sender), 0);
  }
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(PollOne(recv_cq_, &wc));
    EXPECT_EQ(wc.wr_id, static_cast<uint64_t>(10 + i));
  }
  ibv_cq* ev_cq;
  void* ev_ctx;
  ASSERT_TRUE(GetCqEvent(&ev_cq, &ev_ctx));
  EXPECT_EQ(ev_cq, recv_cq_);
  ibv_ack_cq_events(ev_cq, 1);
  EXPECT_FALSE(PollReadable(ch_->fd, 100)) << "one arm gave more than one event";

  // Re-armed: the next completion gives the next event.
  ASSERT_EQ(ibv_req_notify_cq(recv_cq_, 0), 0);
  ASSERT_EQ(PostRecv(p.receiver, 20), 0);
  ASSERT_EQ(PostSend(p.sender), 0);
  ASSERT_TRUE(GetCqEvent(&ev_cq, &ev_ctx));
  ibv_ack_cq_events(ev_cq, 1);
  ASSERT_TRUE(PollOne(recv_cq_, &wc));
  EXPECT_EQ(wc.wr_id, 20u);
}

TEST_F(EventSemanticsTest, SolicitedOnlyArmWaitsForASolicitedSend) {
  Pair p = NewPair(recv_cq_);
  ASSERT_EQ(ibv_req_notify_cq(recv_cq_, 1), 0);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(PostRecv(p.receiver, i), 0);
    ASSERT_EQ(PostSend(p.sender), 0);  // unsolicited
  }
  ibv_wc wc;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(PollOne(recv_cq_, &wc));
  EXPECT_FALSE(PollReadable(ch_->fd, 100)) << "an unsolicited SEND fired a solicited-only arm";

  ASSERT_EQ(PostRecv(p.receiver, 7), 0);
  ASSERT_EQ(PostSend(p.sender, IBV_SEND_SOLICITED), 0);
  ibv_cq* ev_cq;
  void* ev_ctx;
  ASSERT_TRUE(GetCqEvent(&ev_cq, &ev_ctx)) << "the solicited SEND fired no event";
  EXPECT_EQ(ev_cq, recv_cq_);
  ibv_ack_cq_events(ev_cq, 1);
  ASSERT_TRUE(PollOne(recv_cq_, &wc));
  EXPECT_EQ(wc.wr_id, 7u);

  // One-shot here too: a second solicited SEND needs a new arm.
  ASSERT_EQ(PostRecv(p.receiver, 8), 0);
  ASSERT_EQ(PostSend(p.sender, IBV_SEND_SOLICITED), 0);
  ASSERT_TRUE(PollOne(recv_cq_, &wc));
  EXPECT_FALSE(PollReadable(ch_->fd, 100));

  // Arming for any completion: an unsolicited SEND fires it.
  ASSERT_EQ(ibv_req_notify_cq(recv_cq_, 0), 0);
  ASSERT_EQ(PostRecv(p.receiver, 9), 0);
  ASSERT_EQ(PostSend(p.sender), 0);
  ASSERT_TRUE(GetCqEvent(&ev_cq, &ev_ctx));
  ibv_ack_cq_events(ev_cq, 1);
}

// The event is queued only after its completion is in the CQ: the poll right
// after the event never comes back empty (the man page's extra events come
// from completions polled between re-arm and poll, which this loop avoids).
TEST_F(EventSemanticsTest, NoEventBeforeItsCompletionIsVisibleToPollCq) {
  Pair p = NewPair(recv_cq_);
  constexpr int kRounds = 200;
  int empty = 0;
  for (int i = 0; i < kRounds; ++i) {
    ASSERT_EQ(PostRecv(p.receiver, i), 0);
    ASSERT_EQ(ibv_req_notify_cq(recv_cq_, 0), 0);
    ASSERT_EQ(PostSend(p.sender), 0);
    ibv_cq* ev_cq;
    void* ev_ctx;
    ASSERT_EQ(ibv_get_cq_event(ch_, &ev_cq, &ev_ctx), 0);
    ibv_ack_cq_events(ev_cq, 1);
    ibv_wc wc;
    int n = ibv_poll_cq(recv_cq_, 1, &wc);  // once, no retry
    if (n != 1) {
      ++empty;
      ASSERT_TRUE(PollOne(recv_cq_, &wc));
    }
    EXPECT_EQ(wc.wr_id, static_cast<uint64_t>(i));
  }
  EXPECT_EQ(empty, 0) << empty << " of " << kRounds << " events came before their completion";
}

TEST_F(EventSemanticsTest, ManyCqsOnOneChannelEachEventNamesItsCq) {
  constexpr int kCqs = 8;
  int tags[kCqs];
  std::vector<ibv_cq*> cqs;
  std::vector<Pair> pairs;
  for (int i = 0; i < kCqs; ++i) {
    cqs.push_back(NewCq(&tags[i], ch_));
    ASSERT_NE(cqs.back(), nullptr);
    pairs.push_back(NewPair(cqs.back()));
    ASSERT_EQ(ibv_req_notify_cq(cqs[i], 0), 0);
  }
  EXPECT_EQ(ch_->refcnt, kCqs + 1) << "the fixture's recv CQ uses the channel too";
  // Messages to every other CQ first, then the rest: events follow completions.
  for (int i : {0, 2, 4, 6, 1, 3, 5, 7}) {
    ASSERT_EQ(PostRecv(pairs[i].receiver, i), 0);
    ASSERT_EQ(PostSend(pairs[i].sender), 0);
  }
  std::map<ibv_cq*, int> seen;
  for (int n = 0; n < kCqs; ++n) {
    ibv_cq* ev_cq = nullptr;
    void* ev_ctx = nullptr;
    ASSERT_TRUE(GetCqEvent(&ev_cq, &ev_ctx));
    auto it = std::find(cqs.begin(), cqs.end(), ev_cq);
    ASSERT_NE(it, cqs.end()) << "the event names a CQ that is not on the channel";
    size_t index = static_cast<size_t>(it - cqs.begin());
    EXPECT_EQ(ev_ctx, &tags[index]) << "cq_context of CQ " << index;
    ++seen[ev_cq];
    ibv_wc wc;
    ASSERT_TRUE(PollOne(ev_cq, &wc));
    EXPECT_EQ(wc.wr_id, index) << "the CQ named has the completion";
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(kCqs));
  for (auto& [cq, n] : seen) ibv_ack_cq_events(cq, n);  // batched, one call per CQ
  EXPECT_FALSE(PollReadable(ch_->fd, 50));
}

TEST_F(EventSemanticsTest, DestroyCompChannelIsBusyWhileAnyCqUsesIt) {
  ibv_comp_channel* ch = ibv_create_comp_channel(ctx_);
  ASSERT_NE(ch, nullptr);
  ibv_cq* a = ibv_create_cq(ctx_, 4, nullptr, ch, 0);
  ibv_cq* b = ibv_create_cq(ctx_, 4, nullptr, ch, 0);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(ibv_destroy_comp_channel(ch), EBUSY);
  EXPECT_EQ(ibv_destroy_cq(a), 0);
  EXPECT_EQ(ibv_destroy_comp_channel(ch), EBUSY) << "one CQ still uses it";
  EXPECT_EQ(ch->refcnt, 1);
  EXPECT_EQ(ibv_destroy_cq(b), 0);
  EXPECT_EQ(ibv_destroy_comp_channel(ch), 0);
}

// --- item 2: the async queue ---------------------------------------------------

// The blocking loop of ibv_asyncwatch: a thread sleeps in ibv_get_async_event
// until the port goes down.
TEST_F(EventSemanticsTest, AsyncBlockingFlow) {
  std::atomic<bool> got{false};
  ibv_async_event ev{};
  int rc = -1;
  BlockingCall reader([&] {
    rc = ibv_get_async_event(ctx_, &ev);
    got = true;
    return rc;
  });
  ASSERT_TRUE(reader.Blocked()) << "ibv_get_async_event returned with nothing queued";
  Clock::time_point raised = Clock::now();
  ASSERT_EQ(rdmaemu_set_port_state(ctx_, 1, IBV_PORT_DOWN), 0);
  auto latency = reader.ReturnedAfter(raised);
  ASSERT_GE(latency.count(), 0);
  EXPECT_LT(latency, kPrompt);
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_PORT_ERR);
  EXPECT_EQ(ev.element.port_num, 1);
  ibv_ack_async_event(&ev);
  ASSERT_EQ(rdmaemu_set_port_state(ctx_, 1, IBV_PORT_ACTIVE), 0);
  ASSERT_EQ(ibv_get_async_event(ctx_, &ev), 0);  // queued: returns at once
  EXPECT_EQ(ev.event_type, IBV_EVENT_PORT_ACTIVE);
  ibv_ack_async_event(&ev);
}

// ibv_get_async_event(3)'s example: O_NONBLOCK through fcntl, poll, get, ack.
TEST_F(EventSemanticsTest, AsyncManPageNonBlockingFlow) {
  Pair p = NewPair(recv_cq_);
  int flags = ::fcntl(ctx_->async_fd, F_GETFL);
  ASSERT_EQ(::fcntl(ctx_->async_fd, F_SETFL, flags | O_NONBLOCK), 0);
  ibv_async_event async_event;
  errno = 0;
  EXPECT_EQ(ibv_get_async_event(ctx_, &async_event), -1);
  EXPECT_EQ(errno, EAGAIN);

  std::thread cause([&] {
    std::this_thread::sleep_for(20ms);
    Raise(IBV_EVENT_QP_FATAL, p.receiver);
  });
  pollfd my_pollfd{ctx_->async_fd, POLLIN, 0};
  int rc;
  int rounds = 0;
  do {
    rc = ::poll(&my_pollfd, 1, 10);
  } while (rc == 0 && ++rounds < 500);
  cause.join();
  ASSERT_EQ(rc, 1);
  ASSERT_EQ(ibv_get_async_event(ctx_, &async_event), 0);
  EXPECT_EQ(async_event.event_type, IBV_EVENT_QP_FATAL);
  EXPECT_EQ(async_event.element.qp, p.receiver) << "the exact pointer the application holds";
  ibv_ack_async_event(&async_event);
  errno = 0;
  EXPECT_EQ(ibv_get_async_event(ctx_, &async_event), -1);
  EXPECT_EQ(errno, EAGAIN);
}

TEST_F(EventSemanticsTest, AsyncFdReadinessExactlyWhileAnEventIsQueued) {
  Epoll ep(ctx_->async_fd);
  ASSERT_TRUE(ep.ok());
  ExpectReadiness(ctx_->async_fd, ep, false, "nothing queued");
  ASSERT_EQ(Raise(IBV_EVENT_GID_CHANGE, nullptr, nullptr, nullptr, 1), 0);
  ASSERT_EQ(Raise(IBV_EVENT_CQ_ERR, nullptr, recv_cq_), 0);
  ExpectReadiness(ctx_->async_fd, ep, true, "two events queued");
  ibv_async_event ev;
  ASSERT_EQ(ibv_get_async_event(ctx_, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_GID_CHANGE);
  ibv_ack_async_event(&ev);
  ExpectReadiness(ctx_->async_fd, ep, true, "one event queued");
  ASSERT_EQ(ibv_get_async_event(ctx_, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_CQ_ERR);
  EXPECT_EQ(ev.element.cq, recv_cq_);
  ibv_ack_async_event(&ev);
  ExpectReadiness(ctx_->async_fd, ep, false, "both taken");
}

TEST_F(EventSemanticsTest, EachAsyncEventGoesToExactlyOneOfSeveralWaitingThreads) {
  const std::vector<ibv_event_type> types = {IBV_EVENT_GID_CHANGE, IBV_EVENT_LID_CHANGE,
                                             IBV_EVENT_PKEY_CHANGE, IBV_EVENT_SM_CHANGE,
                                             IBV_EVENT_CLIENT_REREGISTER, IBV_EVENT_PORT_ACTIVE};
  const int n = static_cast<int>(types.size());
  std::mutex mu;
  std::multiset<int> got;
  std::atomic<int> returned{0};
  std::vector<std::thread> waiters;
  for (int t = 0; t < n; ++t) {
    waiters.emplace_back([&] {
      ibv_async_event ev{};
      if (ibv_get_async_event(ctx_, &ev) != 0) {
        ADD_FAILURE() << "ibv_get_async_event: " << std::strerror(errno);
      } else {
        std::lock_guard lock(mu);
        got.insert(ev.event_type);
        ibv_ack_async_event(&ev);
      }
      ++returned;
    });
  }
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(returned, 0) << "a waiter returned with nothing queued";
  for (ibv_event_type t : types) ASSERT_EQ(Raise(t, nullptr, nullptr, nullptr, 1), 0);
  auto until = Clock::now() + 10s;
  while (returned < n && Clock::now() < until) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(returned, n) << "an event reached no waiter (or two events one waiter)";
  for (int i = returned; i < n; ++i) Raise(IBV_EVENT_PORT_ACTIVE, nullptr, nullptr, nullptr, 1);
  for (auto& t : waiters) t.join();
  std::multiset<int> want(types.begin(), types.end());
  EXPECT_EQ(got, want) << "each event exactly once";
  EXPECT_FALSE(PollReadable(ctx_->async_fd, 50));
}

// --- item 3: destroy waits for acknowledgement --------------------------------

TEST_F(EventSemanticsTest, DestroyCqWaitsForEveryCompletionEventAckBatchedOrNot) {
  ibv_cq* cq = NewCq(nullptr, ch_);
  ASSERT_NE(cq, nullptr);
  Pair p = NewPair(cq);
  ibv_cq* ev_cq;
  void* ev_ctx;
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
    ASSERT_EQ(PostRecv(p.receiver, i), 0);
    ASSERT_EQ(PostSend(p.sender), 0);
    ASSERT_TRUE(GetCqEvent(&ev_cq, &ev_ctx));
    ibv_wc wc;
    ASSERT_TRUE(PollOne(cq, &wc));
  }
  // The QPs go first (a CQ in use is busy); three events read, none acked.
  for (ibv_qp* qp : {p.sender, p.receiver}) {
    ASSERT_EQ(ibv_destroy_qp(qp), 0);
    Forget(qp);
  }
  ExpectDestroyWaitsFor([cq] { return ibv_destroy_cq(cq); },
                        {[cq] { ibv_ack_cq_events(cq, 2); }, [cq] { ibv_ack_cq_events(cq, 1); }});
  Forget(cq);
}

TEST_F(EventSemanticsTest, DestroyCqWaitsForItsCompletionAndAsyncEvents) {
  ibv_cq* cq = NewCq(nullptr, ch_);
  ASSERT_NE(cq, nullptr);
  Pair p = NewPair(cq);
  ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
  ASSERT_EQ(PostRecv(p.receiver, 1), 0);
  ASSERT_EQ(PostSend(p.sender), 0);
  ibv_cq* ev_cq;
  void* ev_ctx;
  ASSERT_TRUE(GetCqEvent(&ev_cq, &ev_ctx));
  ASSERT_EQ(Raise(IBV_EVENT_CQ_ERR, nullptr, cq), 0);
  ibv_async_event ev;
  ASSERT_TRUE(GetAsyncEvent(&ev));
  ASSERT_EQ(ev.element.cq, cq);
  for (ibv_qp* qp : {p.sender, p.receiver}) {
    ASSERT_EQ(ibv_destroy_qp(qp), 0);
    Forget(qp);
  }
  ExpectDestroyWaitsFor([cq] { return ibv_destroy_cq(cq); },
                        {[cq] { ibv_ack_cq_events(cq, 1); }, [&ev] { ibv_ack_async_event(&ev); }});
  Forget(cq);
}

TEST_F(EventSemanticsTest, DestroyQpWaitsForEveryEventReadForIt) {
  Pair p = NewPair(recv_cq_);
  ASSERT_EQ(Raise(IBV_EVENT_QP_FATAL, p.receiver), 0);
  ASSERT_EQ(Raise(IBV_EVENT_PATH_MIG, p.receiver), 0);
  ASSERT_EQ(Raise(IBV_EVENT_QP_FATAL, p.sender), 0);  // another QP's: not waited for
  ibv_async_event e1, e2, other;
  ASSERT_TRUE(GetAsyncEvent(&e1));
  ASSERT_TRUE(GetAsyncEvent(&e2));
  ASSERT_TRUE(GetAsyncEvent(&other));
  ASSERT_EQ(e1.element.qp, p.receiver);
  ASSERT_EQ(e2.element.qp, p.receiver);
  ibv_qp* qp = p.receiver;
  ExpectDestroyWaitsFor([qp] { return ibv_destroy_qp(qp); },
                        {[&e2] { ibv_ack_async_event(&e2); }, [&e1] { ibv_ack_async_event(&e1); }});
  Forget(qp);
  ibv_ack_async_event(&other);
}

TEST_F(EventSemanticsTest, DestroySrqWaitsForEveryEventReadForIt) {
  ibv_srq* srq = NewSrq();
  ASSERT_NE(srq, nullptr);
  ASSERT_EQ(Raise(IBV_EVENT_SRQ_ERR, nullptr, nullptr, srq), 0);
  ASSERT_EQ(Raise(IBV_EVENT_SRQ_LIMIT_REACHED, nullptr, nullptr, srq), 0);
  ibv_async_event e1, e2;
  ASSERT_TRUE(GetAsyncEvent(&e1));
  ASSERT_TRUE(GetAsyncEvent(&e2));
  ASSERT_EQ(e1.element.srq, srq);
  ASSERT_EQ(e2.element.srq, srq);
  ExpectDestroyWaitsFor([srq] { return ibv_destroy_srq(srq); },
                        {[&e1] { ibv_ack_async_event(&e1); }, [&e2] { ibv_ack_async_event(&e2); }});
  Forget(srq);
}

TEST_F(EventSemanticsTest, UnreadCompletionEventsAreDiscardedAtDestroyAndTheFdCountTakenBack) {
  ibv_cq* cq = NewCq(nullptr, ch_);
  ASSERT_NE(cq, nullptr);
  Pair p = NewPair(cq);
  Pair keep = NewPair(recv_cq_);
  Epoll ep(ch_->fd);
  ASSERT_TRUE(ep.ok());
  ibv_wc wc;
  // Two unread events for `cq`, one for the fixture's CQ queued between them.
  ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
  ASSERT_EQ(PostRecv(p.receiver, 1), 0);
  ASSERT_EQ(PostSend(p.sender), 0);
  ASSERT_TRUE(PollOne(cq, &wc));
  ASSERT_EQ(ibv_req_notify_cq(recv_cq_, 0), 0);
  ASSERT_EQ(PostRecv(keep.receiver, 2), 0);
  ASSERT_EQ(PostSend(keep.sender), 0);
  ASSERT_TRUE(PollOne(recv_cq_, &wc));
  ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
  ASSERT_EQ(PostRecv(p.receiver, 3), 0);
  ASSERT_EQ(PostSend(p.sender), 0);
  ASSERT_TRUE(PollOne(cq, &wc));
  for (ibv_qp* qp : {p.sender, p.receiver}) {
    ASSERT_EQ(ibv_destroy_qp(qp), 0);
    Forget(qp);
  }
  // All three events are queued (none taken) before the destroy.
  ASSERT_TRUE(WaitForCount(ch_->fd, 3)) << "eventfd-count " << EventfdCount(ch_->fd);
  ExpectDestroyReturnsAtOnce([cq] { return ibv_destroy_cq(cq); });
  Forget(cq);
  EXPECT_EQ(EventfdCount(ch_->fd), 1) << "the fd counter equals the events still queued";
  ExpectReadiness(ch_->fd, ep, true, "the other CQ's event stays");
  ibv_cq* ev_cq;
  void* ev_ctx;
  ASSERT_EQ(ibv_get_cq_event(ch_, &ev_cq, &ev_ctx), 0);
  EXPECT_EQ(ev_cq, recv_cq_) << "the discarded CQ's events never come out";
  ibv_ack_cq_events(ev_cq, 1);
  ExpectReadiness(ch_->fd, ep, false, "the discarded events' counts were taken back");
  SetNonBlocking(ch_->fd);
  errno = 0;
  EXPECT_EQ(ibv_get_cq_event(ch_, &ev_cq, &ev_ctx), -1);
  EXPECT_EQ(errno, EAGAIN);
}

TEST_F(EventSemanticsTest, UnreadAsyncEventsAreDiscardedAtDestroyOnlyReadOnesAreWaitedFor) {
  Pair p = NewPair(recv_cq_);
  ibv_srq* srq = NewSrq();
  ASSERT_NE(srq, nullptr);
  Epoll ep(ctx_->async_fd);
  ASSERT_TRUE(ep.ok());
  ASSERT_EQ(Raise(IBV_EVENT_QP_FATAL, p.receiver), 0);       // read, must be acked
  ASSERT_EQ(Raise(IBV_EVENT_COMM_EST, p.receiver), 0);       // never read
  ASSERT_EQ(Raise(IBV_EVENT_SRQ_LIMIT_REACHED, nullptr, nullptr, srq), 0);  // never read
  ASSERT_EQ(Raise(IBV_EVENT_PORT_ACTIVE, nullptr, nullptr, nullptr, 1), 0);  // stays
  ASSERT_EQ(Raise(IBV_EVENT_QP_REQ_ERR, p.receiver), 0);     // never read
  ASSERT_EQ(Raise(IBV_EVENT_CQ_ERR, nullptr, recv_cq_), 0);  // stays
  ibv_async_event read;
  ASSERT_TRUE(GetAsyncEvent(&read));
  ASSERT_EQ(read.event_type, IBV_EVENT_QP_FATAL);

  ibv_qp* qp = p.receiver;
  EXPECT_EQ(EventfdCount(ctx_->async_fd), 5);
  ExpectDestroyWaitsFor([qp] { return ibv_destroy_qp(qp); }, {[&read] { ibv_ack_async_event(&read); }});
  Forget(qp);
  EXPECT_EQ(EventfdCount(ctx_->async_fd), 3) << "the QP's two unread events were taken back";
  ExpectDestroyReturnsAtOnce([srq] { return ibv_destroy_srq(srq); });
  Forget(srq);
  EXPECT_EQ(EventfdCount(ctx_->async_fd), 2);

  ibv_async_event ev;
  ASSERT_EQ(ibv_get_async_event(ctx_, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_PORT_ACTIVE);
  ibv_ack_async_event(&ev);
  ASSERT_EQ(ibv_get_async_event(ctx_, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_CQ_ERR);
  ibv_ack_async_event(&ev);
  ExpectReadiness(ctx_->async_fd, ep, false, "the discarded events' counts were taken back");
  SetNonBlocking(ctx_->async_fd);
  errno = 0;
  EXPECT_EQ(ibv_get_async_event(ctx_, &ev), -1);
  EXPECT_EQ(errno, EAGAIN);
}

// After a second, once: which object, how many unacknowledged events.
TEST_F(EventSemanticsTest, AWaitingDestroyLogsOnceAfterASecondNamingTheObjectAndCount) {
  Pair p = NewPair(recv_cq_);
  ASSERT_EQ(Raise(IBV_EVENT_QP_FATAL, p.receiver), 0);
  ASSERT_EQ(Raise(IBV_EVENT_QP_REQ_ERR, p.receiver), 0);
  ibv_async_event e1, e2;
  ASSERT_TRUE(GetAsyncEvent(&e1));
  ASSERT_TRUE(GetAsyncEvent(&e2));
  ibv_qp* qp = p.receiver;
  const std::string name = PointerText(qp);
  std::string early, late, final_log;
  std::chrono::milliseconds blocked_for{0};
  {
    StderrFile log;
    Clock::time_point start = Clock::now();
    BlockingCall destroy([qp] { return ibv_destroy_qp(qp); });
    EXPECT_TRUE(destroy.Blocked(100ms));
    std::this_thread::sleep_until(start + 600ms);
    early = log.Read();
    std::this_thread::sleep_until(start + 1500ms);
    ibv_ack_async_event(&e1);  // one of two: the count logged stays 2
    std::this_thread::sleep_until(start + 2600ms);
    late = log.Read();
    EXPECT_FALSE(destroy.done());
    ibv_ack_async_event(&e2);
    EXPECT_GE(destroy.ReturnedAfter(start).count(), 0);
    blocked_for = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    EXPECT_EQ(destroy.rc(), 0);
    final_log = log.Read();
  }
  Forget(qp);
  EXPECT_EQ(Count(early, "unacknowledged"), 0u) << "logged before a second: " << early;
  EXPECT_EQ(Count(late, "unacknowledged"), 1u) << "once, after a second: " << late;
  EXPECT_NE(late.find("qp " + name), std::string::npos) << "names the QP " << name << ": " << late;
  EXPECT_NE(late.find("2 unacknowledged"), std::string::npos) << "names the count: " << late;
  EXPECT_EQ(Count(final_log, "unacknowledged"), 1u) << final_log;
  EXPECT_GE(blocked_for, 2600ms);
}

TEST_F(EventSemanticsTest, AWaitingSrqAndCqDestroyLogTheirObjectToo) {
  ibv_srq* srq = NewSrq();
  ASSERT_NE(srq, nullptr);
  ibv_cq* cq = NewCq(nullptr, ch_);
  ASSERT_NE(cq, nullptr);
  ASSERT_EQ(Raise(IBV_EVENT_SRQ_ERR, nullptr, nullptr, srq), 0);
  ASSERT_EQ(Raise(IBV_EVENT_CQ_ERR, nullptr, cq), 0);
  ibv_async_event es, ec;
  ASSERT_TRUE(GetAsyncEvent(&es));
  ASSERT_TRUE(GetAsyncEvent(&ec));
  std::string text;
  {
    StderrFile log;
    BlockingCall d1([srq] { return ibv_destroy_srq(srq); });
    BlockingCall d2([cq] { return ibv_destroy_cq(cq); });
    Clock::time_point start = Clock::now();
    auto until = start + 5s;
    while (Count(log.Read(), "unacknowledged") < 2 && Clock::now() < until) {
      std::this_thread::sleep_for(10ms);
    }
    EXPECT_GE(Clock::now() - start, 900ms) << "logged before a second";
    text = log.Read();
    ibv_ack_async_event(&es);
    ibv_ack_async_event(&ec);
    EXPECT_GE(d1.ReturnedAfter(start).count(), 0);
    EXPECT_GE(d2.ReturnedAfter(start).count(), 0);
  }
  Forget(srq);
  Forget(cq);
  EXPECT_NE(text.find("srq " + PointerText(srq) + ": destroy is waiting for 1 unacknowledged"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("cq " + PointerText(cq) + ": destroy is waiting for 1 unacknowledged"),
            std::string::npos)
      << text;
}

}  // namespace
