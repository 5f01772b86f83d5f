// XRC through the verbs API, on one device in one process: XRC domains
// (private, and shared through a file), XRC SRQs, XRC_SEND and XRC_RECV
// QPs, ibv_open_qp, traffic into the SRQ an XRCETH names, and the errors a
// NIC and its driver give for bad input.
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <unistd.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/integration/rc_pair.h"

namespace rdmaemu::testing {
namespace {

class XrcTest : public RcPairTest {
 protected:
  void SetUp() override {
    RcPairTest::SetUp();
    char path[] = "/tmp/rdmaemu-xrc-XXXXXX";
    fd_ = mkstemp(path);
    ASSERT_GE(fd_, 0);
    path_ = path;
  }
  void DestroyExtras() override {
    for (ibv_srq* srq : srqs_) EXPECT_EQ(ibv_destroy_srq(srq), 0);
    for (ibv_xrcd* x : xrcds_) EXPECT_EQ(ibv_close_xrcd(x), 0);
    if (fd_ >= 0) close(fd_);
    if (!path_.empty()) unlink(path_.c_str());
  }

  ibv_xrcd* OpenXrcd(int fd, int oflags) {
    ibv_xrcd_init_attr a{};
    a.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    a.fd = fd;
    a.oflags = oflags;
    ibv_xrcd* x = ibv_open_xrcd(ctx_, &a);
    if (x != nullptr) xrcds_.push_back(x);
    return x;
  }
  ibv_srq* XrcSrq(ibv_xrcd* xrcd, uint32_t max_wr = 16) {
    ibv_srq_init_attr_ex a{};
    a.attr.max_wr = max_wr;
    a.attr.max_sge = 1;
    a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ |
                  IBV_SRQ_INIT_ATTR_PD;
    a.srq_type = IBV_SRQT_XRC;
    a.xrcd = xrcd;
    a.cq = cq_;
    a.pd = pd_;
    ibv_srq* srq = ibv_create_srq_ex(ctx_, &a);
    if (srq != nullptr) srqs_.push_back(srq);
    return srq;
  }
  ibv_qp* Initiator() {
    ibv_qp_init_attr_ex a{};
    a.qp_type = IBV_QPT_XRC_SEND;
    a.send_cq = cq_;
    a.cap.max_send_wr = 16;
    a.cap.max_send_sge = 1;
    a.comp_mask = IBV_QP_INIT_ATTR_PD;
    a.pd = pd_;
    return Own(ibv_create_qp_ex(ctx_, &a));
  }
  ibv_qp* Target(ibv_xrcd* xrcd) {
    ibv_qp_init_attr_ex a{};
    a.qp_type = IBV_QPT_XRC_RECV;
    a.comp_mask = IBV_QP_INIT_ATTR_XRCD;
    a.xrcd = xrcd;
    return Own(ibv_create_qp_ex(ctx_, &a));
  }
  // As ibv_xsrq_pingpong connects them: the initiator takes no receive-side
  // attributes, the target no send-side ones.
  void ConnectXrc(ibv_qp* ini, ibv_qp* tgt) {
    const ibv_ah_attr av = Av(Gid(1), 1);
    ASSERT_EQ(ToInit(ini), 0);
    ASSERT_EQ(ToInit(tgt), 0);
    ASSERT_EQ(ToRtr(tgt, ini->qp_num, av), 0);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.sq_psn = 100;
    ASSERT_EQ(ibv_modify_qp(tgt, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN), 0);
    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = tgt->qp_num;
    a.rq_psn = 100;
    a.ah_attr = av;
    ASSERT_EQ(ibv_modify_qp(ini, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                         IBV_QP_RQ_PSN),
              0);
    ASSERT_EQ(ToRts(ini), 0);
  }
  int PostSrqRecv(ibv_srq* srq, uint64_t wr_id, ibv_sge sge) {
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    return ibv_post_srq_recv(srq, &wr, &bad);
  }
  int PostXrc(ibv_qp* ini, uint64_t wr_id, ibv_wr_opcode op, ibv_sge sge, uint32_t srqn,
              size_t remote = 0) {
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.qp_type.xrc.remote_srqn = srqn;
    wr.wr.rdma.remote_addr = At(remote);
    wr.wr.rdma.rkey = mr_->rkey;
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(ini, &wr, &bad);
  }
  uint32_t SrqNum(ibv_srq* srq) {
    uint32_t n = 0;
    EXPECT_EQ(ibv_get_srq_num(srq, &n), 0);
    return n;
  }
  // The completion of `wr_id` for QP number `qpn` (a receive into an XRC SRQ
  // carries the target's QPN).
  bool CompletionOf(uint32_t qpn, uint64_t wr_id, ibv_wc* out) {
    ibv_qp fake{};
    fake.qp_num = qpn;
    return Completion(&fake, wr_id, out);
  }

  int fd_ = -1;
  std::string path_;
  std::vector<ibv_srq*> srqs_;
  std::vector<ibv_xrcd*> xrcds_;
};

TEST_F(XrcTest, TheDeviceSaysItHasXrc) {
  ibv_device_attr attr{};
  ASSERT_EQ(ibv_query_device(ctx_, &attr), 0);
  EXPECT_TRUE(attr.device_cap_flags & IBV_DEVICE_XRC);
}

TEST_F(XrcTest, SendLandsInTheSrqTheXrcethNames) {
  ibv_xrcd* xrcd = OpenXrcd(-1, 0);
  ASSERT_NE(xrcd, nullptr);
  ibv_srq* srq_a = XrcSrq(xrcd);
  ibv_srq* srq_b = XrcSrq(xrcd);
  ASSERT_NE(srq_a, nullptr);
  ASSERT_NE(srq_b, nullptr);
  EXPECT_NE(SrqNum(srq_a), SrqNum(srq_b));
  ibv_qp* ini = Initiator();
  ibv_qp* tgt = Target(xrcd);
  ASSERT_NE(ini, nullptr);
  ASSERT_NE(tgt, nullptr);
  ASSERT_NO_FATAL_FAILURE(ConnectXrc(ini, tgt));
  ASSERT_EQ(PostSrqRecv(srq_a, 1, Sge(4096, 64)), 0);
  ASSERT_EQ(PostSrqRecv(srq_b, 2, Sge(8192, 64)), 0);
  std::memcpy(buf_.data(), "to B", 5);
  ASSERT_EQ(PostXrc(ini, 10, IBV_WR_SEND, Sge(0, 5), SrqNum(srq_b)), 0);
  ibv_wc wc{};
  ASSERT_TRUE(Completion(ini, 10, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  ASSERT_TRUE(CompletionOf(tgt->qp_num, 2, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.opcode, IBV_WC_RECV);
  EXPECT_EQ(wc.byte_len, 5u);
  EXPECT_STREQ(reinterpret_cast<const char*>(buf_.data() + 8192), "to B");
  // SRQ A's receive is still there: the message went to B only.
  std::memcpy(buf_.data(), "to A", 5);
  ASSERT_EQ(PostXrc(ini, 11, IBV_WR_SEND, Sge(0, 5), SrqNum(srq_a)), 0);
  ASSERT_TRUE(CompletionOf(tgt->qp_num, 1, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_STREQ(reinterpret_cast<const char*>(buf_.data() + 4096), "to A");
}

// (XRC atomics: rdma-core's test_atomic test_xrc_*, tests/e2e/pyverbs.)
TEST_F(XrcTest, WriteAndReadReachTheTarget) {
  ibv_xrcd* xrcd = OpenXrcd(-1, 0);
  ibv_srq* srq = XrcSrq(xrcd);
  ibv_qp* ini = Initiator();
  ibv_qp* tgt = Target(xrcd);
  ASSERT_NE(tgt, nullptr);
  ASSERT_NO_FATAL_FAILURE(ConnectXrc(ini, tgt));
  // Longer than one MTU: FIRST, MIDDLE and LAST each carry the XRCETH.
  for (int i = 0; i < 3000; ++i) buf_[i] = static_cast<uint8_t>(i * 7);
  ASSERT_EQ(PostXrc(ini, 1, IBV_WR_RDMA_WRITE, Sge(0, 3000), SrqNum(srq), 65536), 0);
  ibv_wc wc{};
  ASSERT_TRUE(Completion(ini, 1, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(std::memcmp(buf_.data(), buf_.data() + 65536, 3000), 0);
  ASSERT_EQ(PostXrc(ini, 2, IBV_WR_RDMA_READ, Sge(131072, 3000), SrqNum(srq), 65536), 0);
  ASSERT_TRUE(Completion(ini, 2, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(std::memcmp(buf_.data(), buf_.data() + 131072, 3000), 0);
}

// IBA's XRC responder check: an XRCETH that names no XRC SRQ of the
// target's domain is an invalid request; the sender's WR fails with
// IBV_WC_REM_INV_REQ_ERR.
TEST_F(XrcTest, AnUnknownSrqNumberIsAnInvalidRequest) {
  ibv_xrcd* xrcd = OpenXrcd(-1, 0);
  ibv_srq* srq = XrcSrq(xrcd);
  ibv_qp* ini = Initiator();
  ibv_qp* tgt = Target(xrcd);
  ASSERT_NO_FATAL_FAILURE(ConnectXrc(ini, tgt));
  ASSERT_EQ(PostSrqRecv(srq, 1, Sge(4096, 64)), 0);
  ASSERT_EQ(PostXrc(ini, 5, IBV_WR_SEND, Sge(0, 8), SrqNum(srq) + 1000), 0);
  ibv_wc wc{};
  ASSERT_TRUE(Completion(ini, 5, &wc));
  EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR) << ibv_wc_status_str(wc.status);
  // The SRQ's receive was not consumed.
  ibv_srq_attr sa{};
  ASSERT_EQ(ibv_query_srq(srq, &sa), 0);
  EXPECT_FALSE(CompletionOf(tgt->qp_num, 1, &wc));
}

TEST_F(XrcTest, AnSrqOfAnotherDomainIsAnInvalidRequest) {
  ibv_xrcd* mine = OpenXrcd(-1, 0);
  ibv_xrcd* other = OpenXrcd(-1, 0);
  ibv_srq* foreign = XrcSrq(other);
  ibv_qp* ini = Initiator();
  ibv_qp* tgt = Target(mine);
  ASSERT_NO_FATAL_FAILURE(ConnectXrc(ini, tgt));
  ASSERT_EQ(PostSrqRecv(foreign, 1, Sge(4096, 64)), 0);
  ASSERT_EQ(PostXrc(ini, 5, IBV_WR_SEND, Sge(0, 8), SrqNum(foreign)), 0);
  ibv_wc wc{};
  ASSERT_TRUE(Completion(ini, 5, &wc));
  EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR) << ibv_wc_status_str(wc.status);
}

// The same file gives the same domain: a target of one handle delivers into
// an SRQ of the other.
TEST_F(XrcTest, AFileSharesItsDomain) {
  ibv_xrcd* first = OpenXrcd(fd_, O_CREAT);
  ASSERT_NE(first, nullptr);
  int again = open(path_.c_str(), O_RDONLY);
  ASSERT_GE(again, 0);
  ibv_xrcd* second = OpenXrcd(again, 0);  // exists: no O_CREAT needed
  close(again);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(OpenXrcd(fd_, O_CREAT | O_EXCL), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_srq* srq = XrcSrq(second);
  ibv_qp* ini = Initiator();
  ibv_qp* tgt = Target(first);
  ASSERT_NO_FATAL_FAILURE(ConnectXrc(ini, tgt));
  ASSERT_EQ(PostSrqRecv(srq, 1, Sge(4096, 64)), 0);
  ASSERT_EQ(PostXrc(ini, 5, IBV_WR_SEND, Sge(0, 8), SrqNum(srq)), 0);
  ibv_wc wc{};
  ASSERT_TRUE(CompletionOf(tgt->qp_num, 1, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
}

TEST_F(XrcTest, OpenXrcdRefusesWhatTheKernelRefuses) {
  // A file that names no domain yet, without O_CREAT: the kernel's EAGAIN.
  EXPECT_EQ(OpenXrcd(fd_, 0), nullptr);
  EXPECT_EQ(errno, EAGAIN);
  EXPECT_EQ(OpenXrcd(1000000, O_CREAT), nullptr);
  EXPECT_EQ(errno, EBADF);
  ibv_xrcd_init_attr a{};
  a.comp_mask = IBV_XRCD_INIT_ATTR_FD;  // no OFLAGS
  a.fd = -1;
  EXPECT_EQ(ibv_open_xrcd(ctx_, &a), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(XrcTest, AnXrcdInUseIsNotClosed) {
  ibv_xrcd* xrcd = OpenXrcd(-1, 0);
  ibv_srq* srq = XrcSrq(xrcd);
  ASSERT_NE(srq, nullptr);
  EXPECT_EQ(ibv_close_xrcd(xrcd), EBUSY);
  ASSERT_EQ(ibv_destroy_srq(srq), 0);
  srqs_.clear();
  EXPECT_EQ(ibv_close_xrcd(xrcd), 0);
  xrcds_.clear();
}

TEST_F(XrcTest, OpenQpGivesAnotherHandleToTheTarget) {
  ibv_xrcd* xrcd = OpenXrcd(-1, 0);
  ibv_srq* srq = XrcSrq(xrcd);
  ibv_qp* ini = Initiator();
  ibv_qp* tgt = Target(xrcd);
  ASSERT_NE(tgt, nullptr);
  ibv_qp_open_attr oa{};
  oa.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
  oa.qp_num = tgt->qp_num;
  oa.xrcd = xrcd;
  oa.qp_type = IBV_QPT_XRC_RECV;
  ibv_qp* opened = ibv_open_qp(ctx_, &oa);
  ASSERT_NE(opened, nullptr);
  EXPECT_EQ(opened->qp_num, tgt->qp_num);
  ASSERT_NO_FATAL_FAILURE(ConnectXrc(ini, tgt));
  EXPECT_EQ(Query(opened).qp_state, IBV_QPS_RTS);
  // The creator's handle goes; the target lives on through the other.
  ASSERT_EQ(ibv_destroy_qp(tgt), 0);
  Forget(tgt);
  ASSERT_EQ(PostSrqRecv(srq, 1, Sge(4096, 64)), 0);
  ASSERT_EQ(PostXrc(ini, 5, IBV_WR_SEND, Sge(0, 8), SrqNum(srq)), 0);
  ibv_wc wc{};
  ASSERT_TRUE(CompletionOf(opened->qp_num, 1, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  EXPECT_EQ(ibv_modify_qp(opened, &a, IBV_QP_STATE), 0);
  EXPECT_EQ(Query(opened).qp_state, IBV_QPS_ERR);
  EXPECT_EQ(ibv_destroy_qp(opened), 0);
  // Gone with its last handle.
  EXPECT_EQ(ibv_open_qp(ctx_, &oa), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(XrcTest, OpenQpRefusesAWrongNumberDomainOrType) {
  ibv_xrcd* xrcd = OpenXrcd(-1, 0);
  ibv_xrcd* other = OpenXrcd(-1, 0);
  ibv_qp* tgt = Target(xrcd);
  ibv_qp* ini = Initiator();
  ibv_qp_open_attr oa{};
  oa.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
  oa.qp_type = IBV_QPT_XRC_RECV;
  oa.xrcd = other;
  oa.qp_num = tgt->qp_num;
  EXPECT_EQ(ibv_open_qp(ctx_, &oa), nullptr);
  EXPECT_EQ(errno, EINVAL);
  oa.xrcd = xrcd;
  oa.qp_num = ini->qp_num;
  EXPECT_EQ(ibv_open_qp(ctx_, &oa), nullptr);
  EXPECT_EQ(errno, EINVAL);
  oa.qp_num = tgt->qp_num;
  oa.qp_type = IBV_QPT_RC;
  EXPECT_EQ(ibv_open_qp(ctx_, &oa), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(XrcTest, BadInputIsRefused) {
  ibv_xrcd* xrcd = OpenXrcd(-1, 0);
  // A target without its domain.
  ibv_qp_init_attr_ex qa{};
  qa.qp_type = IBV_QPT_XRC_RECV;
  EXPECT_EQ(ibv_create_qp_ex(ctx_, &qa), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // An XRC SRQ without its CQ; a tag-matching SRQ without its CQ and sizes
  // (tag_matching_test.cc has the rest).
  ibv_srq_init_attr_ex sa{};
  sa.attr.max_wr = 4;
  sa.attr.max_sge = 1;
  sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_PD;
  sa.srq_type = IBV_SRQT_XRC;
  sa.xrcd = xrcd;
  sa.pd = pd_;
  EXPECT_EQ(ibv_create_srq_ex(ctx_, &sa), nullptr);
  EXPECT_EQ(errno, EINVAL);
  sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
  sa.srq_type = IBV_SRQT_TM;
  EXPECT_EQ(ibv_create_srq_ex(ctx_, &sa), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_qp* ini = Initiator();
  ibv_qp* tgt = Target(xrcd);
  ASSERT_NE(ini, nullptr);
  ASSERT_NE(tgt, nullptr);
  // Neither has a receive queue; a target has no send queue.
  EXPECT_EQ(PostRecv(ini, 1, Sge(0, 8)), EINVAL);
  EXPECT_EQ(PostRecv(tgt, 1, Sge(0, 8)), EINVAL);
  ASSERT_NO_FATAL_FAILURE(ConnectXrc(ini, tgt));
  EXPECT_EQ(PostXrc(tgt, 1, IBV_WR_SEND, Sge(0, 8), 1), EINVAL);
  // The XRCETH has 24 bits for the SRQ number.
  EXPECT_EQ(PostXrc(ini, 1, IBV_WR_SEND, Sge(0, 8), 0x1000000), EINVAL);
  // An initiator takes no receive-side attribute.
  ibv_qp* ini2 = Initiator();
  ASSERT_EQ(ToInit(ini2), 0);
  EXPECT_EQ(ToRtr(ini2, tgt->qp_num, Av(Gid(1), 1)), EINVAL);
}

TEST_F(XrcTest, TheExtendedPostApiSetsTheSrqNumber) {
  ibv_xrcd* xrcd = OpenXrcd(-1, 0);
  ibv_srq* srq = XrcSrq(xrcd);
  ibv_qp_init_attr_ex a{};
  a.qp_type = IBV_QPT_XRC_SEND;
  a.send_cq = cq_;
  a.cap.max_send_wr = 16;
  a.cap.max_send_sge = 1;
  a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  a.pd = pd_;
  a.send_ops_flags = IBV_QP_EX_WITH_SEND;
  ibv_qp* ini = Own(ibv_create_qp_ex(ctx_, &a));
  ASSERT_NE(ini, nullptr);
  ibv_qp* tgt = Target(xrcd);
  ASSERT_NO_FATAL_FAILURE(ConnectXrc(ini, tgt));
  ASSERT_EQ(PostSrqRecv(srq, 1, Sge(4096, 64)), 0);
  ibv_qp_ex* qx = ibv_qp_to_qp_ex(ini);
  ASSERT_NE(qx, nullptr);
  ibv_wr_start(qx);
  qx->wr_id = 9;
  qx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(qx);
  ibv_wr_set_xrc_srqn(qx, SrqNum(srq));
  ibv_wr_set_sge(qx, mr_->lkey, At(0), 8);
  ASSERT_EQ(ibv_wr_complete(qx), 0);
  ibv_wc wc{};
  ASSERT_TRUE(CompletionOf(tgt->qp_num, 1, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
}

}  // namespace
}  // namespace rdmaemu::testing
