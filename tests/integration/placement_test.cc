// The Memory Placement Extensions through the extended post API: ATOMIC
// WRITE (ibv_wr_atomic_write) and FLUSH (ibv_wr_flush, the slot rdma-core 45
// appends to ibv_qp_ex, reached here as a program built against newer
// headers reaches it), between two RC QPs of one process: what they place,
// what they complete with, and the errors a NIC reports for them.
#include <infiniband/verbs.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "tests/integration/rc_pair.h"

namespace rdmaemu::testing {
namespace {

// rdma-core 45's additions, absent from Debian 12's verbs.h (rdma-core 44).
constexpr uint64_t kQpExWithFlush = uint64_t{1} << 11;  // IBV_QP_EX_WITH_FLUSH
constexpr int kWcFlush = 8;                            // IBV_WC_FLUSH
constexpr unsigned kAccessFlushGlobal = 1u << 8;       // IBV_ACCESS_FLUSH_GLOBAL
constexpr unsigned kAccessFlushPersistent = 1u << 9;   // IBV_ACCESS_FLUSH_PERSISTENT
constexpr uint8_t kFlushGlobal = 1, kFlushPersistent = 2;  // IBV_FLUSH_GLOBAL, _PERSISTENT
constexpr uint8_t kFlushRange = 0, kFlushMr = 1;           // IBV_FLUSH_RANGE, _MR
constexpr uint64_t kCapFlushGlobal = uint64_t{1} << 38;      // IB_UVERBS_DEVICE_FLUSH_GLOBAL
constexpr uint64_t kCapFlushPersistent = uint64_t{1} << 39;  // IB_UVERBS_DEVICE_FLUSH_PERSISTENT
constexpr uint64_t kCapAtomicWrite = uint64_t{1} << 40;      // IB_UVERBS_DEVICE_ATOMIC_WRITE

// ibv_qp_ex as rdma-core 45 and later declare it: wr_flush follows.
struct QpExWithFlush {
  ibv_qp_ex base;
  void (*wr_flush)(ibv_qp_ex* qp, uint32_t rkey, uint64_t remote_addr, size_t len, uint8_t type,
                   uint8_t level);
};

class PlacementTest : public RcPairTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(Open(1024, 1 << 16,
                                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                     IBV_ACCESS_REMOTE_READ | kAccessFlushGlobal));
    ASSERT_NO_FATAL_FAILURE(AsyncFdNonBlocking());
  }

  ibv_qp* CreateRcEx(uint64_t send_ops, ibv_qp_type type = IBV_QPT_RC) {
    ibv_qp_init_attr_ex a{};
    a.send_cq = a.recv_cq = cq_;
    a.qp_type = type;
    a.cap = {16, 16, 1, 1, 0};
    a.pd = pd_;
    a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    a.send_ops_flags = send_ops;
    ibv_qp* qp = ibv_create_qp_ex(ctx_, &a);
    return qp == nullptr ? nullptr : Own(qp);
  }

  // Both QPs to RTS, each granting `qp_access` to its peer.
  void ConnectWith(ibv_qp* a, ibv_qp* b, unsigned qp_access) {
    ibv_gid gid = Gid(1);
    for (auto [qp, peer] : {std::pair{a, b}, std::pair{b, a}}) {
      ibv_qp_attr init{};
      init.qp_state = IBV_QPS_INIT;
      init.port_num = 1;
      init.qp_access_flags = qp_access;
      ASSERT_EQ(ibv_modify_qp(qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                             IBV_QP_ACCESS_FLAGS),
                0);
      ASSERT_EQ(ToRtr(qp, peer->qp_num, Av(gid, 1)), 0);
      ASSERT_EQ(ToRts(qp), 0);
    }
  }

  void Pair(unsigned qp_access = IBV_ACCESS_REMOTE_WRITE | kAccessFlushGlobal) {
    const uint64_t ops = IBV_QP_EX_WITH_ATOMIC_WRITE | kQpExWithFlush | IBV_QP_EX_WITH_RDMA_WRITE;
    a_ = CreateRcEx(ops);
    b_ = CreateRcEx(ops);
    ASSERT_NE(a_, nullptr);
    ASSERT_NE(b_, nullptr);
    ASSERT_NO_FATAL_FAILURE(ConnectWith(a_, b_, qp_access));
  }

  int AtomicWrite(uint64_t wr_id, uint32_t rkey, uintptr_t remote, uint64_t value) {
    ibv_qp_ex* x = ibv_qp_to_qp_ex(a_);
    ibv_wr_start(x);
    x->wr_id = wr_id;
    x->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_atomic_write(x, rkey, remote, &value);
    value = ~value;  // the device copied the 8 bytes at the call
    return ibv_wr_complete(x);
  }

  int Flush(uint64_t wr_id, uint32_t rkey, uintptr_t remote, size_t len, uint8_t type, uint8_t level) {
    auto* x = reinterpret_cast<QpExWithFlush*>(ibv_qp_to_qp_ex(a_));
    ibv_wr_start(&x->base);
    x->base.wr_id = wr_id;
    x->base.wr_flags = IBV_SEND_SIGNALED;
    x->wr_flush(&x->base, rkey, remote, len, type, level);
    return ibv_wr_complete(&x->base);
  }

  ibv_wc Wait(uint64_t wr_id) {
    ibv_wc wc{};
    EXPECT_TRUE(Completion(a_, wr_id, &wc)) << "no completion for wr " << wr_id;
    return wc;
  }

  ibv_qp* a_ = nullptr;
  ibv_qp* b_ = nullptr;
};

TEST_F(PlacementTest, DeviceReportsAtomicWriteAndGlobalFlushButNoPersistentMemory) {
  ibv_device_attr_ex attr{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &attr), 0);
  EXPECT_TRUE(attr.device_cap_flags_ex & kCapAtomicWrite);
  EXPECT_TRUE(attr.device_cap_flags_ex & kCapFlushGlobal);
  EXPECT_FALSE(attr.device_cap_flags_ex & kCapFlushPersistent);
  EXPECT_EQ(attr.device_cap_flags_ex & 0xffffffffu, attr.orig_attr.device_cap_flags);
}

TEST_F(PlacementTest, AtomicWritePlacesTheEightBytesAndCompletesAsAtomicWrite) {
  ASSERT_NO_FATAL_FAILURE(Pair());
  const uint64_t value = 0x0123456789abcdefULL;
  ASSERT_EQ(AtomicWrite(7, mr_->rkey, At(64), value), 0);
  ibv_wc wc = Wait(7);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(wc.opcode, IBV_WC_ATOMIC_WRITE);
  uint64_t placed;
  std::memcpy(&placed, buf_.data() + 64, 8);
  EXPECT_EQ(placed, value);
  // Nothing around the target was touched.
  for (size_t i : {size_t{56}, size_t{72}}) {
    uint64_t around;
    std::memcpy(&around, buf_.data() + i, 8);
    EXPECT_EQ(around, 0u) << "at " << i;
  }
}

TEST_F(PlacementTest, AtomicWriteToAnUnalignedAddressIsAnInvalidRequest) {
  ASSERT_NO_FATAL_FAILURE(Pair());
  ASSERT_EQ(AtomicWrite(1, mr_->rkey, At(68), 42), 0);
  EXPECT_EQ(Wait(1).status, IBV_WC_REM_INV_REQ_ERR);
  uint64_t untouched;
  std::memcpy(&untouched, buf_.data() + 64, 8);
  EXPECT_EQ(untouched, 0u);
}

TEST_F(PlacementTest, AtomicWriteNeedsRemoteWriteOnTheRegion) {
  ASSERT_NO_FATAL_FAILURE(Pair());
  std::vector<uint8_t> other(4096, 0);
  ibv_mr* read_only = ibv_reg_mr(pd_, other.data(), other.size(), IBV_ACCESS_REMOTE_READ);
  ASSERT_NE(read_only, nullptr);
  ASSERT_EQ(AtomicWrite(2, read_only->rkey, reinterpret_cast<uintptr_t>(other.data()), 42), 0);
  EXPECT_EQ(Wait(2).status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(other[0], 0);
  ASSERT_EQ(ibv_dereg_mr(read_only), 0);
}

TEST_F(PlacementTest, AtomicWriteNeedsRemoteWriteOnTheQp) {
  ASSERT_NO_FATAL_FAILURE(Pair(IBV_ACCESS_REMOTE_READ));
  ASSERT_EQ(AtomicWrite(3, mr_->rkey, At(64), 42), 0);
  EXPECT_EQ(Wait(3).status, IBV_WC_REM_INV_REQ_ERR);
}

TEST_F(PlacementTest, FlushOfARangeAndOfTheWholeRegionComplete) {
  ASSERT_NO_FATAL_FAILURE(Pair());
  ASSERT_EQ(AtomicWrite(4, mr_->rkey, At(0), 5), 0);
  ASSERT_EQ(Flush(5, mr_->rkey, At(0), 4096, kFlushGlobal, kFlushRange), 0);
  ibv_wc w = Wait(4);
  EXPECT_EQ(w.status, IBV_WC_SUCCESS);
  ibv_wc f = Wait(5);
  EXPECT_EQ(f.status, IBV_WC_SUCCESS) << ibv_wc_status_str(f.status);
  EXPECT_EQ(static_cast<int>(f.opcode), kWcFlush);
  // The whole region: the address and length are not looked at.
  ASSERT_EQ(Flush(6, mr_->rkey, 0, 0, kFlushGlobal, kFlushMr), 0);
  EXPECT_EQ(Wait(6).status, IBV_WC_SUCCESS);
}

TEST_F(PlacementTest, FlushOutsideTheRegionOrWithoutTheRightIsARemoteAccessError) {
  ASSERT_NO_FATAL_FAILURE(Pair());
  ASSERT_EQ(Flush(1, mr_->rkey, At(0), buf_.size() + 1, kFlushGlobal, kFlushRange), 0);
  EXPECT_EQ(Wait(1).status, IBV_WC_REM_ACCESS_ERR);
}

TEST_F(PlacementTest, FlushNeedsTheFlushRightOnTheRegion) {
  ASSERT_NO_FATAL_FAILURE(Pair());
  std::vector<uint8_t> other(4096, 0);
  ibv_mr* no_flush = ibv_reg_mr(pd_, other.data(), other.size(),
                                IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(no_flush, nullptr);
  ASSERT_EQ(Flush(2, no_flush->rkey, reinterpret_cast<uintptr_t>(other.data()), 64, kFlushGlobal,
                  kFlushRange),
            0);
  EXPECT_EQ(Wait(2).status, IBV_WC_REM_ACCESS_ERR);
  ASSERT_EQ(ibv_dereg_mr(no_flush), 0);
}

TEST_F(PlacementTest, FlushNeedsTheFlushRightOnTheQp) {
  ASSERT_NO_FATAL_FAILURE(Pair(IBV_ACCESS_REMOTE_WRITE));
  ASSERT_EQ(Flush(3, mr_->rkey, At(0), 64, kFlushGlobal, kFlushRange), 0);
  EXPECT_EQ(Wait(3).status, IBV_WC_REM_INV_REQ_ERR);
}

TEST_F(PlacementTest, PersistentFlushFindsNoPersistentMemory) {
  std::vector<uint8_t> other(4096, 0);
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(pd_, other.data(), other.size(),
                       IBV_ACCESS_LOCAL_WRITE | kAccessFlushPersistent),
            nullptr);
  EXPECT_EQ(errno, EINVAL);
  // Asked of a region that may only be flushed globally.
  ASSERT_NO_FATAL_FAILURE(Pair(IBV_ACCESS_REMOTE_WRITE | kAccessFlushGlobal | kAccessFlushPersistent));
  ASSERT_EQ(Flush(4, mr_->rkey, At(0), 64, kFlushPersistent, kFlushRange), 0);
  EXPECT_EQ(Wait(4).status, IBV_WC_REM_ACCESS_ERR);
}

TEST_F(PlacementTest, BadFlushArgumentsFailTheBatch) {
  ASSERT_NO_FATAL_FAILURE(Pair());
  EXPECT_EQ(Flush(1, mr_->rkey, At(0), 64, 0, kFlushRange), EINVAL);
  EXPECT_EQ(Flush(1, mr_->rkey, At(0), 64, 4, kFlushRange), EINVAL);
  EXPECT_EQ(Flush(1, mr_->rkey, At(0), 64, kFlushGlobal, 2), EINVAL);
  ibv_wc wc;
  EXPECT_EQ(ibv_poll_cq(cq_, 1, &wc), 0);  // nothing was posted
}

TEST_F(PlacementTest, OnlyTheExtendedPostApiPostsThem) {
  ASSERT_NO_FATAL_FAILURE(Pair());
  ibv_sge sge = Sge(0, 8);
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_ATOMIC_WRITE;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.wr.rdma.remote_addr = At(64);
  wr.wr.rdma.rkey = mr_->rkey;
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(a_, &wr, &bad), EINVAL);
  EXPECT_EQ(bad, &wr);
}

TEST_F(PlacementTest, OnlyRcQpsCarryThem) {
  errno = 0;
  EXPECT_EQ(CreateRcEx(IBV_QP_EX_WITH_ATOMIC_WRITE, IBV_QPT_UC), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  errno = 0;
  EXPECT_EQ(CreateRcEx(kQpExWithFlush, IBV_QPT_UD), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
}

TEST_F(PlacementTest, AQpCreatedWithoutTheOpFailsTheBatch) {
  a_ = CreateRcEx(IBV_QP_EX_WITH_RDMA_WRITE);
  ASSERT_NE(a_, nullptr);
  EXPECT_EQ(AtomicWrite(1, mr_->rkey, At(64), 1), EOPNOTSUPP);
}

}  // namespace
}  // namespace rdmaemu::testing
