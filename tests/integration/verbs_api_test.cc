// The public verbs API on the emulated device, called as an unmodified
// program calls it: exported ibv_* functions and verbs.h's inline wrappers
// that reach the library through ctx->ops and struct verbs_context.
#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

// From rdma-core's driver.h (IBVERBS_PRIVATE_34): not in the public header.
extern "C" int ibv_query_gid_type(struct ibv_context* context, uint8_t port_num,
                                  unsigned int index, unsigned int* type);

namespace {

class VerbsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    list_ = ibv_get_device_list(&n);
    ASSERT_NE(list_, nullptr) << std::strerror(errno);
    ASSERT_GE(n, 1);
    ctx_ = ibv_open_device(list_[0]);
    ASSERT_NE(ctx_, nullptr) << std::strerror(errno);
  }
  void TearDown() override {
    if (pd_ != nullptr) {
      EXPECT_EQ(ibv_dealloc_pd(pd_), 0);
    }
    if (ctx_ != nullptr) {
      EXPECT_EQ(ibv_close_device(ctx_), 0);
    }
    if (list_ != nullptr) ibv_free_device_list(list_);
  }
  ibv_pd* Pd() {
    if (pd_ == nullptr) pd_ = ibv_alloc_pd(ctx_);
    return pd_;
  }
  ibv_device** list_ = nullptr;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
};

TEST(DeviceListTest, ListsEmu0) {
  int n = -1;
  ibv_device** list = ibv_get_device_list(&n);
  ASSERT_NE(list, nullptr);
  ASSERT_EQ(n, 1);
  EXPECT_STREQ(ibv_get_device_name(list[0]), "emu0");
  EXPECT_EQ(list[n], nullptr) << "NULL-terminated";
  EXPECT_EQ(list[0]->node_type, IBV_NODE_CA);
  EXPECT_EQ(list[0]->transport_type, IBV_TRANSPORT_IB);
  EXPECT_NE(ibv_get_device_guid(list[0]), 0u);
  EXPECT_EQ(ibv_get_device_index(list[0]), 0);
  ibv_device* first = list[0];
  ibv_free_device_list(list);
  ibv_device** again = ibv_get_device_list(nullptr);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again[0], first) << "ibv_device pointers are stable across lists";
  ibv_free_device_list(again);
}

// ibv_create_qp(3) returns the actual caps, at least those asked: as in rxe,
// a send WQE's SGE room serves inline data too (rdma_xclient asks for no
// inline data and sends 16 bytes inline with one SGE).
TEST_F(VerbsTest, InlineDataMayUseTheSgesRoom) {
  ibv_cq* cq = ibv_create_cq(ctx_, 4, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp_init_attr attr{};
  attr.send_cq = attr.recv_cq = cq;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = 1;
  attr.cap.max_send_sge = 2;
  ibv_qp* qp = ibv_create_qp(Pd(), &attr);
  ASSERT_NE(qp, nullptr) << std::strerror(errno);
  EXPECT_EQ(attr.cap.max_inline_data, 2 * sizeof(ibv_sge));
  ibv_qp_attr got{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(ibv_query_qp(qp, &got, IBV_QP_CAP, &init), 0);
  EXPECT_EQ(got.cap.max_inline_data, 2 * sizeof(ibv_sge));
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  // Asking for more than that gets what was asked.
  attr.cap.max_inline_data = 100;
  qp = ibv_create_qp(Pd(), &attr);
  ASSERT_NE(qp, nullptr) << std::strerror(errno);
  EXPECT_EQ(attr.cap.max_inline_data, 100u);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

TEST_F(VerbsTest, ContextHasRdmaCoresExtendedLayout) {
  EXPECT_EQ(offsetof(verbs_context, context), 320u);
  EXPECT_EQ(sizeof(verbs_context), 648u);
  EXPECT_EQ(ctx_->abi_compat, reinterpret_cast<void*>(UINTPTR_MAX));
  verbs_context* vctx = verbs_get_ctx(ctx_);
  ASSERT_NE(vctx, nullptr);
  EXPECT_EQ(reinterpret_cast<char*>(ctx_) - reinterpret_cast<char*>(vctx), 320);
  EXPECT_GE(vctx->sz, 648u);
  EXPECT_EQ(ctx_->device, list_[0]);
  EXPECT_GE(ctx_->num_comp_vectors, 1);
  EXPECT_GE(ctx_->async_fd, 0);
}

// Every context of a kernel device has a command fd (/dev/infiniband/
// uverbsN); programs dup it to share the context (ibv_import_device), and
// rdma-core's test_shared_pd does so before anything else. Ours is an open
// file of its own, closed with the context; an import owns its copy
// (import_test has the rest).
TEST_F(VerbsTest, ContextHasItsOwnCommandFd) {
  ASSERT_GE(ctx_->cmd_fd, 0);
  EXPECT_NE(ctx_->cmd_fd, ctx_->async_fd);
  EXPECT_TRUE(fcntl(ctx_->cmd_fd, F_GETFD) & FD_CLOEXEC);
  int copy = dup(ctx_->cmd_fd);
  ASSERT_GE(copy, 0) << std::strerror(errno);
  ibv_context* imported = ibv_import_device(copy);
  ASSERT_NE(imported, nullptr);
  EXPECT_EQ(imported->cmd_fd, copy);
  EXPECT_EQ(ibv_close_device(imported), 0);
  EXPECT_EQ(fcntl(copy, F_GETFD), -1) << "closed with the imported context";

  ibv_context* other = ibv_open_device(list_[0]);
  ASSERT_NE(other, nullptr);
  EXPECT_NE(other->cmd_fd, ctx_->cmd_fd) << "one per context";
  const int fd = other->cmd_fd;
  ASSERT_EQ(ibv_close_device(other), 0);
  errno = 0;
  EXPECT_EQ(fcntl(fd, F_GETFD), -1) << "closed with its context";
  EXPECT_EQ(errno, EBADF);
}

TEST_F(VerbsTest, EveryOpsSlotIsSet) {
  static_assert(sizeof(ibv_context_ops) % sizeof(void*) == 0);
  void* slots[sizeof(ibv_context_ops) / sizeof(void*)];
  std::memcpy(slots, &ctx_->ops, sizeof slots);
  for (size_t i = 0; i < std::size(slots); ++i) EXPECT_NE(slots[i], nullptr) << "ops slot " << i;
}

TEST_F(VerbsTest, EveryVerbsContextSlotIsSet) {
  verbs_context* vctx = verbs_get_ctx(ctx_);
  ASSERT_NE(vctx, nullptr);
  // Every pointer from the top of the struct up to _ABI_placeholder3 (an
  // integer the library never uses).
  constexpr size_t kSlots = offsetof(verbs_context, _ABI_placeholder3) / sizeof(void*);
  void* slots[kSlots];
  std::memcpy(slots, vctx, sizeof slots);
  for (size_t i = 0; i < kSlots; ++i) EXPECT_NE(slots[i], nullptr) << "verbs_context slot at offset " << i * 8;
  // verbs_get_ctx_op sees each op (sz is big enough for all of them).
  EXPECT_NE(verbs_get_ctx_op(ctx_, query_port), nullptr);
  EXPECT_NE(verbs_get_ctx_op(ctx_, close_xrcd), nullptr);
  EXPECT_NE(verbs_get_ctx_op(ctx_, create_cq_ex), nullptr);
}

TEST_F(VerbsTest, InlineQueryDeviceExWorks) {
  ibv_device_attr_ex attr;
  std::memset(&attr, 0xab, sizeof attr);
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &attr), 0);
  const ibv_device_attr& o = attr.orig_attr;
  EXPECT_NE(o.vendor_id, 0u);
  EXPECT_NE(o.vendor_id, 0x02c9u) << "never Mellanox's vendor id";
  EXPECT_NE(o.node_guid, 0u);
  EXPECT_NE(o.sys_image_guid, 0u);
  EXPECT_EQ(o.phys_port_cnt, 1);
  EXPECT_GE(o.max_cqe, 1);
  EXPECT_GE(o.max_pkeys, 1);
  EXPECT_GE(o.max_qp, 1);
  EXPECT_EQ(attr.phys_port_cnt_ex, 1u);
  EXPECT_EQ(o.node_guid, ibv_get_device_guid(list_[0]));

  ibv_query_device_ex_input input{};
  input.comp_mask = 1;
  EXPECT_EQ(ibv_query_device_ex(ctx_, &input, &attr), EINVAL);
}

TEST_F(VerbsTest, ExportedQueryDeviceWritesExactly232Bytes) {
  static_assert(sizeof(ibv_device_attr) == 232);
  std::vector<uint8_t> buf(sizeof(ibv_device_attr_ex) + 64, 0x5a);
  ASSERT_EQ(ibv_query_device(ctx_, reinterpret_cast<ibv_device_attr*>(buf.data())), 0);
  for (size_t i = 232; i < buf.size(); ++i) ASSERT_EQ(buf[i], 0x5a) << "byte " << i << " written";
  ibv_device_attr attr;
  std::memcpy(&attr, buf.data(), sizeof attr);
  EXPECT_EQ(attr.phys_port_cnt, 1);
  EXPECT_NE(attr.vendor_id, 0u);
  // The compat slot reaches the same code.
  std::vector<uint8_t> buf2(buf.size(), 0x5a);
  ASSERT_EQ(ctx_->ops._compat_query_device(ctx_, reinterpret_cast<ibv_device_attr*>(buf2.data())), 0);
  for (size_t i = 232; i < buf2.size(); ++i) ASSERT_EQ(buf2[i], 0x5a) << "byte " << i << " written";
}

TEST_F(VerbsTest, ExportedQueryPortWrites48BytesOnly) {
  // struct _compat_ibv_port_attr (incomplete in the public header) is
  // struct ibv_port_attr without port_cap_flags2: 48 bytes.
  static_assert(offsetof(ibv_port_attr, port_cap_flags2) == 48);
  std::vector<uint8_t> buf(sizeof(ibv_port_attr) + 32, 0x5a);
  // The exported symbol, as through the compat slot (the macro is bypassed).
  ASSERT_EQ(ctx_->ops._compat_query_port(ctx_, 1, reinterpret_cast<_compat_ibv_port_attr*>(buf.data())), 0);
  for (size_t i = 48; i < buf.size(); ++i) ASSERT_EQ(buf[i], 0x5a) << "byte " << i << " written";
  ibv_port_attr attr{};
  std::memcpy(&attr, buf.data(), 48);
  EXPECT_EQ(attr.state, IBV_PORT_ACTIVE);
  EXPECT_EQ(attr.link_layer, IBV_LINK_LAYER_ETHERNET);

  std::vector<uint8_t> buf2(buf.size(), 0x5a);
#undef ibv_query_port
  ASSERT_EQ(ibv_query_port(ctx_, 1, reinterpret_cast<_compat_ibv_port_attr*>(buf2.data())), 0);
  for (size_t i = 48; i < buf2.size(); ++i) ASSERT_EQ(buf2[i], 0x5a) << "byte " << i << " written";
  EXPECT_EQ(ibv_query_port(ctx_, 0, reinterpret_cast<_compat_ibv_port_attr*>(buf2.data())), EINVAL);
#define ibv_query_port(context, port_num, port_attr) ___ibv_query_port(context, port_num, port_attr)
}

TEST_F(VerbsTest, InlineQueryPortFillsEverything) {
  ibv_port_attr attr;
  std::memset(&attr, 0xab, sizeof attr);
  ASSERT_EQ(ibv_query_port(ctx_, 1, &attr), 0);
  EXPECT_EQ(attr.state, IBV_PORT_ACTIVE);
  EXPECT_EQ(attr.max_mtu, IBV_MTU_4096);
  EXPECT_EQ(attr.active_mtu, IBV_MTU_4096);
  EXPECT_EQ(attr.link_layer, IBV_LINK_LAYER_ETHERNET);
  EXPECT_EQ(attr.lid, 0);
  EXPECT_GE(attr.gid_tbl_len, 1);
  EXPECT_GE(attr.pkey_tbl_len, 1);
  EXPECT_GT(attr.max_msg_sz, 4096u);
  EXPECT_EQ(attr.active_width, 2);   // 4x
  EXPECT_EQ(attr.active_speed, 32);  // EDR
  EXPECT_EQ(attr.phys_state, 5);     // LinkUp
  EXPECT_TRUE(attr.flags & IBV_QPF_GRH_REQUIRED);
  EXPECT_NE(attr.port_cap_flags2, 0xabab) << "the inline call gets the whole struct";
}

TEST_F(VerbsTest, QueryPortRejectsPortsOtherThanOne) {
  ibv_port_attr attr;
  EXPECT_EQ(ibv_query_port(ctx_, 0, &attr), EINVAL);
  EXPECT_EQ(ibv_query_port(ctx_, 2, &attr), EINVAL);
  EXPECT_EQ(ibv_query_port(ctx_, 255, &attr), EINVAL);
}

TEST_F(VerbsTest, QueryGidIndexZeroIsTheIpv4MappedLoopbackAddress) {
  ibv_gid gid;
  ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &gid), 0);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(gid.raw[i], 0) << i;
  EXPECT_EQ(gid.raw[10], 0xff);
  EXPECT_EQ(gid.raw[11], 0xff);
  EXPECT_EQ(gid.raw[12], 127) << "an auto address of 127.0.0.0/8";
}

TEST_F(VerbsTest, QueryGidOfAnEmptyIndexIsSuccessAndZero) {
  ibv_gid gid;
  std::memset(&gid, 0xee, sizeof gid);
  ASSERT_EQ(ibv_query_gid(ctx_, 1, 1, &gid), 0);
  for (uint8_t b : gid.raw) EXPECT_EQ(b, 0);
  EXPECT_EQ(ibv_query_gid(ctx_, 1, 16, &gid), -1);
  EXPECT_EQ(ibv_query_gid(ctx_, 1, -1, &gid), -1);
  EXPECT_EQ(ibv_query_gid(ctx_, 2, 0, &gid), -1);
}

TEST_F(VerbsTest, QueryGidExReportsRoceV2AndEnodataForEmpty) {
  ibv_gid_entry entry;
  ASSERT_EQ(ibv_query_gid_ex(ctx_, 1, 0, &entry, 0), 0);
  EXPECT_EQ(entry.gid_type, IBV_GID_TYPE_ROCE_V2);
  EXPECT_EQ(entry.gid_index, 0u);
  EXPECT_EQ(entry.port_num, 1u);
  ibv_gid gid;
  ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &gid), 0);
  EXPECT_EQ(0, std::memcmp(&gid, &entry.gid, sizeof gid));

  EXPECT_EQ(ibv_query_gid_ex(ctx_, 1, 1, &entry, 0), ENODATA);
  EXPECT_EQ(ibv_query_gid_ex(ctx_, 1, 16, &entry, 0), EINVAL);
  EXPECT_EQ(ibv_query_gid_ex(ctx_, 2, 0, &entry, 0), EINVAL);
  EXPECT_NE(ibv_query_gid_ex(ctx_, 1, 0, &entry, 1), 0) << "unknown flags";
}

TEST_F(VerbsTest, QueryGidTable) {
  ibv_gid_entry entries[16];
  EXPECT_EQ(ibv_query_gid_table(ctx_, entries, 0, 0), -EINVAL);
  ASSERT_EQ(ibv_query_gid_table(ctx_, entries, 16, 0), 1);
  EXPECT_EQ(entries[0].gid_type, IBV_GID_TYPE_ROCE_V2);
  EXPECT_EQ(entries[0].port_num, 1u);
  EXPECT_EQ(entries[0].gid_index, 0u);
  EXPECT_EQ(ibv_query_gid_table(ctx_, entries, 1, 0), 1);
}

TEST_F(VerbsTest, QueryGidTypeIsRoceV2) {
  unsigned type = 99;
  ASSERT_EQ(ibv_query_gid_type(ctx_, 1, 0, &type), 0);
  EXPECT_EQ(type, 1u) << "IBV_GID_TYPE_SYSFS_ROCE_V2";
  type = 99;
  ASSERT_EQ(ibv_query_gid_type(ctx_, 1, 5, &type), 0) << "an empty slot succeeds";
  EXPECT_EQ(type, 0u);
  EXPECT_EQ(ibv_query_gid_type(ctx_, 1, 16, &type), -1);
  EXPECT_EQ(ibv_query_gid_type(ctx_, 3, 0, &type), -1);
}

TEST_F(VerbsTest, PkeyTableHoldsTheDefaultPkey) {
  __be16 pkey = 0;
  ASSERT_EQ(ibv_query_pkey(ctx_, 1, 0, &pkey), 0);
  EXPECT_EQ(ntohs(pkey), 0xffff);
  EXPECT_LT(ibv_query_pkey(ctx_, 1, 1, &pkey), 0);
  EXPECT_LT(ibv_query_pkey(ctx_, 2, 0, &pkey), 0);
  EXPECT_EQ(ibv_get_pkey_index(ctx_, 1, htons(0xffff)), 0);
  EXPECT_LT(ibv_get_pkey_index(ctx_, 1, htons(0x8001)), 0);
}

TEST_F(VerbsTest, AllocAndDeallocPd) {
  ibv_pd* a = ibv_alloc_pd(ctx_);
  ibv_pd* b = ibv_alloc_pd(ctx_);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a, b);
  EXPECT_EQ(a->context, ctx_);
  EXPECT_NE(a->handle, b->handle);
  EXPECT_EQ(ibv_dealloc_pd(a), 0);
  EXPECT_EQ(ibv_dealloc_pd(b), 0);
}

TEST_F(VerbsTest, RegMrAndDeregMr) {
  std::vector<char> buf(8192);
  ibv_mr* mr = ibv_reg_mr(Pd(), buf.data(), buf.size(),
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  ASSERT_NE(mr, nullptr) << std::strerror(errno);
  EXPECT_EQ(mr->context, ctx_);
  EXPECT_EQ(mr->pd, Pd());
  EXPECT_EQ(mr->addr, buf.data());
  EXPECT_EQ(mr->length, buf.size());
  EXPECT_NE(mr->lkey, 0u);
  EXPECT_NE(mr->rkey, 0u);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
}

TEST_F(VerbsTest, RegMrWithBadAccessFailsWithEinval) {
  std::vector<char> buf(4096);
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(Pd(), buf.data(), buf.size(), IBV_ACCESS_REMOTE_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(Pd(), buf.data(), buf.size(), IBV_ACCESS_REMOTE_ATOMIC), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_reg_mr_iova2(Pd(), buf.data(), buf.size(), 0x1000, 1u << 13), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  // Zero length at a page boundary (inside a page it registers, as on the kernel).
  void* page = aligned_alloc(4096, 4096);
  ASSERT_NE(page, nullptr);
  EXPECT_EQ(ibv_reg_mr(Pd(), page, 0, IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL);
  free(page);
  errno = 0;
  // A NULL start is only the implicit on-demand region (NULL, SIZE_MAX).
  EXPECT_EQ(ibv_reg_mr(Pd(), nullptr, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND), nullptr);
  EXPECT_EQ(errno, EFAULT);
}

TEST_F(VerbsTest, RegMrOfUnmappedMemoryIsEfault) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  // Another thread (the engine's, or ASan's allocator) may map a page into
  // the hole between munmap and the registration; only a registration that
  // succeeds on memory still unmapped afterwards is the device's fault.
  for (int attempt = 0; attempt < 20; ++attempt) {
    void* p = ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    ASSERT_EQ(::munmap(p, page), 0);
    errno = 0;
    ibv_mr* mr = ibv_reg_mr(Pd(), p, page, IBV_ACCESS_LOCAL_WRITE);
    if (mr == nullptr) {
      EXPECT_EQ(errno, EFAULT);
      return;
    }
    unsigned char resident = 0;
    const bool mapped_again = ::mincore(p, page, &resident) == 0;
    EXPECT_EQ(ibv_dereg_mr(mr), 0);
    ASSERT_TRUE(mapped_again) << "registered memory that is not mapped";
  }
  FAIL() << "the freed page was mapped again by another thread on every attempt";
}

TEST_F(VerbsTest, RegMrIova2AndOptionalAccessBits) {
  std::vector<char> buf(4096);
  ibv_mr* mr = ibv_reg_mr_iova2(Pd(), buf.data(), buf.size(), 0x10000,
                                IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING);
  ASSERT_NE(mr, nullptr) << std::strerror(errno);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  // An optional-range bit the device does not know is ignored, not refused.
  mr = ibv_reg_mr_iova2(Pd(), buf.data(), buf.size(), 0, IBV_ACCESS_LOCAL_WRITE | (1u << 21));
  ASSERT_NE(mr, nullptr) << std::strerror(errno);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
}

TEST_F(VerbsTest, ReregMr) {
  std::vector<char> a(4096), b(8192);
  ibv_mr* mr = ibv_reg_mr(Pd(), a.data(), a.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  const uint32_t lkey = mr->lkey, rkey = mr->rkey;

  // The keys stay across every kind of rereg, as on rxe and mlx5 (a peer
  // holding the rkey keeps using it).
  ASSERT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, b.data(), b.size(), 0), 0);
  EXPECT_EQ(mr->addr, b.data());
  EXPECT_EQ(mr->length, b.size());
  EXPECT_EQ(mr->lkey, lkey);
  EXPECT_EQ(mr->rkey, rkey);

  ASSERT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE),
            0);
  EXPECT_EQ(mr->addr, b.data()) << "translation unchanged";
  EXPECT_EQ(mr->rkey, rkey);

  ibv_pd* other = ibv_alloc_pd(ctx_);
  ASSERT_NE(other, nullptr);
  ASSERT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, other, nullptr, 0, 0), 0);
  EXPECT_EQ(mr->pd, other);
  EXPECT_EQ(mr->lkey, lkey);

  // Bad access flags, unknown flags, no flags: the man page's error code.
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_REMOTE_WRITE),
            IBV_REREG_MR_ERR_INPUT);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(mr, 1 << 10, nullptr, nullptr, 0, 0), IBV_REREG_MR_ERR_INPUT);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(mr, 0, nullptr, nullptr, 0, 0), IBV_REREG_MR_ERR_INPUT);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(mr->pd, other) << "a failed rereg leaves the MR as it was";
  EXPECT_EQ(mr->addr, b.data());

  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_dealloc_pd(other), 0);
}

TEST_F(VerbsTest, CreateCqValidatesItsArguments) {
  ibv_device_attr attr;
  ASSERT_EQ(ibv_query_device(ctx_, &attr), 0);
  errno = 0;
  EXPECT_EQ(ibv_create_cq(ctx_, 0, nullptr, nullptr, 0), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_create_cq(ctx_, -1, nullptr, nullptr, 0), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_create_cq(ctx_, attr.max_cqe + 1, nullptr, nullptr, 0), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_create_cq(ctx_, 16, nullptr, nullptr, ctx_->num_comp_vectors), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_create_cq(ctx_, 16, nullptr, nullptr, -1), nullptr);
  EXPECT_EQ(errno, EINVAL);

  ibv_cq* cq = ibv_create_cq(ctx_, attr.max_cqe, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr) << "max_cqe itself is allowed";
  EXPECT_GE(cq->cqe, attr.max_cqe);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

TEST_F(VerbsTest, CreateCqFillsThePublicFields) {
  int tag = 0;
  ibv_cq* cq = ibv_create_cq(ctx_, 32, &tag, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  EXPECT_EQ(cq->context, ctx_);
  EXPECT_EQ(cq->cq_context, &tag);
  EXPECT_EQ(cq->channel, nullptr);
  EXPECT_GE(cq->cqe, 32);
  EXPECT_EQ(cq->comp_events_completed, 0u);
  EXPECT_EQ(cq->async_events_completed, 0u);
  ibv_wc wc;
  EXPECT_EQ(ibv_poll_cq(cq, 1, &wc), 0) << "a new CQ is empty";
  EXPECT_EQ(ibv_req_notify_cq(cq, 0), EINVAL) << "no channel: no event can ever come";
  EXPECT_EQ(ibv_req_notify_cq(cq, 1), EINVAL);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

TEST_F(VerbsTest, CreateCqExRejectsUnsupportedWcFlags) {
  ibv_cq_init_attr_ex attr{};
  attr.cqe = 16;
  attr.wc_flags = IBV_WC_EX_WITH_CVLAN;
  errno = 0;
  EXPECT_EQ(ibv_create_cq_ex(ctx_, &attr), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  attr.wc_flags = IBV_WC_EX_WITH_FLOW_TAG;
  errno = 0;
  EXPECT_EQ(ibv_create_cq_ex(ctx_, &attr), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  attr.wc_flags = uint64_t{1} << 40;  // beyond IBV_CREATE_CQ_SUP_WC_FLAGS
  errno = 0;
  EXPECT_EQ(ibv_create_cq_ex(ctx_, &attr), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
}

TEST_F(VerbsTest, CreateCqExWithTimestampsWorks) {
  ibv_cq_init_attr_ex attr{};
  attr.cqe = 16;
  attr.wc_flags = uint64_t{IBV_WC_STANDARD_FLAGS} | uint64_t{IBV_WC_EX_WITH_COMPLETION_TIMESTAMP} |
                  uint64_t{IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK};
  ibv_cq_ex* cq = ibv_create_cq_ex(ctx_, &attr);
  ASSERT_NE(cq, nullptr) << std::strerror(errno);
  EXPECT_EQ(cq->context, ctx_);
  EXPECT_NE(cq->start_poll, nullptr);
  EXPECT_NE(cq->next_poll, nullptr);
  EXPECT_NE(cq->end_poll, nullptr);
  EXPECT_NE(cq->read_completion_ts, nullptr);
  EXPECT_NE(cq->read_completion_wallclock_ns, nullptr);
  EXPECT_NE(cq->read_cvlan, nullptr);
  EXPECT_NE(cq->read_flow_tag, nullptr);
  EXPECT_NE(cq->read_tm_info, nullptr);
  ibv_poll_cq_attr pattr{};
  EXPECT_EQ(ibv_start_poll(cq, &pattr), ENOENT) << "empty";
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
}

// The raw clock is the completion timestamps' clock: CLOCK_MONOTONIC in ns,
// which hca_core_clock (kHz) says; as libmlx5, the ticks are in tv_nsec, an
// unknown comp_mask bit is EINVAL and asking for nothing fills nothing.
TEST_F(VerbsTest, QueryRtValuesGivesTheClockOfTheCompletionTimestamps) {
  ibv_device_attr_ex attr{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &attr), 0);
  EXPECT_EQ(attr.hca_core_clock, 1000000u);
  timespec before{}, after{};
  ibv_values_ex values{};
  values.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
  clock_gettime(CLOCK_MONOTONIC, &before);
  ASSERT_EQ(ibv_query_rt_values_ex(ctx_, &values), 0);
  clock_gettime(CLOCK_MONOTONIC, &after);
  EXPECT_EQ(values.comp_mask, static_cast<uint32_t>(IBV_VALUES_MASK_RAW_CLOCK));
  auto ns = [](const timespec& t) { return int64_t{t.tv_sec} * 1000000000 + t.tv_nsec; };
  EXPECT_EQ(values.raw_clock.tv_sec, 0);
  EXPECT_LE(ns(before), ns(values.raw_clock));
  EXPECT_LE(ns(values.raw_clock), ns(after));
  values = {};
  EXPECT_EQ(ibv_query_rt_values_ex(ctx_, &values), 0);
  EXPECT_EQ(values.comp_mask, 0u);
  EXPECT_EQ(values.raw_clock.tv_nsec, 0);
  values.comp_mask = IBV_VALUES_MASK_RAW_CLOCK | (1u << 1);
  EXPECT_EQ(ibv_query_rt_values_ex(ctx_, &values), EINVAL);
}

TEST_F(VerbsTest, CreateCqExValidatesCqeAndVector) {
  ibv_cq_init_attr_ex attr{};
  attr.cqe = 0;
  errno = 0;
  EXPECT_EQ(ibv_create_cq_ex(ctx_, &attr), nullptr);
  EXPECT_EQ(errno, EINVAL);
  attr.cqe = 4;
  attr.comp_vector = 1;
  errno = 0;
  EXPECT_EQ(ibv_create_cq_ex(ctx_, &attr), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(VerbsTest, ResizeCq) {
  ibv_cq* cq = ibv_create_cq(ctx_, 8, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  EXPECT_EQ(ibv_resize_cq(cq, 64), 0);
  EXPECT_GE(cq->cqe, 64);
  EXPECT_EQ(ibv_resize_cq(cq, 4), 0) << "an empty CQ may shrink";
  EXPECT_GE(cq->cqe, 4);
  EXPECT_EQ(ibv_resize_cq(cq, 0), EINVAL);
  EXPECT_EQ(ibv_resize_cq(cq, INT_MAX), EINVAL);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

TEST_F(VerbsTest, CompChannelIsBusyWhileACqUsesIt) {
  ibv_comp_channel* ch = ibv_create_comp_channel(ctx_);
  ASSERT_NE(ch, nullptr);
  EXPECT_EQ(ch->context, ctx_);
  EXPECT_GE(ch->fd, 0);
  EXPECT_EQ(ch->refcnt, 0);
  ibv_cq* cq = ibv_create_cq(ctx_, 8, nullptr, ch, 0);
  ASSERT_NE(cq, nullptr);
  EXPECT_EQ(cq->channel, ch);
  EXPECT_EQ(ch->refcnt, 1);
  EXPECT_EQ(ibv_destroy_comp_channel(ch), EBUSY);
  EXPECT_EQ(ch->refcnt, 1) << "a refused destroy leaves the channel intact";
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ch->refcnt, 0);
  EXPECT_EQ(ibv_destroy_comp_channel(ch), 0);
}

TEST_F(VerbsTest, CompChannelOfAnotherContextIsRefused) {
  ibv_context* other = ibv_open_device(list_[0]);
  ASSERT_NE(other, nullptr);
  ibv_comp_channel* ch = ibv_create_comp_channel(other);
  ASSERT_NE(ch, nullptr);
  errno = 0;
  EXPECT_EQ(ibv_create_cq(ctx_, 8, nullptr, ch, 0), nullptr);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(ch->refcnt, 0);
  EXPECT_EQ(ibv_destroy_comp_channel(ch), 0);
  EXPECT_EQ(ibv_close_device(other), 0);
}

TEST_F(VerbsTest, AsyncFdIsPollableWithNothingPending) {
  pollfd p{ctx_->async_fd, POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 0), 0);
  int flags = ::fcntl(ctx_->async_fd, F_GETFL);
  ASSERT_GE(flags, 0);
  ASSERT_EQ(::fcntl(ctx_->async_fd, F_SETFL, flags | O_NONBLOCK), 0);
  ibv_async_event ev;
  errno = 0;
  EXPECT_EQ(ibv_get_async_event(ctx_, &ev), -1);
  EXPECT_EQ(errno, EAGAIN);
}

TEST_F(VerbsTest, TwoContextsHaveTheirOwnAsyncFds) {
  ibv_context* other = ibv_open_device(list_[0]);
  ASSERT_NE(other, nullptr);
  EXPECT_NE(other->async_fd, ctx_->async_fd);
  ibv_gid a, b;
  ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &a), 0);
  ASSERT_EQ(ibv_query_gid(other, 1, 0, &b), 0);
  EXPECT_EQ(0, std::memcmp(&a, &b, sizeof a)) << "contexts of one process share the device's GID";
  EXPECT_EQ(ibv_close_device(other), 0);
}

TEST_F(VerbsTest, UnimplementedInlineVerbsFailWithEopnotsupp) {
  ibv_cq* cq = ibv_create_cq(ctx_, 4, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_modify_cq_attr mattr{};
  mattr.attr_mask = IBV_CQ_ATTR_MODERATE;
  EXPECT_EQ(ibv_modify_cq(cq, &mattr), EOPNOTSUPP);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);

  ibv_counters_init_attr cattr{};
  errno = 0;
  EXPECT_EQ(ibv_create_counters(ctx_, &cattr), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);

  errno = 0;
  EXPECT_EQ(ibv_alloc_null_mr(Pd()), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
}

}  // namespace
