// The extended post API (ibv_wr_*) through the public verbs API: two RC QPs
// of one process connected to each other over the emulator, every RC
// operation posted through ibv_wr_* with its data checked, and the rules of
// creation, batching, abort and capacity.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "tests/testing/verbs_test.h"

namespace {

constexpr uint64_t kRcOps = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
                            IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                            IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
                            IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                        IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

class QpExTest : public rdmaemu::testing::VerbsTest {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(Open(256, 1 << 16, kAccess)); }

  ibv_qp* CreateQpEx(ibv_qp_type type, uint64_t ops, uint32_t wr = 16, bool with_ops = true) {
    ibv_qp_init_attr_ex attr{};
    attr.send_cq = cq_;
    attr.recv_cq = cq_;
    attr.qp_type = type;
    attr.cap.max_send_wr = wr;
    attr.cap.max_recv_wr = wr;
    attr.cap.max_send_sge = 4;
    attr.cap.max_recv_sge = 4;
    attr.cap.max_inline_data = 64;
    attr.comp_mask = IBV_QP_INIT_ATTR_PD | (with_ops ? IBV_QP_INIT_ATTR_SEND_OPS_FLAGS : 0);
    attr.pd = pd_;
    attr.send_ops_flags = ops;
    ibv_qp* qp = ibv_create_qp_ex(ctx_, &attr);
    if (qp) qps_.push_back(qp);
    return qp;
  }

  // Connects a and b to each other (RC) and moves both to RTS.
  void Connect(ibv_qp* a, ibv_qp* b) {
    ibv_gid gid;
    ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &gid), 0);
    for (auto [qp, peer] : {std::pair{a, b}, std::pair{b, a}}) {
      ibv_qp_attr x{};
      x.qp_state = IBV_QPS_INIT;
      x.port_num = 1;
      x.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
      ASSERT_EQ(ibv_modify_qp(qp, &x, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                          IBV_QP_ACCESS_FLAGS),
                0);
      x = {};
      x.qp_state = IBV_QPS_RTR;
      x.path_mtu = IBV_MTU_1024;
      x.dest_qp_num = peer->qp_num;
      x.rq_psn = 100;
      x.max_dest_rd_atomic = 4;
      x.min_rnr_timer = 1;
      x.ah_attr.is_global = 1;
      x.ah_attr.grh.dgid = gid;
      x.ah_attr.grh.sgid_index = 0;
      x.ah_attr.grh.hop_limit = 1;
      x.ah_attr.port_num = 1;
      ASSERT_EQ(ibv_modify_qp(qp, &x, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                                          IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
                0);
      x = {};
      x.qp_state = IBV_QPS_RTS;
      x.sq_psn = 100;
      x.timeout = 14;
      x.retry_cnt = 7;
      x.rnr_retry = 7;
      x.max_rd_atomic = 4;
      ASSERT_EQ(ibv_modify_qp(qp, &x, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
                                          IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                          IBV_QP_MAX_QP_RD_ATOMIC),
                0);
    }
  }

  void PostRecv(ibv_qp* qp, uint64_t wr_id, uint8_t* at, uint32_t len) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(at), len, mr_->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_recv(qp, &wr, &bad), 0);
  }

  // Polls until `n` completions arrived or 5 s passed.
  std::vector<ibv_wc> Poll(size_t n, std::chrono::milliseconds limit = std::chrono::seconds(5)) {
    std::vector<ibv_wc> got;
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (got.size() < n && std::chrono::steady_clock::now() < deadline) {
      ibv_wc wc;
      if (ibv_poll_cq(cq_, 1, &wc) == 1) got.push_back(wc);
    }
    return got;
  }

  static const ibv_wc* Find(const std::vector<ibv_wc>& wcs, uint64_t wr_id) {
    for (const ibv_wc& wc : wcs) {
      if (wc.wr_id == wr_id) return &wc;
    }
    return nullptr;
  }

  uint8_t* At(size_t offset) { return buf_.data() + offset; }
  uint64_t Addr(size_t offset) { return reinterpret_cast<uintptr_t>(At(offset)); }

};

TEST_F(QpExTest, QpToQpExIsNullWithoutSendOpsFlags) {
  ibv_qp* plain = CreateQpEx(IBV_QPT_RC, 0, 4, /*with_ops=*/false);
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(ibv_qp_to_qp_ex(plain), nullptr);

  ibv_qp_init_attr attr{};
  attr.send_cq = attr.recv_cq = cq_;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = attr.cap.max_recv_wr = 1;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  ibv_qp* old = ibv_create_qp(pd_, &attr);
  ASSERT_NE(old, nullptr);
  qps_.push_back(old);
  EXPECT_EQ(ibv_qp_to_qp_ex(old), nullptr);

  ibv_qp* ex = CreateQpEx(IBV_QPT_RC, kRcOps);
  ASSERT_NE(ex, nullptr);
  ibv_qp_ex* qpx = ibv_qp_to_qp_ex(ex);
  ASSERT_NE(qpx, nullptr);
  EXPECT_EQ(&qpx->qp_base, ex);
  // Every function pointer is set, including the operations the device refuses.
  for (auto fn : {reinterpret_cast<void*>(qpx->wr_start), reinterpret_cast<void*>(qpx->wr_complete),
                  reinterpret_cast<void*>(qpx->wr_abort), reinterpret_cast<void*>(qpx->wr_send),
                  reinterpret_cast<void*>(qpx->wr_send_imm), reinterpret_cast<void*>(qpx->wr_send_inv),
                  reinterpret_cast<void*>(qpx->wr_send_tso), reinterpret_cast<void*>(qpx->wr_rdma_write),
                  reinterpret_cast<void*>(qpx->wr_rdma_write_imm),
                  reinterpret_cast<void*>(qpx->wr_rdma_read),
                  reinterpret_cast<void*>(qpx->wr_atomic_cmp_swp),
                  reinterpret_cast<void*>(qpx->wr_atomic_fetch_add),
                  reinterpret_cast<void*>(qpx->wr_bind_mw), reinterpret_cast<void*>(qpx->wr_local_inv),
                  reinterpret_cast<void*>(qpx->wr_atomic_write),
                  reinterpret_cast<void*>(qpx->wr_set_ud_addr),
                  reinterpret_cast<void*>(qpx->wr_set_xrc_srqn),
                  reinterpret_cast<void*>(qpx->wr_set_inline_data),
                  reinterpret_cast<void*>(qpx->wr_set_inline_data_list),
                  reinterpret_cast<void*>(qpx->wr_set_sge), reinterpret_cast<void*>(qpx->wr_set_sge_list)}) {
    EXPECT_NE(fn, nullptr);
  }
}

TEST_F(QpExTest, UnsupportedSendOpsFlagsFailWithEopnotsupp) {
  for (uint64_t bad : {uint64_t{IBV_QP_EX_WITH_TSO}, uint64_t{1} << 40}) {
    errno = 0;
    EXPECT_EQ(CreateQpEx(IBV_QPT_RC, IBV_QP_EX_WITH_SEND | bad), nullptr) << bad;
    EXPECT_EQ(errno, EOPNOTSUPP) << bad;
  }
  // Valid operations, but not on these transports.
  errno = 0;
  EXPECT_EQ(CreateQpEx(IBV_QPT_UC, IBV_QP_EX_WITH_RDMA_READ), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  errno = 0;
  EXPECT_EQ(CreateQpEx(IBV_QPT_UD, IBV_QP_EX_WITH_RDMA_WRITE), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  errno = 0;
  EXPECT_EQ(CreateQpEx(IBV_QPT_UC, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_ATOMIC_WRITE), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  // Memory windows are bound and invalidated on RC and UC QPs only.
  errno = 0;
  EXPECT_EQ(CreateQpEx(IBV_QPT_UD, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_BIND_MW), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_NE(CreateQpEx(IBV_QPT_RC, kRcOps | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV), nullptr);
  EXPECT_NE(CreateQpEx(IBV_QPT_UC, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV),
            nullptr);
  EXPECT_NE(CreateQpEx(IBV_QPT_UC, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM), nullptr);
  EXPECT_NE(CreateQpEx(IBV_QPT_UD, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM), nullptr);
  EXPECT_NE(CreateQpEx(IBV_QPT_RC, kRcOps | IBV_QP_EX_WITH_SEND_WITH_INV), nullptr);
}

TEST_F(QpExTest, EveryRcOperationMovesTheRightBytes) {
  ibv_qp* a = CreateQpEx(IBV_QPT_RC, kRcOps);
  ibv_qp* b = CreateQpEx(IBV_QPT_RC, kRcOps);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  Connect(a, b);
  if (HasFatalFailure()) return;
  ibv_qp_ex* qpx = ibv_qp_to_qp_ex(a);
  ASSERT_NE(qpx, nullptr);

  // Layout of buf_: [0,4K) a's sources, [4K,8K) b's receive buffers,
  // [8K,12K) RDMA targets, [12K,16K) READ/atomic results.
  for (int i = 0; i < 4096; ++i) *At(i) = static_cast<uint8_t>(i * 7 + 1);
  std::memset(At(8192 + 2048), 0x5a, 512);  // READ source
  uint64_t cas_target = 41, faa_target = 1000;
  std::memcpy(At(8192 + 3072), &cas_target, 8);
  std::memcpy(At(8192 + 3080), &faa_target, 8);
  PostRecv(b, 101, At(4096), 1024);
  PostRecv(b, 102, At(4096 + 1024), 1024);
  PostRecv(b, 103, At(4096 + 2048), 16);  // consumed by WRITE_WITH_IMM

  ibv_wr_start(qpx);
  qpx->wr_flags = IBV_SEND_SIGNALED;
  qpx->wr_id = 1;
  ibv_wr_send(qpx);
  ibv_wr_set_sge(qpx, mr_->lkey, Addr(0), 300);
  qpx->wr_id = 2;
  ibv_wr_send_imm(qpx, htonl(0xabcd));
  const ibv_sge list[3] = {{Addr(1000), 10, mr_->lkey}, {Addr(2000), 20, mr_->lkey},
                           {Addr(3000), 30, mr_->lkey}};
  ibv_wr_set_sge_list(qpx, 3, list);
  qpx->wr_id = 3;
  ibv_wr_rdma_write(qpx, mr_->rkey, Addr(8192));
  ibv_wr_set_sge(qpx, mr_->lkey, Addr(100), 1500);  // two packets at MTU 1024
  qpx->wr_id = 4;
  ibv_wr_rdma_write_imm(qpx, mr_->rkey, Addr(8192 + 1600), htonl(0x77));
  ibv_wr_set_sge(qpx, mr_->lkey, Addr(50), 100);
  qpx->wr_id = 5;
  ibv_wr_rdma_read(qpx, mr_->rkey, Addr(8192 + 2048));
  ibv_wr_set_sge(qpx, mr_->lkey, Addr(12288), 512);
  qpx->wr_id = 6;
  ibv_wr_atomic_cmp_swp(qpx, mr_->rkey, Addr(8192 + 3072), 41, 99);
  ibv_wr_set_sge(qpx, mr_->lkey, Addr(12288 + 1024), 8);
  qpx->wr_id = 7;
  ibv_wr_atomic_fetch_add(qpx, mr_->rkey, Addr(8192 + 3080), 5);
  ibv_wr_set_sge(qpx, mr_->lkey, Addr(12288 + 1032), 8);
  ASSERT_EQ(ibv_wr_complete(qpx), 0);

  std::vector<ibv_wc> wcs = Poll(10);
  ASSERT_EQ(wcs.size(), 10u);
  for (const ibv_wc& wc : wcs) {
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc.wr_id;
  }
  const struct {
    uint64_t wr_id;
    ibv_wc_opcode op;
  } expected[] = {{1, IBV_WC_SEND},       {2, IBV_WC_SEND},        {3, IBV_WC_RDMA_WRITE},
                  {4, IBV_WC_RDMA_WRITE}, {5, IBV_WC_RDMA_READ},   {6, IBV_WC_COMP_SWAP},
                  {7, IBV_WC_FETCH_ADD},  {101, IBV_WC_RECV},      {102, IBV_WC_RECV},
                  {103, IBV_WC_RECV_RDMA_WITH_IMM}};
  for (const auto& e : expected) {
    const ibv_wc* wc = Find(wcs, e.wr_id);
    ASSERT_NE(wc, nullptr) << e.wr_id;
    EXPECT_EQ(wc->opcode, e.op) << e.wr_id;
  }
  // SEND: 300 bytes.
  EXPECT_EQ(Find(wcs, 101)->byte_len, 300u);
  EXPECT_EQ(std::memcmp(At(4096), At(0), 300), 0);
  // SEND_WITH_IMM over three SGEs, concatenated.
  const ibv_wc* r2 = Find(wcs, 102);
  EXPECT_EQ(r2->byte_len, 60u);
  EXPECT_TRUE(r2->wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(ntohl(r2->imm_data), 0xabcdu);
  EXPECT_EQ(std::memcmp(At(4096 + 1024), At(1000), 10), 0);
  EXPECT_EQ(std::memcmp(At(4096 + 1034), At(2000), 20), 0);
  EXPECT_EQ(std::memcmp(At(4096 + 1054), At(3000), 30), 0);
  // RDMA WRITE and WRITE_WITH_IMM.
  EXPECT_EQ(std::memcmp(At(8192), At(100), 1500), 0);
  EXPECT_EQ(std::memcmp(At(8192 + 1600), At(50), 100), 0);
  const ibv_wc* r3 = Find(wcs, 103);
  EXPECT_TRUE(r3->wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(ntohl(r3->imm_data), 0x77u);
  EXPECT_EQ(r3->byte_len, 100u);
  // READ.
  for (int i = 0; i < 512; ++i) ASSERT_EQ(*At(12288 + i), 0x5a) << i;
  // Atomics: the original values come back, the targets change.
  uint64_t v;
  std::memcpy(&v, At(12288 + 1024), 8);
  EXPECT_EQ(v, 41u);
  std::memcpy(&v, At(8192 + 3072), 8);
  EXPECT_EQ(v, 99u);
  std::memcpy(&v, At(12288 + 1032), 8);
  EXPECT_EQ(v, 1000u);
  std::memcpy(&v, At(8192 + 3080), 8);
  EXPECT_EQ(v, 1005u);
}

TEST_F(QpExTest, InlineDataIsCopiedWhenSet) {
  ibv_qp* a = CreateQpEx(IBV_QPT_RC, kRcOps);
  ibv_qp* b = CreateQpEx(IBV_QPT_RC, kRcOps);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  Connect(a, b);
  if (HasFatalFailure()) return;
  ibv_qp_ex* qpx = ibv_qp_to_qp_ex(a);
  PostRecv(b, 201, At(4096), 256);

  // The application's buffers are not registered and are overwritten
  // right after each setter: only the copies may be sent.
  char scratch[40];
  ibv_wr_start(qpx);
  qpx->wr_flags = IBV_SEND_SIGNALED;
  qpx->wr_id = 11;
  ibv_wr_send(qpx);
  std::memcpy(scratch, "hello, inline", 13);
  ibv_wr_set_inline_data(qpx, scratch, 13);
  std::memset(scratch, 'X', sizeof scratch);
  qpx->wr_id = 12;
  ibv_wr_rdma_write(qpx, mr_->rkey, Addr(8192));
  char p1[] = "first ", p2[] = "second ", p3[] = "third";
  const ibv_data_buf bufs[3] = {{p1, 6}, {p2, 7}, {p3, 5}};
  ibv_wr_set_inline_data_list(qpx, 3, bufs);
  std::memset(p1, 'Y', 6);
  std::memset(p2, 'Y', 7);
  ASSERT_EQ(ibv_wr_complete(qpx), 0);

  std::vector<ibv_wc> wcs = Poll(3);
  ASSERT_EQ(wcs.size(), 3u);
  for (const ibv_wc& wc : wcs) {
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc.wr_id;
  }
  ASSERT_NE(Find(wcs, 201), nullptr);
  EXPECT_EQ(Find(wcs, 201)->byte_len, 13u);
  EXPECT_EQ(std::memcmp(At(4096), "hello, inline", 13), 0);
  EXPECT_EQ(std::memcmp(At(8192), "first second third", 18), 0);

  // More inline bytes than max_inline_data (64) fail the batch with EINVAL.
  std::vector<char> big(65, 'z');
  ibv_wr_start(qpx);
  ibv_wr_send(qpx);
  ibv_wr_set_inline_data(qpx, big.data(), big.size());
  EXPECT_EQ(ibv_wr_complete(qpx), EINVAL);
  // Inline data on an RDMA READ (it writes locally) is refused as
  // IBV_SEND_INLINE is by ibv_post_send.
  ibv_wr_start(qpx);
  ibv_wr_rdma_read(qpx, mr_->rkey, Addr(8192));
  ibv_wr_set_inline_data(qpx, scratch, 8);
  EXPECT_EQ(ibv_wr_complete(qpx), EINVAL);
  EXPECT_TRUE(Poll(1, std::chrono::milliseconds(100)).empty());
}

TEST_F(QpExTest, AFailingBatchPostsNothing) {
  ibv_qp* a = CreateQpEx(IBV_QPT_RC, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE);
  ibv_qp* b = CreateQpEx(IBV_QPT_RC, kRcOps);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  Connect(a, b);
  if (HasFatalFailure()) return;
  ibv_qp_ex* qpx = ibv_qp_to_qp_ex(a);
  PostRecv(b, 301, At(4096), 256);
  qpx->wr_flags = IBV_SEND_SIGNALED;

  // An operation the QP was not created for: EOPNOTSUPP, and the valid SEND
  // before it is not posted either.
  ibv_wr_start(qpx);
  qpx->wr_id = 31;
  ibv_wr_send(qpx);
  ibv_wr_set_sge(qpx, mr_->lkey, Addr(0), 8);
  qpx->wr_id = 32;
  ibv_wr_rdma_read(qpx, mr_->rkey, Addr(8192));
  ibv_wr_set_sge(qpx, mr_->lkey, Addr(12288), 8);
  EXPECT_EQ(ibv_wr_complete(qpx), EOPNOTSUPP);

  // Window operations the QP was not created for (no IBV_QP_EX_WITH_LOCAL_INV
  // or IBV_QP_EX_WITH_BIND_MW in its send_ops_flags).
  ibv_wr_start(qpx);
  ibv_wr_local_inv(qpx, 5);
  EXPECT_EQ(ibv_wr_complete(qpx), EOPNOTSUPP);
  ibv_wr_start(qpx);
  ibv_wr_bind_mw(qpx, nullptr, 5, nullptr);
  EXPECT_EQ(ibv_wr_complete(qpx), EOPNOTSUPP);

  // Malformed work requests fail with EINVAL: too many SGEs (max_send_sge
  // is 4), UD addressing on an RC QP, a setter before any builder.
  ibv_sge many[5];
  for (auto& s : many) s = {Addr(0), 1, mr_->lkey};
  ibv_wr_start(qpx);
  ibv_wr_send(qpx);
  ibv_wr_set_sge_list(qpx, 5, many);
  EXPECT_EQ(ibv_wr_complete(qpx), EINVAL);
  ibv_wr_start(qpx);
  ibv_wr_send(qpx);
  ibv_wr_set_ud_addr(qpx, nullptr, 1, 1);
  EXPECT_EQ(ibv_wr_complete(qpx), EINVAL);
  ibv_wr_start(qpx);
  ibv_wr_set_sge(qpx, mr_->lkey, Addr(0), 8);
  EXPECT_EQ(ibv_wr_complete(qpx), EINVAL);

  EXPECT_TRUE(Poll(1, std::chrono::milliseconds(200)).empty());

  // The QP is still usable and the receive still unused.
  ibv_wr_start(qpx);
  qpx->wr_id = 33;
  ibv_wr_send(qpx);
  ibv_wr_set_sge(qpx, mr_->lkey, Addr(0), 8);
  ASSERT_EQ(ibv_wr_complete(qpx), 0);
  std::vector<ibv_wc> wcs = Poll(2);
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_NE(Find(wcs, 33), nullptr);
  EXPECT_NE(Find(wcs, 301), nullptr);
}

TEST_F(QpExTest, AbortPostsNothing) {
  ibv_qp* a = CreateQpEx(IBV_QPT_RC, kRcOps);
  ibv_qp* b = CreateQpEx(IBV_QPT_RC, kRcOps);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  Connect(a, b);
  if (HasFatalFailure()) return;
  ibv_qp_ex* qpx = ibv_qp_to_qp_ex(a);
  *At(8192) = 0;
  *At(0) = 0xee;
  qpx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_start(qpx);
  qpx->wr_id = 41;
  ibv_wr_rdma_write(qpx, mr_->rkey, Addr(8192));
  ibv_wr_set_sge(qpx, mr_->lkey, Addr(0), 1);
  ibv_wr_abort(qpx);
  EXPECT_TRUE(Poll(1, std::chrono::milliseconds(200)).empty());
  EXPECT_EQ(*At(8192), 0);

  // An empty batch completes successfully and posts nothing.
  ibv_wr_start(qpx);
  EXPECT_EQ(ibv_wr_complete(qpx), 0);
  EXPECT_TRUE(Poll(1, std::chrono::milliseconds(100)).empty());
}

TEST_F(QpExTest, ABatchBeyondTheSendQueueFailsWithEnomemAndPostsNothing) {
  ibv_qp* a = CreateQpEx(IBV_QPT_RC, kRcOps, /*wr=*/4);
  ibv_qp* b = CreateQpEx(IBV_QPT_RC, kRcOps);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  Connect(a, b);
  if (HasFatalFailure()) return;
  ibv_qp_ex* qpx = ibv_qp_to_qp_ex(a);
  qpx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_start(qpx);
  for (int i = 0; i < 5; ++i) {
    qpx->wr_id = 50 + i;
    ibv_wr_rdma_write(qpx, mr_->rkey, Addr(8192 + i));
    ibv_wr_set_sge(qpx, mr_->lkey, Addr(i), 1);
  }
  EXPECT_EQ(ibv_wr_complete(qpx), ENOMEM);
  EXPECT_TRUE(Poll(1, std::chrono::milliseconds(200)).empty());

  // Exactly max_send_wr fits.
  ibv_wr_start(qpx);
  for (int i = 0; i < 4; ++i) {
    qpx->wr_id = 60 + i;
    ibv_wr_rdma_write(qpx, mr_->rkey, Addr(8192 + i));
    ibv_wr_set_sge(qpx, mr_->lkey, Addr(i), 1);
  }
  EXPECT_EQ(ibv_wr_complete(qpx), 0);
  std::vector<ibv_wc> wcs = Poll(4);
  ASSERT_EQ(wcs.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    const ibv_wc* wc = Find(wcs, 60 + i);
    ASSERT_NE(wc, nullptr);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
  }
}

TEST_F(QpExTest, UdSendThroughTheNewApi) {
  ibv_qp* a = CreateQpEx(IBV_QPT_UD, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM);
  ibv_qp* b = CreateQpEx(IBV_QPT_UD, IBV_QP_EX_WITH_SEND);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  for (ibv_qp* qp : {a, b}) ASSERT_EQ(UdToRts(qp, 0x11111111, 1), 0);
  ibv_ah* ah = CreateSelfAh();
  ASSERT_NE(ah, nullptr);
  PostRecv(b, 71, At(4096), 40 + 64);
  for (int i = 0; i < 64; ++i) *At(i) = static_cast<uint8_t>(200 - i);

  ibv_qp_ex* qpx = ibv_qp_to_qp_ex(a);
  // A UD send without ibv_wr_set_ud_addr is refused.
  ibv_wr_start(qpx);
  ibv_wr_send(qpx);
  ibv_wr_set_sge(qpx, mr_->lkey, Addr(0), 64);
  EXPECT_EQ(ibv_wr_complete(qpx), EINVAL);

  ibv_wr_start(qpx);
  qpx->wr_id = 72;
  qpx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send_imm(qpx, htonl(9));
  ibv_wr_set_ud_addr(qpx, ah, b->qp_num, 0x11111111);
  ibv_wr_set_sge(qpx, mr_->lkey, Addr(0), 64);
  ASSERT_EQ(ibv_wr_complete(qpx), 0);
  std::vector<ibv_wc> wcs = Poll(2);
  ASSERT_EQ(wcs.size(), 2u);
  const ibv_wc* recv = Find(wcs, 71);
  ASSERT_NE(recv, nullptr);
  EXPECT_EQ(recv->status, IBV_WC_SUCCESS);
  EXPECT_EQ(recv->byte_len, 104u);
  EXPECT_EQ(recv->src_qp, a->qp_num);
  EXPECT_EQ(ntohl(recv->imm_data), 9u);
  EXPECT_EQ(std::memcmp(At(4096 + 40), At(0), 64), 0);
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
}

}  // namespace
