// Work queues and receive indirection tables through the public verbs API:
// create/modify/destroy/post checks, receiving through a UD QP's table,
// flushing on ERR, WQ_FATAL from a CQ overrun reaching ibv_get_async_event,
// ibv_destroy_wq waiting for the acknowledgement, discarded unread events,
// and SRQ_ERR from its cause. Built twice: io_uring and epoll engines.
#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <gtest/gtest.h>
#include <rdmaemu/rdmaemu.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "emulator/control/command.h"
#include "emulator/engine/rss.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kQkey = 0x11111111;
constexpr size_t kSlot = 256;  // receive buffer per WR: 40-byte GRH area + payload

class WqTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The engine is pinned by RDMAEMU_TEST_ENGINE (as tests/integration's
    // event_semantics does), so a suite-wide RDMAEMU_ENGINE cannot change it.
    static const bool pinned = [] {
      const char* engine = std::getenv("RDMAEMU_TEST_ENGINE");
      return engine != nullptr && ::setenv("RDMAEMU_ENGINE", engine, 1) == 0;
    }();
    ASSERT_TRUE(pinned) << "RDMAEMU_TEST_ENGINE names the engine this binary tests";
    list_ = ibv_get_device_list(nullptr);
    ASSERT_NE(list_, nullptr);
    ctx_ = ibv_open_device(list_[0]);
    ASSERT_NE(ctx_, nullptr);
    pd_ = ibv_alloc_pd(ctx_);
    cq_ = ibv_create_cq(ctx_, 64, nullptr, nullptr, 0);
    ASSERT_TRUE(pd_ && cq_);
    buf_.assign(1 << 16, 0);
    mr_ = ibv_reg_mr(pd_, buf_.data(), buf_.size(), IBV_ACCESS_LOCAL_WRITE);
    ASSERT_NE(mr_, nullptr);
    ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &gid_), 0);
    int flags = fcntl(ctx_->async_fd, F_GETFL);
    fcntl(ctx_->async_fd, F_SETFL, flags | O_NONBLOCK);
    for (size_t i = 0; i < sizeof key_; ++i) key_[i] = static_cast<uint8_t>(i * 37 + 11);
  }
  void TearDown() override {
    for (ibv_qp* qp : qps_) EXPECT_EQ(ibv_destroy_qp(qp), 0);
    for (ibv_rwq_ind_table* t : tables_) EXPECT_EQ(ibv_destroy_rwq_ind_table(t), 0);
    for (ibv_wq* wq : wqs_) EXPECT_EQ(ibv_destroy_wq(wq), 0);
    if (srq_) {
      EXPECT_EQ(ibv_destroy_srq(srq_), 0);
    }
    for (ibv_cq* cq : cqs_) EXPECT_EQ(ibv_destroy_cq(cq), 0);
    if (ah_) {
      EXPECT_EQ(ibv_destroy_ah(ah_), 0);
    }
    EXPECT_EQ(ibv_dereg_mr(mr_), 0);
    EXPECT_EQ(ibv_destroy_cq(cq_), 0);
    EXPECT_EQ(ibv_dealloc_pd(pd_), 0);
    EXPECT_EQ(ibv_close_device(ctx_), 0);
    ibv_free_device_list(list_);
  }

  ibv_cq* NewCq(int cqe) {
    ibv_cq* cq = ibv_create_cq(ctx_, cqe, nullptr, nullptr, 0);
    if (cq) cqs_.push_back(cq);
    return cq;
  }

  ibv_wq_init_attr WqAttr(ibv_cq* cq, uint32_t max_wr = 8) {
    ibv_wq_init_attr a{};
    a.wq_context = this;
    a.wq_type = IBV_WQT_RQ;
    a.max_wr = max_wr;
    a.max_sge = 1;
    a.pd = pd_;
    a.cq = cq;
    return a;
  }

  ibv_wq* NewWq(ibv_cq* cq, uint32_t max_wr = 8) {
    ibv_wq_init_attr a = WqAttr(cq, max_wr);
    ibv_wq* wq = ibv_create_wq(ctx_, &a);
    if (wq) wqs_.push_back(wq);
    return wq;
  }

  int SetState(ibv_wq* wq, ibv_wq_state state) {
    ibv_wq_attr a{};
    a.attr_mask = IBV_WQ_ATTR_STATE;
    a.wq_state = state;
    return ibv_modify_wq(wq, &a);
  }

  ibv_rwq_ind_table* NewTable(std::vector<ibv_wq*> wqs, uint32_t log_size) {
    ibv_rwq_ind_table_init_attr a{};
    a.log_ind_tbl_size = log_size;
    a.ind_tbl = wqs.data();
    ibv_rwq_ind_table* t = ibv_create_rwq_ind_table(ctx_, &a);
    if (t) tables_.push_back(t);
    return t;
  }

  ibv_qp_init_attr_ex RssQpAttr(ibv_rwq_ind_table* table, uint64_t fields) {
    ibv_qp_init_attr_ex a{};
    a.qp_type = IBV_QPT_UD;
    a.send_cq = cq_;
    a.cap.max_send_wr = 4;
    a.cap.max_send_sge = 1;
    a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH;
    a.pd = pd_;
    a.rwq_ind_tbl = table;
    a.rx_hash_conf.rx_hash_function = IBV_RX_HASH_FUNC_TOEPLITZ;
    a.rx_hash_conf.rx_hash_key_len = sizeof key_;
    a.rx_hash_conf.rx_hash_key = key_;
    a.rx_hash_conf.rx_hash_fields_mask = fields;
    return a;
  }

  ibv_qp* NewQp(ibv_qp_init_attr_ex a) {
    ibv_qp* qp = ibv_create_qp_ex(ctx_, &a);
    if (qp) qps_.push_back(qp);
    return qp;
  }

  // A plain UD QP (receiving through `srq` if given, completing into `recv_cq`).
  ibv_qp* NewUd(ibv_cq* recv_cq, ibv_srq* srq = nullptr) {
    ibv_qp_init_attr_ex a{};
    a.qp_type = IBV_QPT_UD;
    a.send_cq = cq_;
    a.recv_cq = recv_cq;
    a.srq = srq;
    a.cap = {8, srq ? 0u : 8u, 1, srq ? 0u : 1u, 0};
    a.comp_mask = IBV_QP_INIT_ATTR_PD;
    a.pd = pd_;
    return NewQp(a);
  }

  void ToRts(ibv_qp* qp) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qkey = kQkey;
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), 0);
    a = {};
    a.qp_state = IBV_QPS_RTR;
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
    a = {};
    a.qp_state = IBV_QPS_RTS;
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
  }

  ibv_recv_wr RecvWr(uint64_t wr_id, ibv_sge* sge) {
    *sge = {reinterpret_cast<uintptr_t>(buf_.data() + 8192 + (wr_id % 128) * kSlot), kSlot, mr_->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = sge;
    wr.num_sge = 1;
    return wr;
  }

  int PostWq(ibv_wq* wq, uint64_t wr_id) {
    ibv_sge sge;
    ibv_recv_wr wr = RecvWr(wr_id, &sge);
    ibv_recv_wr* bad = nullptr;
    return ibv_post_wq_recv(wq, &wr, &bad);
  }

  // Sends `text` from `from` to `qpn` on this context's own GID.
  void Send(ibv_qp* from, uint32_t qpn, const char* text) {
    if (ah_ == nullptr) {
      ibv_ah_attr a{};
      a.is_global = 1;
      a.grh.dgid = gid_;
      a.grh.hop_limit = 1;
      a.port_num = 1;
      ah_ = ibv_create_ah(pd_, &a);
      ASSERT_NE(ah_, nullptr);
    }
    size_t len = std::strlen(text) + 1;
    std::memcpy(buf_.data(), text, len);
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf_.data()), static_cast<uint32_t>(len), mr_->lkey};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.ud.ah = ah_;
    wr.wr.ud.remote_qpn = qpn;
    wr.wr.ud.remote_qkey = kQkey;
    ibv_send_wr* bad;
    ASSERT_EQ(ibv_post_send(from, &wr, &bad), 0);
    auto sent = Drain(cq_, 1);
    ASSERT_EQ(sent.size(), 1u);
    ASSERT_EQ(sent[0].status, IBV_WC_SUCCESS);
  }

  std::vector<ibv_wc> Drain(ibv_cq* cq, size_t want, int ms = 3000) {
    std::vector<ibv_wc> out;
    auto until = Clock::now() + std::chrono::milliseconds(ms);
    while (out.size() < want && Clock::now() < until) {
      ibv_wc wc;
      if (ibv_poll_cq(cq, 1, &wc) == 1) {
        out.push_back(wc);
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
    return out;
  }

  bool NextEvent(ibv_async_event* ev, int ms = 3000) {
    pollfd p{ctx_->async_fd, POLLIN, 0};
    if (poll(&p, 1, ms) != 1) return false;
    return ibv_get_async_event(ctx_, ev) == 0;
  }

  uint32_t OwnIp() {
    uint32_t ip;
    std::memcpy(&ip, gid_.raw + 12, 4);
    return ntohl(ip);
  }

  ibv_device** list_ = nullptr;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_mr* mr_ = nullptr;
  ibv_ah* ah_ = nullptr;
  ibv_srq* srq_ = nullptr;
  ibv_gid gid_{};
  uint8_t key_[40];
  std::vector<uint8_t> buf_;
  std::vector<ibv_cq*> cqs_;
  std::vector<ibv_wq*> wqs_;
  std::vector<ibv_rwq_ind_table*> tables_;
  std::vector<ibv_qp*> qps_;
};

TEST_F(WqTest, CreateChecksItsAttributesAndFillsTheWq) {
  ibv_wq_init_attr a = WqAttr(cq_);
  a.wq_type = static_cast<ibv_wq_type>(1);
  errno = 0;
  EXPECT_EQ(ibv_create_wq(ctx_, &a), nullptr);
  EXPECT_EQ(errno, EINVAL);
  a = WqAttr(nullptr);
  errno = 0;
  EXPECT_EQ(ibv_create_wq(ctx_, &a), nullptr);
  EXPECT_EQ(errno, EINVAL);
  for (uint32_t bad_wr : {0u, 1u << 20}) {
    a = WqAttr(cq_, bad_wr);
    errno = 0;
    EXPECT_EQ(ibv_create_wq(ctx_, &a), nullptr) << bad_wr;
    EXPECT_EQ(errno, EINVAL);
  }
  a = WqAttr(cq_);
  a.max_sge = 1000;
  errno = 0;
  EXPECT_EQ(ibv_create_wq(ctx_, &a), nullptr);
  EXPECT_EQ(errno, EINVAL);
  a = WqAttr(cq_);
  a.comp_mask = IBV_WQ_INIT_ATTR_FLAGS;
  a.create_flags = IBV_WQ_FLAGS_SCATTER_FCS;
  errno = 0;
  EXPECT_EQ(ibv_create_wq(ctx_, &a), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  a = WqAttr(cq_);
  a.comp_mask = IBV_WQ_INIT_ATTR_RESERVED;
  errno = 0;
  EXPECT_EQ(ibv_create_wq(ctx_, &a), nullptr);
  EXPECT_EQ(errno, EINVAL);

  ibv_wq* wq = NewWq(cq_, 5);
  ASSERT_NE(wq, nullptr);
  ibv_wq* other = NewWq(cq_, 5);
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(wq->context, ctx_);
  EXPECT_EQ(wq->wq_context, this);
  EXPECT_EQ(wq->pd, pd_);
  EXPECT_EQ(wq->cq, cq_);
  EXPECT_EQ(wq->state, IBV_WQS_RESET);
  EXPECT_EQ(wq->wq_type, IBV_WQT_RQ);
  EXPECT_NE(wq->wq_num, 0u);
  EXPECT_NE(wq->wq_num, other->wq_num);
  // The PD and the CQ are in use while the WQ exists.
  EXPECT_EQ(ibv_destroy_cq(cq_), EBUSY);
  EXPECT_EQ(ibv_dealloc_pd(pd_), EBUSY);
}

TEST_F(WqTest, ModifyFollowsTheStateMachine) {
  ibv_wq* wq = NewWq(cq_);
  ASSERT_NE(wq, nullptr);
  EXPECT_EQ(SetState(wq, IBV_WQS_ERR), EINVAL) << "RESET -> ERR";
  EXPECT_EQ(SetState(wq, IBV_WQS_UNKNOWN), EINVAL);
  ibv_wq_attr a{};
  a.attr_mask = IBV_WQ_ATTR_RESERVED;
  EXPECT_EQ(ibv_modify_wq(wq, &a), EINVAL);
  a = {};
  a.attr_mask = IBV_WQ_ATTR_FLAGS;
  a.flags = IBV_WQ_FLAGS_CVLAN_STRIPPING;
  a.flags_mask = IBV_WQ_FLAGS_CVLAN_STRIPPING;
  EXPECT_EQ(ibv_modify_wq(wq, &a), EOPNOTSUPP);
  a = {};
  a.attr_mask = IBV_WQ_ATTR_STATE | IBV_WQ_ATTR_CURR_STATE;
  a.curr_wq_state = IBV_WQS_RDY;
  a.wq_state = IBV_WQS_RDY;
  EXPECT_EQ(ibv_modify_wq(wq, &a), EINVAL) << "the WQ is in RESET, not RDY";
  EXPECT_EQ(wq->state, IBV_WQS_RESET);

  a.curr_wq_state = IBV_WQS_RESET;
  EXPECT_EQ(ibv_modify_wq(wq, &a), 0);
  EXPECT_EQ(wq->state, IBV_WQS_RDY);
  EXPECT_EQ(SetState(wq, IBV_WQS_RDY), 0);
  EXPECT_EQ(SetState(wq, IBV_WQS_ERR), 0);
  EXPECT_EQ(wq->state, IBV_WQS_ERR);
  EXPECT_EQ(SetState(wq, IBV_WQS_RDY), EINVAL) << "ERR -> RDY";
  EXPECT_EQ(SetState(wq, IBV_WQS_RESET), 0);
  EXPECT_EQ(SetState(wq, IBV_WQS_RDY), 0);
}

TEST_F(WqTest, PostChecksEachWrAndNamesTheBadOne) {
  ibv_wq* wq = NewWq(cq_, 2);
  ASSERT_NE(wq, nullptr);
  ibv_sge s1, s2, s3;
  ibv_recv_wr w1 = RecvWr(1, &s1), w2 = RecvWr(2, &s2), w3 = RecvWr(3, &s3);
  w2.num_sge = 2;  // max_sge is 1
  w1.next = &w2;
  ibv_recv_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_wq_recv(wq, &w1, &bad), EINVAL);
  EXPECT_EQ(bad, &w2);
  w2.num_sge = 1;
  w2.next = &w3;  // w1 is already in: w2 fills the WQ, w3 overflows
  bad = nullptr;
  EXPECT_EQ(ibv_post_wq_recv(wq, &w2, &bad), ENOMEM);
  EXPECT_EQ(bad, &w3);
}

TEST_F(WqTest, ErrFlushesPostedReceivesAndLaterPosts) {
  ibv_cq* cq = NewCq(16);
  ibv_wq* wq = NewWq(cq);
  ASSERT_NE(wq, nullptr);
  ASSERT_EQ(SetState(wq, IBV_WQS_RDY), 0);
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_EQ(PostWq(wq, id), 0);
  ibv_wc wc;
  EXPECT_EQ(ibv_poll_cq(cq, 1, &wc), 0);
  ASSERT_EQ(SetState(wq, IBV_WQS_ERR), 0);
  auto wcs = Drain(cq, 3);
  ASSERT_EQ(wcs.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(wcs[i].wr_id, i + 1);
    EXPECT_EQ(wcs[i].status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(wcs[i].opcode, IBV_WC_RECV);
    EXPECT_EQ(wcs[i].qp_num, wq->wq_num);
  }
  ASSERT_EQ(PostWq(wq, 9), 0);
  wcs = Drain(cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 9u);
  EXPECT_EQ(wcs[0].status, IBV_WC_WR_FLUSH_ERR);
  // RESET discards without completions.
  ASSERT_EQ(SetState(wq, IBV_WQS_RESET), 0);
  ASSERT_EQ(SetState(wq, IBV_WQS_RDY), 0);
  ASSERT_EQ(PostWq(wq, 10), 0);
  ASSERT_EQ(SetState(wq, IBV_WQS_RESET), 0);
  EXPECT_EQ(Drain(cq, 1, 200).size(), 0u);
}

TEST_F(WqTest, DestroyIsRefusedWhileInUse) {
  ibv_cq* cq = NewCq(16);
  ibv_wq* a = NewWq(cq);
  ibv_wq* b = NewWq(cq);
  ASSERT_TRUE(a && b);
  ibv_rwq_ind_table* t = NewTable({a, b}, 1);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(ibv_destroy_wq(a), EBUSY);
  ibv_qp* qp = NewQp(RssQpAttr(t, IBV_RX_HASH_SRC_IPV4));
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(ibv_destroy_rwq_ind_table(t), EBUSY);
  EXPECT_EQ(ibv_destroy_cq(cq), EBUSY);
  ASSERT_EQ(ibv_destroy_qp(qp), 0);
  qps_.clear();
  ASSERT_EQ(ibv_destroy_rwq_ind_table(t), 0);
  tables_.clear();
  EXPECT_EQ(ibv_destroy_wq(a), 0);
  wqs_.erase(wqs_.begin());
}

TEST_F(WqTest, IndirectionTableAndRssQpChecks) {
  ibv_wq* a = NewWq(cq_);
  ASSERT_NE(a, nullptr);
  std::vector<ibv_wq*> entries = {a, nullptr};
  ibv_rwq_ind_table_init_attr ta{};
  ta.log_ind_tbl_size = 1;
  ta.ind_tbl = entries.data();
  errno = 0;
  EXPECT_EQ(ibv_create_rwq_ind_table(ctx_, &ta), nullptr) << "a NULL entry";
  EXPECT_EQ(errno, EINVAL);
  ta.log_ind_tbl_size = 9;
  errno = 0;
  EXPECT_EQ(ibv_create_rwq_ind_table(ctx_, &ta), nullptr) << "larger than the device's 256";
  EXPECT_EQ(errno, EINVAL);
  ta.log_ind_tbl_size = 0;
  ta.comp_mask = IBV_CREATE_IND_TABLE_RESERVED;
  errno = 0;
  EXPECT_EQ(ibv_create_rwq_ind_table(ctx_, &ta), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_rwq_ind_table* t = NewTable({a}, 0);
  ASSERT_NE(t, nullptr);

  auto fails = [&](ibv_qp_init_attr_ex attr, int error) {
    errno = 0;
    ibv_qp* qp = ibv_create_qp_ex(ctx_, &attr);
    if (qp) ibv_destroy_qp(qp);
    return qp == nullptr && errno == error;
  };
  ibv_qp_init_attr_ex q = RssQpAttr(t, IBV_RX_HASH_SRC_IPV4);
  q.qp_type = IBV_QPT_RC;
  EXPECT_TRUE(fails(q, EOPNOTSUPP)) << "RSS on an RC QP";
  q = RssQpAttr(t, IBV_RX_HASH_SRC_IPV4);
  q.comp_mask &= ~IBV_QP_INIT_ATTR_RX_HASH;
  EXPECT_TRUE(fails(q, EINVAL)) << "a table without a hash configuration";
  q = RssQpAttr(t, IBV_RX_HASH_SRC_IPV4);
  q.rx_hash_conf.rx_hash_key_len = 16;
  EXPECT_TRUE(fails(q, EINVAL)) << "a short key";
  q = RssQpAttr(t, IBV_RX_HASH_SRC_IPV6);
  EXPECT_TRUE(fails(q, EOPNOTSUPP)) << "IPv6 fields";
  q = RssQpAttr(t, IBV_RX_HASH_SRC_IPV4);
  q.rx_hash_conf.rx_hash_function = 0;
  EXPECT_TRUE(fails(q, EOPNOTSUPP)) << "no hash function";
  q = RssQpAttr(t, IBV_RX_HASH_SRC_IPV4);
  q.cap.max_recv_wr = 4;
  EXPECT_TRUE(fails(q, EINVAL)) << "a receive queue of its own";

  ibv_qp* qp = NewQp(RssQpAttr(t, IBV_RX_HASH_SRC_IPV4));
  ASSERT_NE(qp, nullptr);
  ibv_sge sge;
  ibv_recv_wr wr = RecvWr(1, &sge);
  ibv_recv_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_recv(qp, &wr, &bad), EINVAL) << "it receives through its WQs";
  EXPECT_EQ(bad, &wr);

  ibv_device_attr_ex dev{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &dev), 0);
  EXPECT_EQ(dev.rss_caps.supported_qpts, (1u << IBV_QPT_UD) | (1u << IBV_QPT_RAW_PACKET));
  EXPECT_EQ(dev.rss_caps.max_rwq_indirection_table_size, 256u);
  EXPECT_EQ(dev.rss_caps.rx_hash_function, IBV_RX_HASH_FUNC_TOEPLITZ);
  EXPECT_GT(dev.max_wq_type_rq, 0u);
}

// The UD message lands on the WQ the Toeplitz hash of its source address
// picks, completes on that WQ's CQ with qp_num = wq_num, and nowhere else.
TEST_F(WqTest, UdQpWithATableReceivesThroughTheHashedWq) {
  ibv_cq* cqs[2] = {NewCq(16), NewCq(16)};
  ibv_wq* wqs[2] = {NewWq(cqs[0]), NewWq(cqs[1])};
  ASSERT_TRUE(wqs[0] && wqs[1]);
  for (ibv_wq* wq : wqs) {
    ASSERT_EQ(SetState(wq, IBV_WQS_RDY), 0);
    ASSERT_EQ(PostWq(wq, wq->wq_num), 0);
  }
  ibv_rwq_ind_table* t = NewTable({wqs[0], wqs[1]}, 1);
  ibv_qp* rx = NewQp(RssQpAttr(t, IBV_RX_HASH_SRC_IPV4));
  ibv_qp* tx = NewUd(cq_);
  ASSERT_TRUE(t && rx && tx);
  ToRts(rx);
  ToRts(tx);
  const uint32_t hash = rdmaemu::engine::RxHash(key_, rdmaemu::engine::kRxHashSrcIpv4, OwnIp(), 0, 0, 0);
  const int picked = static_cast<int>(hash & 1);

  Send(tx, rx->qp_num, "steered");
  auto wcs = Drain(cqs[picked], 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wcs[0].opcode, IBV_WC_RECV);
  EXPECT_EQ(wcs[0].wr_id, wqs[picked]->wq_num);
  EXPECT_EQ(wcs[0].qp_num, wqs[picked]->wq_num);
  EXPECT_EQ(wcs[0].src_qp, tx->qp_num);
  EXPECT_EQ(wcs[0].byte_len, 40u + sizeof "steered");
  EXPECT_TRUE(wcs[0].wc_flags & IBV_WC_GRH);
  const char* got = reinterpret_cast<const char*>(buf_.data() + 8192 + (wcs[0].wr_id % 128) * kSlot + 40);
  EXPECT_STREQ(got, "steered");
  EXPECT_EQ(Drain(cqs[1 - picked], 1, 200).size(), 0u);

  // A WQ that is not RDY receives nothing: the message is dropped.
  ASSERT_EQ(PostWq(wqs[picked], 77), 0);
  ASSERT_EQ(SetState(wqs[picked], IBV_WQS_RESET), 0);
  Send(tx, rx->qp_num, "dropped");
  EXPECT_EQ(Drain(cqs[picked], 1, 300).size(), 0u);
}

// With no field selected every message goes to entry 0.
TEST_F(WqTest, NoHashFieldsSteerEverythingToTheFirstEntry) {
  ibv_cq* cq0 = NewCq(16);
  ibv_wq* wqs[2] = {NewWq(cq0), NewWq(cq_)};
  ASSERT_TRUE(wqs[0] && wqs[1]);
  for (ibv_wq* wq : wqs) ASSERT_EQ(SetState(wq, IBV_WQS_RDY), 0);
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_EQ(PostWq(wqs[0], id), 0);
  ibv_rwq_ind_table* t = NewTable({wqs[0], wqs[1]}, 1);
  ibv_qp* rx = NewQp(RssQpAttr(t, 0));
  ibv_qp* tx = NewUd(cq_);
  ASSERT_TRUE(t && rx && tx);
  ToRts(rx);
  ToRts(tx);
  for (int i = 0; i < 3; ++i) Send(tx, rx->qp_num, "zero");
  auto wcs = Drain(cq0, 3);
  ASSERT_EQ(wcs.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(wcs[i].wr_id, i + 1);
}

// WQ_FATAL from its cause: the WQ's CQ overruns while a receive completes
// into it. The event names the WQ; ibv_destroy_wq then waits for its ack.
TEST_F(WqTest, CqOverrunRaisesWqFatalAndDestroyWaitsForTheAck) {
  ibv_cq* tiny = NewCq(1);
  ibv_wq* wq = NewWq(tiny);
  ASSERT_NE(wq, nullptr);
  ASSERT_EQ(SetState(wq, IBV_WQS_RDY), 0);
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_EQ(PostWq(wq, id), 0);
  ibv_rwq_ind_table* t = NewTable({wq}, 0);
  ibv_qp* rx = NewQp(RssQpAttr(t, IBV_RX_HASH_SRC_IPV4));
  ibv_qp* tx = NewUd(cq_);
  ASSERT_TRUE(t && rx && tx);
  ToRts(rx);
  ToRts(tx);
  Send(tx, rx->qp_num, "one");
  Send(tx, rx->qp_num, "two");

  ibv_async_event cq_err, fatal;
  ASSERT_TRUE(NextEvent(&cq_err));
  EXPECT_EQ(cq_err.event_type, IBV_EVENT_CQ_ERR);
  EXPECT_EQ(cq_err.element.cq, tiny);
  ibv_ack_async_event(&cq_err);
  ASSERT_TRUE(NextEvent(&fatal));
  EXPECT_EQ(fatal.event_type, IBV_EVENT_WQ_FATAL);
  EXPECT_EQ(fatal.element.wq, wq);
  EXPECT_EQ(fatal.element.wq->wq_context, this);

  // The QP is not affected; the WQ is in ERR and refuses RDY until RESET.
  ibv_qp_attr qa;
  ibv_qp_init_attr qi;
  ASSERT_EQ(ibv_query_qp(rx, &qa, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(qa.qp_state, IBV_QPS_RTS);
  ibv_wq_attr wa{};
  wa.attr_mask = IBV_WQ_ATTR_STATE | IBV_WQ_ATTR_CURR_STATE;
  wa.curr_wq_state = IBV_WQS_RDY;
  wa.wq_state = IBV_WQS_RDY;
  EXPECT_EQ(ibv_modify_wq(wq, &wa), EINVAL) << "the WQ is in ERR now";

  // Free the WQ: the QP and the table go first, then destroy waits for the ack.
  ASSERT_EQ(ibv_destroy_qp(rx), 0);
  qps_.erase(qps_.begin());
  ASSERT_EQ(ibv_destroy_rwq_ind_table(t), 0);
  tables_.clear();
  std::atomic<bool> done{false};
  std::thread destroyer([&] {
    EXPECT_EQ(ibv_destroy_wq(wq), 0);
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(done) << "ibv_destroy_wq returned with WQ_FATAL unacknowledged";
  const auto acked = Clock::now();
  ibv_ack_async_event(&fatal);
  destroyer.join();
  EXPECT_TRUE(done);
  EXPECT_LT(Clock::now() - acked, std::chrono::milliseconds(200));
  wqs_.clear();
}

// Events queued but never read are discarded at destroy, with their fd
// counts: nothing is left to read and destroy does not wait.
TEST_F(WqTest, UnreadWqEventsAreDiscardedAtDestroy) {
  ibv_wq* wq = NewWq(cq_);
  ASSERT_NE(wq, nullptr);
  ibv_async_event raise{};
  raise.event_type = IBV_EVENT_WQ_FATAL;
  raise.element.wq = wq;
  ASSERT_EQ(rdmaemu_raise_async_event(ctx_, &raise), 0);
  ASSERT_EQ(rdmaemu_raise_async_event(ctx_, &raise), 0);
  pollfd p{ctx_->async_fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 1000), 1);
  const auto start = Clock::now();
  ASSERT_EQ(ibv_destroy_wq(wq), 0);
  wqs_.clear();
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(500));
  EXPECT_EQ(poll(&p, 1, 100), 0) << "the discarded events' counts were taken back";
  ibv_async_event ev;
  errno = 0;
  EXPECT_EQ(ibv_get_async_event(ctx_, &ev), -1);
  EXPECT_EQ(errno, EAGAIN);
}

TEST_F(WqTest, WqFatalOnDemandNamesTheWqAndChecksTheElement) {
  ibv_wq* wq = NewWq(cq_);
  ASSERT_NE(wq, nullptr);
  ibv_async_event raise{};
  raise.event_type = IBV_EVENT_WQ_FATAL;
  raise.element.wq = wq;
  ASSERT_EQ(rdmaemu_raise_async_event(ctx_, &raise), 0);
  ibv_async_event ev;
  ASSERT_TRUE(NextEvent(&ev));
  EXPECT_EQ(ev.event_type, IBV_EVENT_WQ_FATAL);
  EXPECT_EQ(ev.element.wq, wq);
  ibv_ack_async_event(&ev);
  raise.element.wq = nullptr;
  EXPECT_EQ(rdmaemu_raise_async_event(ctx_, &raise), EINVAL);
}

// The control plane names a WQ by its wq_num: `list` shows it with its
// state, `event wq_fatal --wq WQN` reaches ibv_get_async_event naming the
// application's own ibv_wq, and after ibv_destroy_wq neither finds it.
TEST_F(WqTest, ControlPlaneListsTheWqByWqnAndRaisesWqFatalOnIt) {
  ibv_wq* wq = NewWq(cq_);
  ASSERT_NE(wq, nullptr);
  ASSERT_EQ(SetState(wq, IBV_WQS_RDY), 0);
  const std::string wqn = std::to_string(wq->wq_num);
  const std::string line = fmt::format("\nemu0 wq {} (0x{:06x}) RDY\n", wq->wq_num, wq->wq_num);
  std::vector<std::string> list = {"list"};
  rdmaemu::control::Reply r = rdmaemu::control::Dispatch(list);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find(line), std::string::npos) << r.out;

  std::vector<std::string> event = {"event", "wq_fatal", "--wq", wqn};
  r = rdmaemu::control::Dispatch(event);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "emu0 wq " + wqn + ": raised IBV_EVENT_WQ_FATAL\n");
  ibv_async_event ev;
  ASSERT_TRUE(NextEvent(&ev));
  EXPECT_EQ(ev.event_type, IBV_EVENT_WQ_FATAL);
  EXPECT_EQ(ev.element.wq, wq);
  ibv_ack_async_event(&ev);

  ASSERT_EQ(ibv_destroy_wq(wq), 0);
  wqs_.clear();
  r = rdmaemu::control::Dispatch(list);
  EXPECT_EQ(r.out.find(line), std::string::npos) << r.out;
  r = rdmaemu::control::Dispatch(event);
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "event: no wq " + wqn + " in this process (see `list`)\n");
}

// SRQ_ERR from its cause: a receive taken from the SRQ loses its completion
// to an overrun of the receiving QP's CQ. The SRQ then gives out no more
// receives, to any QP.
TEST_F(WqTest, SrqReceiveLostToCqOverrunRaisesSrqErr) {
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 8;
  sa.attr.max_sge = 1;
  srq_ = ibv_create_srq(pd_, &sa);
  ASSERT_NE(srq_, nullptr);
  for (uint64_t id = 1; id <= 4; ++id) {
    ibv_sge sge;
    ibv_recv_wr wr = RecvWr(id, &sge);
    ibv_recv_wr* bad;
    ASSERT_EQ(ibv_post_srq_recv(srq_, &wr, &bad), 0);
  }
  ibv_cq* tiny = NewCq(1);
  ibv_cq* other_cq = NewCq(16);
  ibv_qp* rx = NewUd(tiny, srq_);
  ibv_qp* rx2 = NewUd(other_cq, srq_);
  ibv_qp* tx = NewUd(cq_);
  ASSERT_TRUE(rx && rx2 && tx);
  ToRts(rx);
  ToRts(rx2);
  ToRts(tx);
  Send(tx, rx->qp_num, "one");
  Send(tx, rx->qp_num, "two");
  std::vector<ibv_event_type> seen;
  bool srq_err = false;
  ibv_async_event ev;
  while (NextEvent(&ev, 500)) {
    seen.push_back(ev.event_type);
    if (ev.event_type == IBV_EVENT_SRQ_ERR) {
      srq_err = true;
      EXPECT_EQ(ev.element.srq, srq_);
    }
    ibv_ack_async_event(&ev);
  }
  EXPECT_TRUE(srq_err);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0], IBV_EVENT_CQ_ERR);
  EXPECT_EQ(seen[1], IBV_EVENT_SRQ_ERR);
  EXPECT_EQ(seen[2], IBV_EVENT_QP_LAST_WQE_REACHED);
  // Two WQEs are left on the SRQ, but it is in error: another QP gets none.
  Send(tx, rx2->qp_num, "three");
  EXPECT_EQ(Drain(other_cq, 1, 300).size(), 0u);
}

}  // namespace
