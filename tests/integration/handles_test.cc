// Objects that are not what they claim never crash the library. The kernel
// looks up every handle a program passes; the library looks up every object
// pointer a slow-path verb gets among those it handed out and has not
// destroyed, and refuses the rest with the kernel's errno: ENOENT for a
// destroy (uverbs finds no handle to destroy), EINVAL for any other verb.
// A destroyed object, a copy of one, a made-up one (0xA5 bytes), one of
// another context or of a closed context: each is refused, never followed.
// Run under AddressSanitizer too, which sees any read of freed memory.
//
// verbs.h's inline wrappers (ibv_req_notify_cq, ibv_destroy_wq, ...) read
// obj->context in the program itself before they reach the library, so a
// destroyed or made-up object given to them is the program's own read of
// bad memory, on any stack. Those verbs are tested with copies (which carry
// the real context) and by calling the slot the wrapper calls.
#include <infiniband/verbs.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>

#include "rdmaemu/rdmaemu.h"
#include "tests/testing/verbs_test.h"

namespace rdmaemu::testing {
namespace {

// An object of type T that no library made: 0xA5 bytes on the stack.
template <typename T>
class MadeUp {
 public:
  MadeUp() { std::memset(bytes_, 0xa5, sizeof bytes_); }
  T* get() { return reinterpret_cast<T*>(bytes_); }

 private:
  alignas(T) unsigned char bytes_[sizeof(T)];
};

// `call` returns `error` and leaves it in errno.
template <typename Call>
void ExpectError(int error, Call call) {
  errno = 0;
  EXPECT_EQ(call(), error);
  EXPECT_EQ(errno, error);
}

// `call` returns NULL with errno `error`.
template <typename Call>
void ExpectNull(int error, Call call) {
  errno = 0;
  EXPECT_EQ(call(), nullptr);
  EXPECT_EQ(errno, error);
}

class HandlesTest : public VerbsTest {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(Open(16, 4096, IBV_ACCESS_LOCAL_WRITE)); }

  ibv_qp* CreateQp(ibv_pd* pd, ibv_cq* send_cq, ibv_cq* recv_cq, ibv_srq* srq = nullptr) {
    ibv_qp_init_attr a{};
    a.send_cq = send_cq;
    a.recv_cq = recv_cq;
    a.srq = srq;
    a.qp_type = IBV_QPT_UD;
    a.cap.max_send_wr = 1;
    a.cap.max_recv_wr = srq ? 0 : 1;
    a.cap.max_send_sge = 1;
    a.cap.max_recv_sge = srq ? 0 : 1;
    return ibv_create_qp(pd, &a);
  }

  static ibv_srq* CreateSrq(ibv_pd* pd) {
    ibv_srq_init_attr a{};
    a.attr.max_wr = 4;
    a.attr.max_sge = 1;
    return ibv_create_srq(pd, &a);
  }

  static ibv_wq* CreateWq(ibv_context* ctx, ibv_pd* pd, ibv_cq* cq) {
    ibv_wq_init_attr a{};
    a.wq_type = IBV_WQT_RQ;
    a.max_wr = 4;
    a.max_sge = 1;
    a.pd = pd;
    a.cq = cq;
    return ibv_create_wq(ctx, &a);
  }

  static ibv_rwq_ind_table* CreateTable(ibv_context* ctx, ibv_wq** wq) {
    ibv_rwq_ind_table_init_attr a{};
    a.log_ind_tbl_size = 0;
    a.ind_tbl = wq;
    return ibv_create_rwq_ind_table(ctx, &a);
  }

  ibv_ah_attr SelfAhAttr() {
    ibv_ah_attr a{};
    EXPECT_EQ(ibv_query_gid(ctx_, 1, 0, &a.grh.dgid), 0);
    a.is_global = 1;
    a.grh.hop_limit = 1;
    a.port_num = 1;
    return a;
  }

  verbs_context* V() { return verbs_get_ctx(ctx_); }
};

TEST_F(HandlesTest, ADestroyedPdIsRefused) {
  ibv_pd* pd = ibv_alloc_pd(ctx_);
  ASSERT_NE(pd, nullptr);
  ASSERT_EQ(ibv_dealloc_pd(pd), 0);
  ExpectError(ENOENT, [&] { return ibv_dealloc_pd(pd); });
  ExpectNull(EINVAL, [&] { return ibv_reg_mr(pd, buf_.data(), 64, IBV_ACCESS_LOCAL_WRITE); });
  ExpectNull(EINVAL, [&] { return CreateSrq(pd); });
  ExpectNull(EINVAL, [&] { return CreateQp(pd, cq_, cq_); });
  ibv_ah_attr ah = SelfAhAttr();
  ExpectNull(EINVAL, [&] { return ibv_create_ah(pd, &ah); });
  ExpectNull(EINVAL, [&] { return CreateWq(ctx_, pd, cq_); });
}

TEST_F(HandlesTest, ADestroyedMrIsRefused) {
  ibv_mr* mr = ibv_reg_mr(pd_, buf_.data(), 64, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  ASSERT_EQ(ibv_dereg_mr(mr), 0);
  ExpectError(ENOENT, [&] { return ibv_dereg_mr(mr); });
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, 0), IBV_REREG_MR_ERR_INPUT);
  EXPECT_EQ(errno, ENOENT);
}

TEST_F(HandlesTest, ADestroyedCqIsRefused) {
  ibv_cq* cq = ibv_create_cq(ctx_, 4, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ASSERT_EQ(ibv_destroy_cq(cq), 0);
  ExpectError(ENOENT, [&] { return ibv_destroy_cq(cq); });
  ExpectError(EINVAL, [&] { return ibv_resize_cq(cq, 8); });
  ExpectNull(EINVAL, [&] { return CreateQp(pd_, cq, cq_); });
  ExpectNull(EINVAL, [&] { return CreateQp(pd_, cq_, cq); });
  ExpectNull(EINVAL, [&] { return CreateWq(ctx_, pd_, cq); });
  // The slots verbs.h's ibv_req_notify_cq and ibv_modify_cq call.
  EXPECT_EQ(ctx_->ops.req_notify_cq(cq, 0), EINVAL);
  ibv_modify_cq_attr moderation{};
  EXPECT_EQ(V()->modify_cq(cq, &moderation), EINVAL);
  ibv_ack_cq_events(cq, 1);  // nothing to count on: ignored
}

TEST_F(HandlesTest, ADestroyedQpIsRefused) {
  ibv_qp* qp = CreateQp(pd_, cq_, cq_);
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(ibv_destroy_qp(qp), 0);
  ExpectError(ENOENT, [&] { return ibv_destroy_qp(qp); });
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  ExpectError(EINVAL, [&] { return ibv_modify_qp(qp, &attr, IBV_QP_STATE); });
  ibv_qp_init_attr init{};
  ExpectError(EINVAL, [&] { return ibv_query_qp(qp, &attr, IBV_QP_STATE, &init); });
  ibv_gid group{};
  group.raw[10] = group.raw[11] = 0xff;
  group.raw[12] = 239;
  group.raw[15] = 1;
  ExpectError(EINVAL, [&] { return ibv_attach_mcast(qp, &group, 0); });
  ExpectError(EINVAL, [&] { return ibv_detach_mcast(qp, &group, 0); });
  ExpectNull(EINVAL, [&] { return ibv_qp_to_qp_ex(qp); });
}

TEST_F(HandlesTest, ADestroyedSrqIsRefused) {
  ibv_srq* srq = CreateSrq(pd_);
  ASSERT_NE(srq, nullptr);
  ASSERT_EQ(ibv_destroy_srq(srq), 0);
  ExpectError(ENOENT, [&] { return ibv_destroy_srq(srq); });
  ibv_srq_attr attr{};
  attr.srq_limit = 1;
  ExpectError(EINVAL, [&] { return ibv_modify_srq(srq, &attr, IBV_SRQ_LIMIT); });
  ExpectError(EINVAL, [&] { return ibv_query_srq(srq, &attr); });
  ExpectNull(EINVAL, [&] { return CreateQp(pd_, cq_, cq_, srq); });
}

TEST_F(HandlesTest, ADestroyedAhIsRefused) {
  ibv_ah_attr attr = SelfAhAttr();
  ibv_ah* ah = ibv_create_ah(pd_, &attr);
  ASSERT_NE(ah, nullptr);
  ASSERT_EQ(ibv_destroy_ah(ah), 0);
  ExpectError(ENOENT, [&] { return ibv_destroy_ah(ah); });
}

TEST_F(HandlesTest, ADestroyedCompletionChannelIsRefused) {
  ibv_comp_channel* channel = ibv_create_comp_channel(ctx_);
  ASSERT_NE(channel, nullptr);
  ASSERT_EQ(ibv_destroy_comp_channel(channel), 0);
  ExpectError(ENOENT, [&] { return ibv_destroy_comp_channel(channel); });
  ExpectNull(EINVAL, [&] { return ibv_create_cq(ctx_, 4, nullptr, channel, 0); });
  ibv_cq* cq = nullptr;
  void* cq_context = nullptr;
  errno = 0;
  EXPECT_EQ(ibv_get_cq_event(channel, &cq, &cq_context), -1);
  EXPECT_EQ(errno, EBADF) << "as a read of a closed fd";
}

TEST_F(HandlesTest, ADestroyedWqAndTableAreRefused) {
  ibv_wq* wq = CreateWq(ctx_, pd_, cq_);
  ASSERT_NE(wq, nullptr);
  ibv_rwq_ind_table* table = CreateTable(ctx_, &wq);
  ASSERT_NE(table, nullptr);
  ASSERT_EQ(ibv_destroy_rwq_ind_table(table), 0);
  ASSERT_EQ(ibv_destroy_wq(wq), 0);
  // What ibv_destroy_wq, ibv_modify_wq and ibv_destroy_rwq_ind_table call.
  ExpectError(ENOENT, [&] { return V()->destroy_wq(wq); });
  ibv_wq_attr attr{};
  attr.attr_mask = IBV_WQ_ATTR_STATE;
  attr.wq_state = IBV_WQS_RDY;
  ExpectError(EINVAL, [&] { return V()->modify_wq(wq, &attr); });
  ExpectError(ENOENT, [&] { return V()->destroy_rwq_ind_table(table); });
  ExpectNull(EINVAL, [&] { return CreateTable(ctx_, &wq); });
}

// A struct copied by value has the real context (so verbs.h's wrappers reach
// the library) but another address: it is not the object.
TEST_F(HandlesTest, CopiesAreNotTheObject) {
  ibv_cq cq = *cq_;
  EXPECT_EQ(ibv_req_notify_cq(&cq, 0), EINVAL);
  ExpectError(ENOENT, [&] { return ibv_destroy_cq(&cq); });
  ExpectError(EINVAL, [&] { return ibv_resize_cq(&cq, 8); });
  ibv_pd pd = *pd_;
  ExpectError(ENOENT, [&] { return ibv_dealloc_pd(&pd); });
  ExpectNull(EINVAL, [&] { return ibv_reg_mr(&pd, buf_.data(), 64, IBV_ACCESS_LOCAL_WRITE); });
  ibv_mr mr = *mr_;
  ExpectError(ENOENT, [&] { return ibv_dereg_mr(&mr); });

  ibv_qp* real_qp = Own(CreateQp(pd_, cq_, cq_));
  ASSERT_NE(real_qp, nullptr);
  ibv_qp qp = *real_qp;
  ibv_qp_attr attr{};
  ExpectError(EINVAL, [&] { return ibv_modify_qp(&qp, &attr, IBV_QP_STATE); });
  ExpectError(ENOENT, [&] { return ibv_destroy_qp(&qp); });

  ibv_wq* real_wq = CreateWq(ctx_, pd_, cq_);
  ASSERT_NE(real_wq, nullptr);
  ibv_rwq_ind_table* real_table = CreateTable(ctx_, &real_wq);
  ASSERT_NE(real_table, nullptr);
  ibv_rwq_ind_table table = *real_table;
  ExpectError(ENOENT, [&] { return ibv_destroy_rwq_ind_table(&table); });
  ibv_wq wq = *real_wq;
  ibv_wq_attr wq_attr{};
  wq_attr.attr_mask = IBV_WQ_ATTR_STATE;
  wq_attr.wq_state = IBV_WQS_RDY;
  ExpectError(EINVAL, [&] { return ibv_modify_wq(&wq, &wq_attr); });
  ExpectError(ENOENT, [&] { return ibv_destroy_wq(&wq); });
  EXPECT_EQ(ibv_destroy_rwq_ind_table(real_table), 0);
  EXPECT_EQ(ibv_destroy_wq(real_wq), 0);

  // The originals were left alone.
  ibv_qp_init_attr init{};
  EXPECT_EQ(ibv_query_qp(real_qp, &attr, IBV_QP_STATE, &init), 0);
  EXPECT_EQ(ibv_resize_cq(cq_, 32), 0);
}

// 0xA5 bytes where an object should be: every exported slow-path verb
// refuses them without reading them.
TEST_F(HandlesTest, MadeUpObjectsAreRefused) {
  MadeUp<ibv_pd> pd;
  MadeUp<ibv_mr> mr;
  MadeUp<ibv_cq> cq;
  MadeUp<ibv_qp> qp;
  MadeUp<ibv_srq> srq;
  MadeUp<ibv_ah> ah;
  MadeUp<ibv_comp_channel> channel;
  MadeUp<ibv_context> context;
  ExpectError(ENOENT, [&] { return ibv_dealloc_pd(pd.get()); });
  ExpectNull(EINVAL, [&] { return ibv_reg_mr(pd.get(), buf_.data(), 64, 0); });
  ExpectError(ENOENT, [&] { return ibv_dereg_mr(mr.get()); });
  EXPECT_EQ(ibv_rereg_mr(mr.get(), IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, 0),
            IBV_REREG_MR_ERR_INPUT);
  ExpectError(ENOENT, [&] { return ibv_destroy_cq(cq.get()); });
  ExpectError(EINVAL, [&] { return ibv_resize_cq(cq.get(), 4); });
  ibv_ack_cq_events(cq.get(), 1);
  ExpectError(ENOENT, [&] { return ibv_destroy_qp(qp.get()); });
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  ExpectError(EINVAL, [&] { return ibv_modify_qp(qp.get(), &attr, IBV_QP_STATE); });
  ExpectError(EINVAL, [&] { return ibv_query_qp(qp.get(), &attr, IBV_QP_STATE, &init); });
  ExpectNull(EINVAL, [&] { return CreateQp(pd.get(), cq_, cq_); });
  ExpectNull(EINVAL, [&] { return CreateQp(pd_, cq.get(), cq_); });
  ExpectNull(EINVAL, [&] { return CreateQp(pd_, cq_, cq_, srq.get()); });
  ExpectError(ENOENT, [&] { return ibv_destroy_srq(srq.get()); });
  ibv_srq_attr srq_attr{};
  ExpectError(EINVAL, [&] { return ibv_modify_srq(srq.get(), &srq_attr, IBV_SRQ_LIMIT); });
  ExpectError(EINVAL, [&] { return ibv_query_srq(srq.get(), &srq_attr); });
  ExpectNull(EINVAL, [&] { return CreateSrq(pd.get()); });
  ExpectError(ENOENT, [&] { return ibv_destroy_ah(ah.get()); });
  ibv_ah_attr ah_attr = SelfAhAttr();
  ExpectNull(EINVAL, [&] { return ibv_create_ah(pd.get(), &ah_attr); });
  ExpectError(ENOENT, [&] { return ibv_destroy_comp_channel(channel.get()); });
  ExpectNull(EINVAL, [&] { return ibv_create_cq(ctx_, 4, nullptr, channel.get(), 0); });
  ExpectNull(EINVAL, [&] { return ibv_alloc_pd(context.get()); });
  ExpectNull(EINVAL, [&] { return ibv_create_cq(context.get(), 4, nullptr, nullptr, 0); });
  ExpectNull(EINVAL, [&] { return ibv_create_comp_channel(context.get()); });
  ExpectError(ENOENT, [&] { return ibv_close_device(context.get()); });
  // The slots behind verbs.h's inline wrappers.
  EXPECT_EQ(ctx_->ops.req_notify_cq(cq.get(), 0), EINVAL);
  MadeUp<ibv_wq> wq;
  MadeUp<ibv_rwq_ind_table> table;
  ibv_wq_attr wq_attr{};
  EXPECT_EQ(V()->modify_wq(wq.get(), &wq_attr), EINVAL);
  EXPECT_EQ(V()->destroy_wq(wq.get()), ENOENT);
  EXPECT_EQ(V()->destroy_rwq_ind_table(table.get()), ENOENT);
  ibv_wq* entry = wq.get();
  ExpectNull(EINVAL, [&] { return CreateTable(ctx_, &entry); });
  // An async event naming a made-up object is acknowledged without a crash.
  ibv_async_event event{};
  event.event_type = IBV_EVENT_QP_FATAL;
  event.element.qp = qp.get();
  ibv_ack_async_event(&event);
}

// A device opened twice is two contexts whose objects do not mix.
TEST_F(HandlesTest, ObjectsOfAnotherContextAreRefused) {
  ibv_context* other = ibv_open_device(list_[0]);
  ASSERT_NE(other, nullptr);
  ibv_pd* other_pd = ibv_alloc_pd(other);
  ASSERT_NE(other_pd, nullptr);
  ibv_cq* other_cq = ibv_create_cq(other, 4, nullptr, nullptr, 0);
  ASSERT_NE(other_cq, nullptr);
  ibv_srq* other_srq = CreateSrq(other_pd);
  ASSERT_NE(other_srq, nullptr);
  ibv_comp_channel* other_channel = ibv_create_comp_channel(other);
  ASSERT_NE(other_channel, nullptr);

  ExpectNull(EINVAL, [&] { return CreateQp(pd_, other_cq, cq_); });
  ExpectNull(EINVAL, [&] { return CreateQp(pd_, cq_, other_cq); });
  ExpectNull(EINVAL, [&] { return CreateQp(pd_, cq_, cq_, other_srq); });
  // A QP created on one context with the other's PD (comp_mask beyond
  // IBV_QP_INIT_ATTR_PD, or verbs.h sends it to the PD's own context).
  ibv_qp_init_attr_ex ex{};
  ex.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
  ex.pd = pd_;
  ex.send_cq = ex.recv_cq = other_cq;
  ex.qp_type = IBV_QPT_UD;
  ex.cap.max_send_wr = ex.cap.max_recv_wr = 1;
  ExpectNull(EINVAL, [&] { return ibv_create_qp_ex(other, &ex); });
  ExpectNull(EINVAL, [&] { return CreateWq(other, pd_, other_cq); });
  ExpectNull(EINVAL, [&] { return CreateWq(ctx_, pd_, other_cq); });
  ExpectNull(EINVAL, [&] { return ibv_create_cq(ctx_, 4, nullptr, other_channel, 0); });
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(mr_, IBV_REREG_MR_CHANGE_PD, other_pd, nullptr, 0, 0), IBV_REREG_MR_ERR_INPUT);
  EXPECT_EQ(errno, EINVAL);
  ibv_wq* wq = CreateWq(ctx_, pd_, cq_);
  ASSERT_NE(wq, nullptr);
  ExpectNull(EINVAL, [&] { return CreateTable(other, &wq); });
  ibv_async_event event{};
  event.event_type = IBV_EVENT_CQ_ERR;
  event.element.cq = cq_;
  EXPECT_EQ(rdmaemu_raise_async_event(other, &event), EINVAL);

  EXPECT_EQ(ibv_destroy_wq(wq), 0);
  EXPECT_EQ(ibv_destroy_comp_channel(other_channel), 0);
  EXPECT_EQ(ibv_destroy_srq(other_srq), 0);
  EXPECT_EQ(ibv_destroy_cq(other_cq), 0);
  EXPECT_EQ(ibv_dealloc_pd(other_pd), 0);
  EXPECT_EQ(ibv_close_device(other), 0);
}

// The kernel destroys what a program left on a context it closed; the PD
// the program still holds is then no PD.
TEST_F(HandlesTest, AClosedContextsObjectsAreRefused) {
  ibv_context* other = ibv_open_device(list_[0]);
  ASSERT_NE(other, nullptr);
  ibv_pd* pd = ibv_alloc_pd(other);
  ASSERT_NE(pd, nullptr);
  ibv_mr* mr = ibv_reg_mr(pd, buf_.data(), 64, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  ASSERT_EQ(ibv_close_device(other), 0);
  ExpectError(ENOENT, [&] { return ibv_dealloc_pd(pd); });
  ExpectError(ENOENT, [&] { return ibv_dereg_mr(mr); });
  ExpectNull(EINVAL, [&] { return ibv_reg_mr(pd, buf_.data(), 64, IBV_ACCESS_LOCAL_WRITE); });
  ExpectNull(EINVAL, [&] { return ibv_alloc_pd(other); });
  ExpectError(ENOENT, [&] { return ibv_close_device(other); });
}

// ibv_dealloc_pd of a PD something still uses: EBUSY returned and in errno,
// for each kind of user; once it is gone the PD goes.
TEST_F(HandlesTest, DeallocOfABusyPdFailsWithEbusy) {
  auto busy_while = [&](ibv_pd* pd, auto destroy_user) {
    ExpectError(EBUSY, [&] { return ibv_dealloc_pd(pd); });
    destroy_user();
    EXPECT_EQ(ibv_dealloc_pd(pd), 0);
  };
  ibv_pd* pd = ibv_alloc_pd(ctx_);
  ibv_mr* mr = ibv_reg_mr(pd, buf_.data(), 64, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  busy_while(pd, [&] { EXPECT_EQ(ibv_dereg_mr(mr), 0); });

  pd = ibv_alloc_pd(ctx_);
  ibv_ah_attr attr = SelfAhAttr();
  ibv_ah* ah = ibv_create_ah(pd, &attr);
  ASSERT_NE(ah, nullptr);
  busy_while(pd, [&] { EXPECT_EQ(ibv_destroy_ah(ah), 0); });

  pd = ibv_alloc_pd(ctx_);
  ibv_qp* qp = CreateQp(pd, cq_, cq_);
  ASSERT_NE(qp, nullptr);
  busy_while(pd, [&] { EXPECT_EQ(ibv_destroy_qp(qp), 0); });

  pd = ibv_alloc_pd(ctx_);
  ibv_srq* srq = CreateSrq(pd);
  ASSERT_NE(srq, nullptr);
  busy_while(pd, [&] { EXPECT_EQ(ibv_destroy_srq(srq), 0); });

  pd = ibv_alloc_pd(ctx_);
  ibv_wq* wq = CreateWq(ctx_, pd, cq_);
  ASSERT_NE(wq, nullptr);
  busy_while(pd, [&] { EXPECT_EQ(ibv_destroy_wq(wq), 0); });
}

TEST_F(HandlesTest, ReqNotifyOnACqWithoutAChannelFails) {
  EXPECT_EQ(ibv_req_notify_cq(cq_, 0), EINVAL);
  EXPECT_EQ(ibv_req_notify_cq(cq_, 1), EINVAL);
  ibv_comp_channel* channel = ibv_create_comp_channel(ctx_);
  ASSERT_NE(channel, nullptr);
  ibv_cq* cq = ibv_create_cq(ctx_, 4, nullptr, channel, 0);
  ASSERT_NE(cq, nullptr);
  EXPECT_EQ(ibv_req_notify_cq(cq, 0), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_destroy_comp_channel(channel), 0);
}

}  // namespace
}  // namespace rdmaemu::testing
