// ibv_import_device / ibv_import_pd / ibv_import_mr and the unimports
// (ibv_import_device(3), ibv_import_pd(3), ibv_import_mr(3)): a context
// imported from a dup of cmd_fd shares the device instance and the objects
// of the original, with traffic between the two; handles it does not hold
// fail with the kernel's errno; descriptors that are not a live context of
// this process (a fork child's included) fail with a clear errno.
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "tests/integration/rc_pair.h"

namespace rdmaemu::testing {
namespace {

class ImportTest : public RcPairTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(RcPairTest::SetUp());
    imported_ = ibv_import_device(dup(ctx_->cmd_fd));
    ASSERT_NE(imported_, nullptr) << "errno " << errno;
  }
  void TearDown() override {
    if (imported_ != nullptr) {
      EXPECT_EQ(ibv_close_device(imported_), 0);
    }
    RcPairTest::TearDown();
  }

  ibv_context* imported_ = nullptr;
};

TEST_F(ImportTest, ImportedPdAndMrNameTheSameObjects) {
  EXPECT_EQ(imported_->device, ctx_->device);
  EXPECT_NE(imported_->cmd_fd, ctx_->cmd_fd);
  ibv_pd* pd = ibv_import_pd(imported_, pd_->handle);
  ASSERT_NE(pd, nullptr) << "errno " << errno;
  EXPECT_EQ(pd->context, imported_);
  EXPECT_EQ(pd->handle, pd_->handle);
  ibv_mr* mr = ibv_import_mr(pd, mr_->handle);
  ASSERT_NE(mr, nullptr) << "errno " << errno;
  EXPECT_EQ(mr->context, imported_);
  EXPECT_EQ(mr->pd, pd);
  EXPECT_EQ(mr->handle, mr_->handle);
  EXPECT_EQ(mr->lkey, mr_->lkey);
  EXPECT_EQ(mr->rkey, mr_->rkey);
  EXPECT_EQ(mr->length, mr_->length);
  EXPECT_EQ(mr->addr, nullptr) << "rdma-core reports an imported MR's address as NULL";

  // The original PD is busy with what the imported context creates on it.
  ibv_cq* cq = ibv_create_cq(imported_, 16, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp_init_attr qa{};
  qa.send_cq = qa.recv_cq = cq;
  qa.qp_type = IBV_QPT_RC;
  qa.cap = {16, 16, 1, 1, 0};
  ibv_qp* far = ibv_create_qp(pd, &qa);
  ASSERT_NE(far, nullptr);
  ibv_qp* near = CreateRc();
  ASSERT_NE(near, nullptr);
  ASSERT_NO_FATAL_FAILURE(Connect(far, near));
  // Deregistering through the original ends the region for its import too.
  EXPECT_EQ(ibv_dereg_mr(mr_), 0);
  mr_ = nullptr;
  errno = 0;
  EXPECT_EQ(ibv_import_mr(pd, mr->handle), nullptr);
  EXPECT_EQ(errno, ENOENT);
  ibv_unimport_mr(mr);  // still accepted after the destroy through the other view
  errno = 0;
  EXPECT_EQ(ibv_dealloc_pd(pd_), EBUSY);

  // The imported context writes with an imported MR's lkey into memory it
  // names by the original's rkey.
  mr_ = ibv_reg_mr(pd_, buf_.data(), buf_.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(mr_, nullptr);
  mr = ibv_import_mr(pd, mr_->handle);
  ASSERT_NE(mr, nullptr);
  std::memset(buf_.data(), 0xa5, 256);
  ibv_sge sge{At(0), 256, mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = 7;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = At(4096);
  wr.wr.rdma.rkey = mr_->rkey;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(far, &wr, &bad), 0);
  ibv_wc wc{};
  int n = 0;
  for (int i = 0; i < 5000000 && n == 0; ++i) n = ibv_poll_cq(cq, 1, &wc);
  ASSERT_EQ(n, 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(buf_.data() + 4096, buf_.data(), 256), 0);

  ibv_unimport_mr(mr);
  EXPECT_EQ(ibv_destroy_qp(far), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  ibv_unimport_pd(pd);
  pd = ibv_import_pd(imported_, pd_->handle);
  EXPECT_NE(pd, nullptr) << "the PD outlives the unimport of a view";
  ibv_unimport_pd(pd);
}

TEST_F(ImportTest, UnknownHandlesAreEnoent) {
  errno = 0;
  EXPECT_EQ(ibv_import_pd(imported_, 0xdead), nullptr);
  EXPECT_EQ(errno, ENOENT);
  ibv_pd* pd = ibv_import_pd(imported_, pd_->handle);
  ASSERT_NE(pd, nullptr);
  errno = 0;
  EXPECT_EQ(ibv_import_mr(pd, 0xdead), nullptr);
  EXPECT_EQ(errno, ENOENT);

  // A context opened separately holds other handles (another file).
  ibv_context* separate = ibv_open_device(list_[0]);
  ASSERT_NE(separate, nullptr);
  errno = 0;
  EXPECT_EQ(ibv_import_pd(separate, pd_->handle), nullptr);
  EXPECT_EQ(errno, ENOENT);
  EXPECT_EQ(ibv_close_device(separate), 0);

  // An MR of another PD is refused.
  ibv_pd* other = ibv_alloc_pd(ctx_);
  ASSERT_NE(other, nullptr);
  errno = 0;
  EXPECT_EQ(ibv_import_mr(other, mr_->handle), nullptr);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(ibv_dealloc_pd(other), 0);
  ibv_unimport_pd(pd);
}

TEST_F(ImportTest, DeallocThroughAnImportDestroysThePdForEveryView) {
  ibv_pd* pd = ibv_alloc_pd(ctx_);
  ASSERT_NE(pd, nullptr);
  ibv_pd* view = ibv_import_pd(imported_, pd->handle);
  ASSERT_NE(view, nullptr);
  EXPECT_EQ(ibv_dealloc_pd(view), 0);
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(pd, buf_.data(), 64, IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL) << "the original names a destroyed PD";
  errno = 0;
  EXPECT_EQ(ibv_import_pd(imported_, pd->handle), nullptr);
  EXPECT_EQ(errno, ENOENT);
  ibv_unimport_pd(pd);  // the one verb a destroyed PD's other view still takes
}

// ibv_import_dm(3): a view of the same device memory, as pyverbs'
// SharedDMTest writes through one and reads through the other.
TEST_F(ImportTest, ImportedDmSharesTheMemoryAndItsRegions) {
  ibv_alloc_dm_attr attr{};
  attr.length = 4096;
  ibv_dm* dm = ibv_alloc_dm(ctx_, &attr);
  ASSERT_NE(dm, nullptr) << "errno " << errno;
  ibv_dm* view = ibv_import_dm(imported_, dm->handle);
  ASSERT_NE(view, nullptr) << "errno " << errno;
  EXPECT_EQ(view->handle, dm->handle);
  std::vector<uint8_t> out(4096, 0xab), in(4096, 0);
  ASSERT_EQ(ibv_memcpy_to_dm(dm, 0, out.data(), out.size()), 0);
  ASSERT_EQ(ibv_memcpy_from_dm(in.data(), view, 0, in.size()), 0);
  EXPECT_EQ(in, out);

  // A region registered through the view keeps the DM (through any view).
  ibv_pd* pd = ibv_alloc_pd(imported_);
  ASSERT_NE(pd, nullptr);
  ibv_mr* mr = ibv_reg_dm_mr(pd, view, 0, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ZERO_BASED);
  ASSERT_NE(mr, nullptr) << "errno " << errno;
  EXPECT_EQ(ibv_free_dm(dm), EBUSY);
  ASSERT_EQ(ibv_dereg_mr(mr), 0);
  ASSERT_EQ(ibv_dealloc_pd(pd), 0);

  ibv_unimport_dm(view);
  errno = 0;
  EXPECT_EQ(ibv_import_dm(imported_, dm->handle + 1000), nullptr);
  EXPECT_EQ(errno, ENOENT);
  // Freed through the original: the handle names nothing any more.
  ibv_dm* again = ibv_import_dm(imported_, dm->handle);
  ASSERT_NE(again, nullptr);
  const uint32_t handle = dm->handle;
  ASSERT_EQ(ibv_free_dm(dm), 0);
  EXPECT_EQ(ibv_memcpy_to_dm(again, 0, out.data(), 8), EINVAL) << "a freed DM's other view";
  ibv_unimport_dm(again);
  errno = 0;
  EXPECT_EQ(ibv_import_dm(imported_, handle), nullptr);
  EXPECT_EQ(errno, ENOENT);
}

TEST_F(ImportTest, DescriptorsThatAreNoLiveContextAreRefused) {
  errno = 0;
  EXPECT_EQ(ibv_import_device(-1), nullptr);
  EXPECT_EQ(errno, EINVAL);
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  errno = 0;
  EXPECT_EQ(ibv_import_device(pipe_fds[0]), nullptr);
  EXPECT_EQ(errno, EINVAL) << "not a character device";
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  const int null_fd = open("/dev/null", O_RDWR);
  ASSERT_GE(null_fd, 0);
  errno = 0;
  EXPECT_EQ(ibv_import_device(null_fd), nullptr);
  EXPECT_EQ(errno, ENODEV) << "a character device that is no RDMA device";
  close(null_fd);

  // The cmd_fd of a context closed since.
  ibv_context* closed = ibv_open_device(list_[0]);
  ASSERT_NE(closed, nullptr);
  const int stale = dup(closed->cmd_fd);
  EXPECT_EQ(ibv_close_device(closed), 0);
  errno = 0;
  EXPECT_EQ(ibv_import_device(stale), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  close(stale);
}

// A fork child holds a copy of the parent's memory, not its device: the
// engine thread and the objects stay the parent's, so the import is refused
// there while it works in the parent.
TEST_F(ImportTest, AForkChildCannotImportTheParentsContext) {
  const int fd = dup(ctx_->cmd_fd);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    errno = 0;
    ibv_context* c = ibv_import_device(fd);
    _exit(c == nullptr && errno == EOPNOTSUPP ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  ibv_context* again = ibv_import_device(fd);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(ibv_close_device(again), 0);
}

}  // namespace
}  // namespace rdmaemu::testing
