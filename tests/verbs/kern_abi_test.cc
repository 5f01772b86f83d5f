// Kernel struct copies: every field lands where it belongs, fields rdma-core
// does not copy are left alone, and the result is byte-for-byte what the
// installed rdma-core 44 produces from the same input and the same destination.

#include <infiniband/sa.h>
#include <infiniband/verbs.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>

#include <cstdint>
#include <cstring>

#include "gtest/gtest.h"
#include "tests/verbs/real_libibverbs.h"
#include "verbs/abi/exports.h"

namespace {

// Fills a struct with distinct bytes so a field copied from the wrong place
// shows up.
template <typename T>
void Pattern(T* t, uint8_t seed) {
  auto* bytes = reinterpret_cast<uint8_t*>(t);
  for (size_t i = 0; i < sizeof(T); ++i) bytes[i] = static_cast<uint8_t>(seed + i * 7);
}

// The kernel only ever sends valid enum values; keep the ones that land in
// verbs.h enums in range (UBSan checks enum loads).
void Sanitize(ib_uverbs_qp_attr* qp) {
  qp->cur_qp_state = IBV_QPS_SQD;
  qp->path_mtu = IBV_MTU_1024;
  qp->path_mig_state = IBV_MIG_REARM;
}
void Sanitize(ib_uverbs_ah_attr*) {}
void Sanitize(ib_user_path_rec*) {}
void Sanitize(ibv_sa_path_rec*) {}

ib_uverbs_ah_attr KernAh(uint8_t seed) {
  ib_uverbs_ah_attr ah;
  Pattern(&ah, seed);
  return ah;
}

void ExpectAhEq(const ibv_ah_attr& dst, const ib_uverbs_ah_attr& src) {
  EXPECT_EQ(0, std::memcmp(dst.grh.dgid.raw, src.grh.dgid, 16));
  EXPECT_EQ(dst.grh.flow_label, src.grh.flow_label);
  EXPECT_EQ(dst.grh.sgid_index, src.grh.sgid_index);
  EXPECT_EQ(dst.grh.hop_limit, src.grh.hop_limit);
  EXPECT_EQ(dst.grh.traffic_class, src.grh.traffic_class);
  EXPECT_EQ(dst.dlid, src.dlid);
  EXPECT_EQ(dst.sl, src.sl);
  EXPECT_EQ(dst.src_path_bits, src.src_path_bits);
  EXPECT_EQ(dst.static_rate, src.static_rate);
  EXPECT_EQ(dst.is_global, src.is_global);
  EXPECT_EQ(dst.port_num, src.port_num);
}

TEST(KernAbi, AhAttrFromKern) {
  ib_uverbs_ah_attr src = KernAh(3);
  ibv_ah_attr dst;
  std::memset(&dst, 0, sizeof(dst));
  ibv_copy_ah_attr_from_kern(&dst, &src);
  ExpectAhEq(dst, src);
}

TEST(KernAbi, QpAttrFromKern) {
  ib_uverbs_qp_attr src;
  Pattern(&src, 11);
  Sanitize(&src);
  ibv_qp_attr dst;
  std::memset(&dst, 0, sizeof(dst));
  dst.qp_state = IBV_QPS_RTS;
  dst.rate_limit = 777;
  ibv_copy_qp_attr_from_kern(&dst, &src);

  EXPECT_EQ(static_cast<uint32_t>(dst.cur_qp_state), src.cur_qp_state);
  EXPECT_EQ(static_cast<uint32_t>(dst.path_mtu), src.path_mtu);
  EXPECT_EQ(static_cast<uint32_t>(dst.path_mig_state), src.path_mig_state);
  EXPECT_EQ(dst.qkey, src.qkey);
  EXPECT_EQ(dst.rq_psn, src.rq_psn);
  EXPECT_EQ(dst.sq_psn, src.sq_psn);
  EXPECT_EQ(dst.dest_qp_num, src.dest_qp_num);
  EXPECT_EQ(dst.qp_access_flags, src.qp_access_flags);
  EXPECT_EQ(dst.cap.max_send_wr, src.max_send_wr);
  EXPECT_EQ(dst.cap.max_recv_wr, src.max_recv_wr);
  EXPECT_EQ(dst.cap.max_send_sge, src.max_send_sge);
  EXPECT_EQ(dst.cap.max_recv_sge, src.max_recv_sge);
  EXPECT_EQ(dst.cap.max_inline_data, src.max_inline_data);
  ExpectAhEq(dst.ah_attr, src.ah_attr);
  ExpectAhEq(dst.alt_ah_attr, src.alt_ah_attr);
  EXPECT_EQ(dst.pkey_index, src.pkey_index);
  EXPECT_EQ(dst.alt_pkey_index, src.alt_pkey_index);
  EXPECT_EQ(dst.en_sqd_async_notify, src.en_sqd_async_notify);
  EXPECT_EQ(dst.sq_draining, src.sq_draining);
  EXPECT_EQ(dst.max_rd_atomic, src.max_rd_atomic);
  EXPECT_EQ(dst.max_dest_rd_atomic, src.max_dest_rd_atomic);
  EXPECT_EQ(dst.min_rnr_timer, src.min_rnr_timer);
  EXPECT_EQ(dst.port_num, src.port_num);
  EXPECT_EQ(dst.timeout, src.timeout);
  EXPECT_EQ(dst.retry_cnt, src.retry_cnt);
  EXPECT_EQ(dst.rnr_retry, src.rnr_retry);
  EXPECT_EQ(dst.alt_port_num, src.alt_port_num);
  EXPECT_EQ(dst.alt_timeout, src.alt_timeout);
  // Not copied by rdma-core either: the caller owns them.
  EXPECT_EQ(dst.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(dst.rate_limit, 777u);
}

void ExpectPathEq(const ibv_sa_path_rec& a, const ib_user_path_rec& k) {
  EXPECT_EQ(0, std::memcmp(a.dgid.raw, k.dgid, 16));
  EXPECT_EQ(0, std::memcmp(a.sgid.raw, k.sgid, 16));
  EXPECT_EQ(a.dlid, k.dlid);
  EXPECT_EQ(a.slid, k.slid);
  EXPECT_EQ(static_cast<uint32_t>(a.raw_traffic), k.raw_traffic);
  EXPECT_EQ(a.flow_label, k.flow_label);
  EXPECT_EQ(a.hop_limit, k.hop_limit);
  EXPECT_EQ(a.traffic_class, k.traffic_class);
  EXPECT_EQ(static_cast<uint32_t>(a.reversible), k.reversible);
  EXPECT_EQ(a.numb_path, k.numb_path);
  EXPECT_EQ(a.pkey, k.pkey);
  EXPECT_EQ(a.sl, k.sl);
  EXPECT_EQ(a.mtu_selector, k.mtu_selector);
  EXPECT_EQ(a.mtu, static_cast<uint8_t>(k.mtu));
  EXPECT_EQ(a.rate_selector, k.rate_selector);
  EXPECT_EQ(a.rate, k.rate);
  EXPECT_EQ(a.packet_life_time_selector, k.packet_life_time_selector);
  EXPECT_EQ(a.packet_life_time, k.packet_life_time);
  EXPECT_EQ(a.preference, k.preference);
}

TEST(KernAbi, PathRecFromKern) {
  ib_user_path_rec src;
  Pattern(&src, 5);
  ibv_sa_path_rec dst;
  std::memset(&dst, 0, sizeof(dst));
  ibv_copy_path_rec_from_kern(&dst, &src);
  ExpectPathEq(dst, src);
}

TEST(KernAbi, PathRecToKernAndBack) {
  ibv_sa_path_rec rec;
  std::memset(&rec, 0, sizeof(rec));
  for (int i = 0; i < 16; ++i) {
    rec.dgid.raw[i] = static_cast<uint8_t>(i);
    rec.sgid.raw[i] = static_cast<uint8_t>(0xf0 + i);
  }
  rec.dlid = htobe16(0x1234);
  rec.slid = htobe16(0x5678);
  rec.raw_traffic = 1;
  rec.flow_label = htobe32(0xabcde);
  rec.hop_limit = 64;
  rec.traffic_class = 3;
  rec.reversible = 1;
  rec.numb_path = 2;
  rec.pkey = htobe16(0xffff);
  rec.sl = 5;
  rec.mtu_selector = 2;
  rec.mtu = IBV_MTU_4096;
  rec.rate_selector = 2;
  rec.rate = IBV_RATE_100_GBPS;
  rec.packet_life_time_selector = 2;
  rec.packet_life_time = 14;
  rec.preference = 1;

  ib_user_path_rec kern;
  Pattern(&kern, 9);
  ibv_copy_path_rec_to_kern(&kern, &rec);
  ExpectPathEq(rec, kern);

  ibv_sa_path_rec back;
  std::memset(&back, 0, sizeof(back));
  ibv_copy_path_rec_from_kern(&back, &kern);
  EXPECT_EQ(0, std::memcmp(&back, &rec, sizeof(rec)));
}

// Runs ours and the real copy on identical inputs and identical destinations
// and compares the whole destination, padding included.
template <typename Dst, typename Src>
void CompareWithReal(void (*ours)(Dst*, Src*), void (*real)(Dst*, Src*), uint8_t seed) {
  Src src;
  Pattern(&src, seed);
  Sanitize(&src);
  Dst a, b;
  Pattern(&a, static_cast<uint8_t>(seed + 100));
  Pattern(&b, static_cast<uint8_t>(seed + 100));
  ours(&a, &src);
  real(&b, &src);
  EXPECT_EQ(0, std::memcmp(&a, &b, sizeof(Dst))) << "seed " << int(seed);
}

TEST(KernAbi, SameAsInstalledRdmaCore) {
  auto real_qp = REAL_SYMBOL(ibv_copy_qp_attr_from_kern);
  auto real_ah = REAL_SYMBOL(ibv_copy_ah_attr_from_kern);
  auto real_from = REAL_SYMBOL(ibv_copy_path_rec_from_kern);
  auto real_to = REAL_SYMBOL(ibv_copy_path_rec_to_kern);
  if (!real_qp || !real_ah || !real_from || !real_to)
    GTEST_SKIP() << rdmaemu::testing::kRealLibibverbs << " is not installed";
  for (uint8_t seed : {0, 1, 77, 200}) {
    CompareWithReal(ibv_copy_qp_attr_from_kern, real_qp, seed);
    CompareWithReal(ibv_copy_ah_attr_from_kern, real_ah, seed);
    CompareWithReal(ibv_copy_path_rec_from_kern, real_from, seed);
    CompareWithReal(ibv_copy_path_rec_to_kern, real_to, seed);
  }
}

}  // namespace
