// Tests of the provider below libibverbs: contexts, size-tolerant queries,
// GID/P_Key answers, PDs and MRs, CQ creation checks, and how device events
// are handed to the library's hooks (owner filtering, element mapping).
#include "provider/provider.h"

#include <arpa/inet.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "emulator/device/device.h"
#include "emulator/objects/cq.h"
#include "provider/objects.h"

namespace rdmaemu::provider {
namespace {

// The hooks are plain function pointers: record into globals.
std::vector<ibv_cq*> g_completions;
std::vector<std::pair<ibv_context*, ibv_async_event>> g_async;

void OnCompletion(ibv_cq* cq) { g_completions.push_back(cq); }
void OnAsync(ibv_context* ctx, const ibv_async_event& ev) { g_async.emplace_back(ctx, ev); }

class ProviderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetEventHooks({OnCompletion, OnAsync});
    g_completions.clear();
    g_async.clear();
    ctx_ = Open();
    ASSERT_NE(ctx_, nullptr);
  }
  void TearDown() override {
    for (verbs_context* v : opened_) FreeContext(v);
  }
  ibv_context* Open() {
    auto v = AllocContext(0);
    EXPECT_TRUE(v.ok()) << v.status().message();
    if (!v.ok()) return nullptr;
    InstallOps(*v);
    StartContext(*v);
    opened_.push_back(*v);
    return &(*v)->context;
  }
  verbs_context* V(ibv_context* c) {
    return reinterpret_cast<verbs_context*>(reinterpret_cast<char*>(c) - offsetof(verbs_context, context));
  }
  device::Device& Dev(ibv_context* c) { return *ToContext(c)->device; }

  std::vector<verbs_context*> opened_;
  ibv_context* ctx_ = nullptr;
};

TEST(ListDevicesTest, DefaultIsEmu0) {
  auto list = ListDevices();
  ASSERT_TRUE(list.ok()) << list.status().message();
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].name, "emu0");
  EXPECT_EQ((*list)[0].guid, device::Registry::GuidFor("emu0", 0));
}

TEST(AllocContextTest, UnknownIndexFails) {
  EXPECT_EQ(AllocContext(5).status().code(), EINVAL);
}

TEST_F(ProviderTest, InstallOpsFillsTheSlotsItImplements) {
  verbs_context* v = V(ctx_);
  EXPECT_NE(v->query_device_ex, nullptr);
  EXPECT_NE(v->query_port, nullptr);
  EXPECT_NE(v->context.ops.poll_cq, nullptr);
  EXPECT_NE(v->context.ops.req_notify_cq, nullptr);
  EXPECT_NE(v->modify_cq, nullptr);
  EXPECT_EQ(v->context.num_comp_vectors, 1);
}

TEST_F(ProviderTest, QueryDeviceExWritesAtMostTheCallersSize) {
  auto q = V(ctx_)->query_device_ex;
  std::vector<uint8_t> buf(sizeof(ibv_device_attr_ex) + 32, 0x5a);
  auto* attr = reinterpret_cast<ibv_device_attr_ex*>(buf.data());
  EXPECT_EQ(q(ctx_, nullptr, attr, sizeof(ibv_device_attr) - 1), EINVAL) << "smaller than the 1.1 struct";
  for (uint8_t b : buf) ASSERT_EQ(b, 0x5a) << "a refused query wrote";
  const size_t sizes[] = {sizeof(ibv_device_attr), sizeof(ibv_device_attr) + 8, 300};
  for (size_t size : sizes) {
    std::fill(buf.begin(), buf.end(), 0x5a);
    ASSERT_EQ(q(ctx_, nullptr, attr, size), 0);
    for (size_t i = size; i < buf.size(); ++i) ASSERT_EQ(buf[i], 0x5a) << "size " << size << " byte " << i;
  }
  std::fill(buf.begin(), buf.end(), 0x5a);
  ASSERT_EQ(q(ctx_, nullptr, attr, sizeof(ibv_device_attr_ex)), 0);
  for (size_t i = sizeof(ibv_device_attr_ex); i < buf.size(); ++i) ASSERT_EQ(buf[i], 0x5a);
  EXPECT_EQ(attr->orig_attr.phys_port_cnt, 1);
  EXPECT_EQ(attr->phys_port_cnt_ex, 1u);
  EXPECT_EQ(attr->orig_attr.node_guid, htobe64(Dev(ctx_).node_guid()));
  EXPECT_NE(attr->orig_attr.fw_ver[0], 0);
  // A bigger caller struct (a newer rdma-core) is accepted too.
  ASSERT_EQ(q(ctx_, nullptr, attr, sizeof(ibv_device_attr_ex) + 32), 0);

  ibv_query_device_ex_input in{};
  in.comp_mask = 2;
  EXPECT_EQ(q(ctx_, &in, attr, sizeof(ibv_device_attr_ex)), EINVAL);
}

TEST_F(ProviderTest, QueryPortWritesAtMostTheCallersSize) {
  auto q = V(ctx_)->query_port;
  std::vector<uint8_t> buf(sizeof(ibv_port_attr) + 16, 0x5a);
  auto* attr = reinterpret_cast<ibv_port_attr*>(buf.data());
  for (size_t size : {size_t{4}, size_t{20}, size_t{48}, sizeof(ibv_port_attr)}) {
    std::fill(buf.begin(), buf.end(), 0x5a);
    ASSERT_EQ(q(ctx_, 1, attr, size), 0);
    for (size_t i = size; i < buf.size(); ++i) ASSERT_EQ(buf[i], 0x5a) << "size " << size << " byte " << i;
  }
  EXPECT_EQ(attr->state, IBV_PORT_ACTIVE);
  EXPECT_EQ(attr->link_layer, IBV_LINK_LAYER_ETHERNET);
  EXPECT_TRUE(attr->port_cap_flags & IBV_PORT_IP_BASED_GIDS);
  EXPECT_EQ(attr->gid_tbl_len, 16);
  EXPECT_EQ(attr->pkey_tbl_len, 1);
  EXPECT_EQ(q(ctx_, 0, attr, sizeof *attr), EINVAL);
  EXPECT_EQ(q(ctx_, 2, attr, sizeof *attr), EINVAL);
}

TEST_F(ProviderTest, GidEntries) {
  ibv_gid_entry e;
  ASSERT_EQ(QueryGidEntry(ctx_, 1, 0, &e), 0);
  EXPECT_EQ(e.gid_type, IBV_GID_TYPE_ROCE_V2);
  EXPECT_EQ(e.port_num, 1u);
  EXPECT_EQ(e.gid_index, 0u);
  EXPECT_EQ(e.ndev_ifindex, 0u);
  auto g = Dev(ctx_).QueryGid(1, 0);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(0, std::memcmp(e.gid.raw, g->raw.data(), 16));
  EXPECT_EQ(QueryGidEntry(ctx_, 1, 1, &e), ENODATA);
  EXPECT_EQ(QueryGidEntry(ctx_, 1, 16, &e), EINVAL);
  EXPECT_EQ(QueryGidEntry(ctx_, 0, 0, &e), EINVAL);
  EXPECT_EQ(QueryGidEntry(ctx_, 257, 0, &e), EINVAL) << "port numbers are 8 bits: 257 is not port 1";
  EXPECT_EQ(QueryGidTableLength(ctx_, 1), 16);
  EXPECT_EQ(QueryGidTableLength(ctx_, 2), -EINVAL);
  EXPECT_EQ(QueryGidTableLength(ctx_, 257), -EINVAL);
}

TEST_F(ProviderTest, Pkeys) {
  uint16_t pkey = 0;
  ASSERT_EQ(QueryPkey(ctx_, 1, 0, &pkey), 0);
  EXPECT_EQ(pkey, htons(0xffff));
  EXPECT_EQ(QueryPkey(ctx_, 1, 1, &pkey), EINVAL);
  EXPECT_EQ(QueryPkey(ctx_, 1, -1, &pkey), EINVAL);
  EXPECT_EQ(QueryPkey(ctx_, 2, 0, &pkey), EINVAL);
}

TEST_F(ProviderTest, PdsAndMrsUseTheDevicesTable) {
  auto pd = AllocPd(ctx_);
  ASSERT_TRUE(pd.ok());
  EXPECT_EQ((*pd)->context, ctx_);
  std::vector<char> buf(4096);
  size_t before = Dev(ctx_).mrs().size();
  auto mr = RegMr(*pd, buf.data(), buf.size(), 0x7000, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  ASSERT_TRUE(mr.ok()) << mr.status().message();
  EXPECT_EQ(Dev(ctx_).mrs().size(), before + 1);
  auto found = Dev(ctx_).mrs().FindByLkey((*mr)->lkey);
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->iova, 0x7000u);
  EXPECT_EQ(found->pd, ToPd(*pd)->handle);
  EXPECT_EQ(found->access, unsigned{IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ});
  EXPECT_NE(Dev(ctx_).mrs().FindByRkey((*mr)->rkey), nullptr);

  // Rereg of the translation: the region answers to the new address.
  std::vector<char> other(8192);
  ASSERT_EQ(ReregMr(*mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, other.data(), other.size(), 0), 0);
  auto moved = Dev(ctx_).mrs().FindByLkey((*mr)->lkey);
  ASSERT_NE(moved, nullptr);
  EXPECT_EQ(moved->addr, reinterpret_cast<uint8_t*>(other.data()));
  EXPECT_EQ(moved->iova, reinterpret_cast<uintptr_t>(other.data()));
  EXPECT_EQ(moved->length, other.size());
  EXPECT_EQ(moved->lkey, found->lkey) << "the keys stay, as on rxe and mlx5";
  EXPECT_EQ((*mr)->rkey, found->rkey);

  // Rereg of the access alone keeps the translation.
  ASSERT_EQ(ReregMr(*mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_LOCAL_WRITE), 0);
  auto rights = Dev(ctx_).mrs().FindByLkey((*mr)->lkey);
  ASSERT_NE(rights, nullptr);
  EXPECT_EQ(rights->addr, reinterpret_cast<uint8_t*>(other.data()));
  EXPECT_EQ(rights->access, unsigned{IBV_ACCESS_LOCAL_WRITE});

  EXPECT_EQ(ReregMr(*mr, IBV_REREG_MR_CHANGE_PD, nullptr, nullptr, 0, 0), EINVAL) << "no PD given";
  EXPECT_EQ(ReregMr(*mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_REMOTE_ATOMIC), EINVAL);

  EXPECT_EQ(DeregMr(*mr), 0);
  EXPECT_EQ(Dev(ctx_).mrs().size(), before);
  EXPECT_EQ(DeallocPd(*pd), 0);
}

TEST_F(ProviderTest, RegMrFailuresCarryErrno) {
  auto pd = AllocPd(ctx_);
  ASSERT_TRUE(pd.ok());
  std::vector<char> buf(64);
  EXPECT_EQ(RegMr(*pd, buf.data(), buf.size(), 0, IBV_ACCESS_REMOTE_WRITE).status().code(), EINVAL);
  EXPECT_EQ(RegMr(*pd, buf.data(), buf.size(), 0, 1u << 14).status().code(), EINVAL);
  // Zero bytes at a page boundary span no page (inside a page they register).
  void* page = aligned_alloc(4096, 4096);
  ASSERT_NE(page, nullptr);
  EXPECT_EQ(RegMr(*pd, page, 0, 0, 0).status().code(), EINVAL);
  free(page);
  EXPECT_EQ(RegMr(*pd, nullptr, 64, 0, 0).status().code(), EFAULT);
  // The whole address space is a region only on demand.
  EXPECT_EQ(RegMr(*pd, nullptr, SIZE_MAX, 0, IBV_ACCESS_LOCAL_WRITE).status().code(), EINVAL);
  EXPECT_EQ(DeallocPd(*pd), 0);
}

TEST_F(ProviderTest, CreateCqChecks) {
  ibv_cq_init_attr_ex attr{};
  attr.cqe = 8;
  auto ok = CreateCq(ctx_, attr);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)->context, ctx_);
  EXPECT_EQ((*ok)->cqe, 8);
  EXPECT_EQ(ToCq(*ok)->cq->capacity(), 8u);
  FreeCq(ibv_cq_ex_to_cq(*ok));

  attr.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
  attr.flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
  auto st = CreateCq(ctx_, attr);
  ASSERT_TRUE(st.ok()) << "single-threaded is a hint";
  FreeCq(ibv_cq_ex_to_cq(*st));

  attr.flags = 1u << 7;
  EXPECT_EQ(CreateCq(ctx_, attr).status().code(), EOPNOTSUPP);
  attr.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
  attr.flags = 0;
  EXPECT_EQ(CreateCq(ctx_, attr).status().code(), EINVAL) << "MASK_PD with no parent domain";
  attr.comp_mask = 1u << 5;
  EXPECT_EQ(CreateCq(ctx_, attr).status().code(), EOPNOTSUPP);
  attr.comp_mask = 0;
  attr.wc_flags = IBV_WC_EX_WITH_CVLAN;
  EXPECT_EQ(CreateCq(ctx_, attr).status().code(), EOPNOTSUPP);
  attr.wc_flags = 0;
  attr.cqe = 0;
  EXPECT_EQ(CreateCq(ctx_, attr).status().code(), EINVAL);
  attr.cqe = (1u << 17);
  EXPECT_EQ(CreateCq(ctx_, attr).status().code(), EINVAL);
  attr.cqe = 4;
  attr.comp_vector = 1;
  EXPECT_EQ(CreateCq(ctx_, attr).status().code(), EINVAL);
}

TEST_F(ProviderTest, CompletionHookRunsOnlyForArmedCqsWithAChannel) {
  ibv_cq_init_attr_ex attr{};
  attr.cqe = 8;
  auto cq = CreateCq(ctx_, attr);
  ASSERT_TRUE(cq.ok());
  ibv_cq* base = ibv_cq_ex_to_cq(*cq);
  objects::Cqe cqe;
  EXPECT_EQ(V(ctx_)->context.ops.req_notify_cq(base, 0), EINVAL) << "no channel: nothing to arm for";
  ASSERT_TRUE(ToCq(base)->cq->Push(cqe));
  EXPECT_TRUE(g_completions.empty()) << "no channel: no completion event";

  ibv_comp_channel fake_channel{};
  fake_channel.context = ctx_;
  base->channel = &fake_channel;  // what the library's verbs_init_cq sets
  ASSERT_TRUE(ToCq(base)->cq->Push(cqe));
  EXPECT_TRUE(g_completions.empty()) << "not armed";
  ASSERT_EQ(V(ctx_)->context.ops.req_notify_cq(base, 0), 0);
  ASSERT_TRUE(ToCq(base)->cq->Push(cqe));
  ASSERT_EQ(g_completions.size(), 1u);
  EXPECT_EQ(g_completions[0], base);

  ibv_wc wc[8];
  EXPECT_EQ(V(ctx_)->context.ops.poll_cq(base, 8, wc), 3);
  EXPECT_EQ(V(ctx_)->context.ops.poll_cq(base, -1, wc), -1) << "a negative count is an error";
  base->channel = nullptr;
  FreeCq(base);
}

TEST_F(ProviderTest, PortAndDeviceEventsGoToEveryContext) {
  ibv_context* other = Open();
  ASSERT_NE(other, nullptr);
  Dev(ctx_).Raise({device::AsyncEventType::kPortActive, 0, 1});
  ASSERT_EQ(g_async.size(), 2u);
  for (const auto& [c, ev] : g_async) {
    EXPECT_EQ(ev.event_type, IBV_EVENT_PORT_ACTIVE);
    EXPECT_EQ(ev.element.port_num, 1);
  }
  EXPECT_NE(g_async[0].first, g_async[1].first);
  g_async.clear();
  Dev(ctx_).Raise({device::AsyncEventType::kDeviceSpeedChange, 0, 1});
  ASSERT_EQ(g_async.size(), 2u);
  EXPECT_EQ(static_cast<int>(g_async[0].second.event_type), 20);
  EXPECT_EQ(g_async[0].second.element.port_num, 1);
}

TEST_F(ProviderTest, ObjectEventsGoOnlyToTheOwnerWithTheRightElement) {
  ibv_context* other = Open();
  ASSERT_NE(other, nullptr);
  // Every ibv_* object starts with its context pointer; that is how the
  // provider finds the owner.
  struct FakeObject {
    ibv_context* context;
  } obj{other};
  const uint64_t handle = reinterpret_cast<uint64_t>(&obj);
  using T = device::AsyncEventType;
  struct Case {
    T type;
    int which;  // 0 cq, 1 qp, 2 srq, 3 wq
  };
  const Case cases[] = {{T::kCqErr, 0},          {T::kQpFatal, 1},         {T::kQpReqErr, 1},
                        {T::kQpAccessErr, 1},    {T::kCommEst, 1},         {T::kSqDrained, 1},
                        {T::kPathMig, 1},        {T::kPathMigErr, 1},      {T::kQpLastWqeReached, 1},
                        {T::kSrqErr, 2},         {T::kSrqLimitReached, 2}, {T::kWqFatal, 3}};
  for (const Case& c : cases) {
    g_async.clear();
    Dev(ctx_).Raise({c.type, handle, 0});
    ASSERT_EQ(g_async.size(), 1u) << static_cast<int>(c.type);
    EXPECT_EQ(g_async[0].first, other) << "delivered to a context that does not own the object";
    const ibv_async_event& ev = g_async[0].second;
    EXPECT_EQ(static_cast<int>(ev.event_type), static_cast<int>(c.type));
    void* element = c.which == 0   ? static_cast<void*>(ev.element.cq)
                    : c.which == 1 ? static_cast<void*>(ev.element.qp)
                    : c.which == 2 ? static_cast<void*>(ev.element.srq)
                                   : static_cast<void*>(ev.element.wq);
    EXPECT_EQ(element, &obj) << static_cast<int>(c.type);
  }
}

TEST_F(ProviderTest, FreedContextStopsReceivingEvents) {
  ibv_context* other = Open();
  ASSERT_NE(other, nullptr);
  FreeContext(opened_.back());
  opened_.pop_back();
  Dev(ctx_).Raise({device::AsyncEventType::kPortErr, 0, 1});
  ASSERT_EQ(g_async.size(), 1u);
  EXPECT_EQ(g_async[0].first, ctx_);
}

}  // namespace
}  // namespace rdmaemu::provider
