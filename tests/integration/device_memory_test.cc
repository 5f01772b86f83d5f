// Device memory through the verbs API (ibv_alloc_dm(3)): allocation and its
// limits, the copies in and out, zero-based regions over it, and RC traffic
// that reads and writes it as a local SGE and as the target of a peer's
// RDMA WRITE, READ and atomics; each bad input refused with the errno of
// the kernel and libmlx5. Run once per engine backend.
#include <infiniband/verbs.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tests/integration/rc_pair.h"

namespace rdmaemu::testing {
namespace {

constexpr unsigned kDmAccess = IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE |
                               IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                               IBV_ACCESS_REMOTE_ATOMIC;

class DeviceMemoryTest : public RcPairTest {
 protected:
  void SetUp() override {
    RcPairTest::SetUp();
    ibv_device_attr_ex attr{};
    ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &attr), 0);
    max_dm_size_ = attr.max_dm_size;
  }

  ibv_dm* Alloc(size_t length, uint32_t log_align = 0) {
    ibv_alloc_dm_attr a{};
    a.length = length;
    a.log_align_req = log_align;
    ibv_dm* dm = ibv_alloc_dm(ctx_, &a);
    if (dm != nullptr) dms_.push_back(dm);
    return dm;
  }
  int Free(ibv_dm* dm) {
    int rc = ibv_free_dm(dm);
    if (rc == 0) dms_.erase(std::remove(dms_.begin(), dms_.end(), dm), dms_.end());
    return rc;
  }
  ibv_mr* RegDm(ibv_dm* dm, uint64_t offset, size_t length, unsigned access = kDmAccess) {
    ibv_mr* mr = ibv_reg_dm_mr(pd_, dm, offset, length, access);
    if (mr != nullptr) dm_mrs_.push_back(mr);
    return mr;
  }
  void DestroyExtras() override {
    for (ibv_mr* mr : dm_mrs_) EXPECT_EQ(ibv_dereg_mr(mr), 0);
    for (ibv_dm* dm : dms_) EXPECT_EQ(ibv_free_dm(dm), 0);
  }

  // Two connected RC QPs whose peers may read, write and do atomics.
  void ConnectForAtomics(ibv_qp* a, ibv_qp* b) {
    ibv_gid gid = Gid(1);
    for (auto [qp, peer] : {std::pair{a, b}, std::pair{b, a}}) {
      ibv_qp_attr init{};
      init.qp_state = IBV_QPS_INIT;
      init.port_num = 1;
      init.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
      ASSERT_EQ(ibv_modify_qp(qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                             IBV_QP_ACCESS_FLAGS), 0);
      ASSERT_EQ(ToRtr(qp, peer->qp_num, Av(gid, 1)), 0);
      ASSERT_EQ(ToRts(qp), 0);
    }
  }

  int Post(ibv_qp* qp, ibv_send_wr wr, ibv_sge sge) {
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags |= IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(qp, &wr, &bad);
  }
  ibv_wc Wait(ibv_qp* qp, uint64_t wr_id) {
    ibv_wc wc{};
    EXPECT_TRUE(Completion(qp, wr_id, &wc)) << "no completion for wr_id " << wr_id;
    return wc;
  }
  std::string Read(ibv_dm* dm, uint64_t offset, size_t length) {
    std::string out(length, '\0');
    EXPECT_EQ(ibv_memcpy_from_dm(out.data(), dm, offset, length), 0);
    return out;
  }

  uint64_t max_dm_size_ = 0;
  std::vector<ibv_dm*> dms_;
  std::vector<ibv_mr*> dm_mrs_;
};

TEST_F(DeviceMemoryTest, QueryDeviceExReportsTheDevicesMemory) {
  EXPECT_EQ(max_dm_size_, 256u * 1024);
}

TEST_F(DeviceMemoryTest, AllocCopyAndFree) {
  ibv_dm* dm = Alloc(4096, 6);
  ASSERT_NE(dm, nullptr) << std::strerror(errno);
  EXPECT_EQ(dm->context, ctx_);
  EXPECT_EQ(dm->comp_mask, static_cast<uint32_t>(IBV_DM_MASK_HANDLE));
  EXPECT_EQ(Read(dm, 0, 8), std::string(8, '\0')) << "a new DM reads as zeros";
  const std::string text = "written to the device's memory..";  // 32 bytes
  ASSERT_EQ(ibv_memcpy_to_dm(dm, 64, text.data(), text.size()), 0);
  EXPECT_EQ(Read(dm, 64, text.size()), text);
  EXPECT_EQ(Free(dm), 0);
}

TEST_F(DeviceMemoryTest, AllocRefusesBadRequestsAndRunsOut) {
  ibv_alloc_dm_attr a{};
  a.length = 64;
  a.comp_mask = 1;
  errno = 0;
  EXPECT_EQ(ibv_alloc_dm(ctx_, &a), nullptr);
  EXPECT_EQ(errno, EINVAL) << "unknown comp_mask";
  errno = 0;
  EXPECT_EQ(Alloc(0), nullptr);
  EXPECT_EQ(errno, EINVAL) << "length 0";
  errno = 0;
  EXPECT_EQ(Alloc(max_dm_size_ + 4), nullptr);
  EXPECT_EQ(errno, EINVAL) << "more than max_dm_size (libmlx5's check)";
  errno = 0;
  EXPECT_EQ(Alloc(64, 13), nullptr);
  EXPECT_EQ(errno, EINVAL) << "alignment above a page";

  ibv_dm* half = Alloc(max_dm_size_ / 2);
  ASSERT_NE(half, nullptr) << std::strerror(errno);
  ibv_dm* other_half = Alloc(max_dm_size_ / 2);
  ASSERT_NE(other_half, nullptr) << std::strerror(errno);
  errno = 0;
  EXPECT_EQ(Alloc(64), nullptr);
  EXPECT_EQ(errno, ENOMEM) << "the device's memory is all in use";
  ASSERT_EQ(Free(half), 0);
  EXPECT_NE(Alloc(64), nullptr) << "freed memory comes back";
}

TEST_F(DeviceMemoryTest, CopiesAreCheckedLikeLibmlx5s) {
  ibv_dm* dm = Alloc(100);
  ASSERT_NE(dm, nullptr);
  char buf[128] = {};
  EXPECT_EQ(ibv_memcpy_to_dm(dm, 3, buf, 4), EINVAL) << "unaligned offset";
  EXPECT_EQ(ibv_memcpy_from_dm(buf, dm, 4, 3), EINVAL) << "unaligned length";
  EXPECT_EQ(ibv_memcpy_to_dm(dm, 104, buf, 4), EFAULT) << "beyond the DM";
  EXPECT_EQ(ibv_memcpy_from_dm(buf, dm, 0, 104), EFAULT) << "beyond the DM";
  EXPECT_EQ(ibv_memcpy_to_dm(dm, 96, buf, 4), 0);
}

TEST_F(DeviceMemoryTest, RegDmMrChecksAccessAndRange) {
  ibv_dm* dm = Alloc(256);
  ASSERT_NE(dm, nullptr);
  errno = 0;
  EXPECT_EQ(RegDm(dm, 0, 256, IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL) << "not zero-based";
  errno = 0;
  EXPECT_EQ(RegDm(dm, 0, 256, IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND),
            nullptr);
  EXPECT_EQ(errno, EINVAL) << "windows cannot bind to device memory";
  errno = 0;
  EXPECT_EQ(RegDm(dm, 0, 256, IBV_ACCESS_ZERO_BASED | IBV_ACCESS_REMOTE_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL) << "remote write without local write";
  errno = 0;
  EXPECT_EQ(RegDm(dm, 0, 260), nullptr);
  EXPECT_EQ(errno, EINVAL) << "longer than the DM";
  errno = 0;
  EXPECT_EQ(RegDm(dm, 200, 64), nullptr);
  EXPECT_EQ(errno, EINVAL) << "offset + length beyond the DM";

  ibv_mr* empty = RegDm(dm, 256, 0);
  EXPECT_NE(empty, nullptr) << "a zero-length region at the end: the kernel takes it";
  ibv_mr* mr = RegDm(dm, 64, 128);
  ASSERT_NE(mr, nullptr) << std::strerror(errno);
  EXPECT_EQ(mr->addr, nullptr) << "rdma-core's ibv_cmd_reg_dm_mr leaves addr NULL";
  EXPECT_EQ(mr->length, 128u);
  EXPECT_EQ(mr->pd, pd_);
  EXPECT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_LOCAL_WRITE),
            IBV_REREG_MR_ERR_INPUT);
  EXPECT_EQ(errno, EINVAL) << "a DM region cannot be reregistered (the kernel refuses it)";
}

// The kernel refuses to free a DM an MR still registers (uverbs_free_dm).
TEST_F(DeviceMemoryTest, FreeWhileRegisteredIsBusy) {
  ibv_dm* dm = Alloc(128);
  ASSERT_NE(dm, nullptr);
  ibv_mr* mr = ibv_reg_dm_mr(pd_, dm, 0, 128, kDmAccess);
  ASSERT_NE(mr, nullptr) << std::strerror(errno);
  EXPECT_EQ(ibv_free_dm(dm), EBUSY);
  EXPECT_EQ(ibv_dealloc_pd(pd_), EBUSY) << "the DM region uses the PD";
  ASSERT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(Free(dm), 0);
}

// The DM region as the local SGE of a SEND, and as the receive buffer.
TEST_F(DeviceMemoryTest, SendsFromAndReceivesIntoDeviceMemory) {
  ibv_dm* dm = Alloc(1024);
  ASSERT_NE(dm, nullptr);
  ibv_mr* mr = RegDm(dm, 256, 512);  // offsets in SGEs count from DM byte 256
  ASSERT_NE(mr, nullptr) << std::strerror(errno);
  ibv_qp* a = CreateRc();
  ibv_qp* b = CreateRc();
  ASSERT_NO_FATAL_FAILURE(Connect(a, b));

  const std::string msg(300, 'd');
  ASSERT_EQ(ibv_memcpy_to_dm(dm, 256 + 100, msg.data(), 300), 0);
  ASSERT_EQ(PostRecv(b, 1, Sge(0, 512)), 0);
  ibv_send_wr wr{};
  wr.wr_id = 2;
  wr.opcode = IBV_WR_SEND;
  ASSERT_EQ(Post(a, wr, ibv_sge{100, 300, mr->lkey}), 0);
  EXPECT_EQ(Wait(a, 2).status, IBV_WC_SUCCESS);
  ibv_wc recv = Wait(b, 1);
  EXPECT_EQ(recv.status, IBV_WC_SUCCESS);
  EXPECT_EQ(recv.byte_len, 300u);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(buf_.data()), 300), msg);

  std::memset(buf_.data() + 4096, 'h', 200);
  ASSERT_EQ(PostRecv(b, 3, ibv_sge{8, 200, mr->lkey}), 0);
  wr.wr_id = 4;
  ASSERT_EQ(Post(a, wr, Sge(4096, 200)), 0);
  EXPECT_EQ(Wait(a, 4).status, IBV_WC_SUCCESS);
  EXPECT_EQ(Wait(b, 3).status, IBV_WC_SUCCESS);
  EXPECT_EQ(Read(dm, 256 + 8, 200), std::string(200, 'h'));
  EXPECT_EQ(Read(dm, 256, 8), std::string(8, '\0')) << "nothing before the SGE";

  wr.wr_id = 5;
  ASSERT_EQ(Post(a, wr, ibv_sge{500, 16, mr->lkey}), 0) << "checked when executed";
  EXPECT_EQ(Wait(a, 5).status, IBV_WC_LOC_PROT_ERR) << "an SGE beyond the DM region";
}

// A peer's RDMA WRITE, READ and atomics address the DM region by offset
// (remote_addr 0 is its first byte), with its rkey; beyond it, an error.
TEST_F(DeviceMemoryTest, PeerWritesReadsAndAtomicsTargetDeviceMemory) {
  ibv_dm* dm = Alloc(4096);
  ASSERT_NE(dm, nullptr);
  ibv_mr* mr = RegDm(dm, 1024, 2048);
  ASSERT_NE(mr, nullptr) << std::strerror(errno);
  ibv_qp* a = CreateRc();
  ibv_qp* b = CreateRc();
  ASSERT_NO_FATAL_FAILURE(ConnectForAtomics(a, b));

  std::memset(buf_.data(), 'w', 1500);  // more than one 1024-byte packet
  ibv_send_wr wr{};
  wr.wr_id = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.wr.rdma.remote_addr = 16;
  wr.wr.rdma.rkey = mr->rkey;
  ASSERT_EQ(Post(a, wr, Sge(0, 1500)), 0);
  ASSERT_EQ(Wait(a, 1).status, IBV_WC_SUCCESS);
  EXPECT_EQ(Read(dm, 1024 + 16, 1500), std::string(1500, 'w'));
  EXPECT_EQ(Read(dm, 1024, 16), std::string(16, '\0'));

  const std::string text = "read back from device memory....";  // 32 bytes
  ASSERT_EQ(ibv_memcpy_to_dm(dm, 1024 + 2000, text.data(), 32), 0);
  wr = {};
  wr.wr_id = 2;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.wr.rdma.remote_addr = 2000;
  wr.wr.rdma.rkey = mr->rkey;
  ASSERT_EQ(Post(a, wr, Sge(8192, 32)), 0);
  ASSERT_EQ(Wait(a, 2).status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(buf_.data() + 8192), 32), text);

  uint64_t value = 40;
  ASSERT_EQ(ibv_memcpy_to_dm(dm, 1024 + 1600, &value, 8), 0);
  wr = {};
  wr.wr_id = 3;
  wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
  wr.wr.atomic.remote_addr = 1600;
  wr.wr.atomic.rkey = mr->rkey;
  wr.wr.atomic.compare_add = 2;
  ASSERT_EQ(Post(a, wr, Sge(16384, 8)), 0);
  ASSERT_EQ(Wait(a, 3).status, IBV_WC_SUCCESS);
  uint64_t original = 0;
  std::memcpy(&original, buf_.data() + 16384, 8);
  EXPECT_EQ(original, 40u);
  wr.wr_id = 4;
  wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
  wr.wr.atomic.compare_add = 42;
  wr.wr.atomic.swap = 7;
  ASSERT_EQ(Post(a, wr, Sge(16384, 8)), 0);
  ASSERT_EQ(Wait(a, 4).status, IBV_WC_SUCCESS);
  ASSERT_EQ(ibv_memcpy_from_dm(&value, dm, 1024 + 1600, 8), 0);
  EXPECT_EQ(value, 7u) << "40 + 2, then swapped for 7";

  wr = {};
  wr.wr_id = 5;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.wr.rdma.remote_addr = 2040;  // 16 bytes from 8 before the end
  wr.wr.rdma.rkey = mr->rkey;
  ASSERT_EQ(Post(a, wr, Sge(0, 16)), 0);
  EXPECT_EQ(Wait(a, 5).status, IBV_WC_REM_ACCESS_ERR) << "beyond the DM region";
  EXPECT_EQ(Read(dm, 1024 + 2048, 16), std::string(16, '\0')) << "nothing past the region was written";
}

}  // namespace
}  // namespace rdmaemu::testing
