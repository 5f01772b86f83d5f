// The send queue's memory: CopyArena (copies of consecutive datagrams end to
// end, freed in any order) and BuildGso joining those copies into one piece.
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "emulator/net/loop_internal.h"

namespace rdmaemu::net::internal {
namespace {

struct Live {
  int64_t ticket;
  uint8_t* at;
  size_t bytes;
};

TEST(CopyArenaTest, AllocationsLieEndToEndAndStartOverWhenAllAreFree) {
  CopyArena arena;
  int64_t t1 = -1, t2 = -1, t3 = -1;
  uint8_t* a = arena.Allocate(4112, &t1);
  uint8_t* b = arena.Allocate(4112, &t2);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(b, a + 4112);
  arena.Free(t1);
  arena.Free(t2);
  uint8_t* c = arena.Allocate(100, &t3);
  EXPECT_EQ(c, a) << "with nothing live the arena starts over at its beginning";
  arena.Free(t3);
}

TEST(CopyArenaTest, TheTailMovesOnlyPastFreedAllocationsAtTheFront) {
  CopyArena arena;
  const size_t quarter = CopyArena::kBytes / 4;
  int64_t t[4];
  uint8_t* first = arena.Allocate(quarter, &t[0]);
  ASSERT_NE(first, nullptr);
  for (int i = 1; i < 4; ++i) ASSERT_EQ(arena.Allocate(quarter, &t[i]), first + i * quarter);
  int64_t more = -1;
  EXPECT_EQ(arena.Allocate(1, &more), nullptr) << "full";
  EXPECT_EQ(more, -1);
  arena.Free(t[1]);  // not at the front: frees no room yet
  EXPECT_EQ(arena.Allocate(1, &more), nullptr);
  arena.Free(t[0]);  // the front, and the one after it: [0, half) is free
  uint8_t* wrapped = arena.Allocate(quarter, &more);
  EXPECT_EQ(wrapped, first) << "wraps to the beginning";
  int64_t more2 = -1;
  EXPECT_EQ(arena.Allocate(quarter, &more2), first + quarter);
  int64_t more3 = -1;
  EXPECT_EQ(arena.Allocate(1, &more3), nullptr) << "the wrapped head reached the tail";
}

TEST(CopyArenaTest, DeclinesWhatItShouldNotHold) {
  CopyArena arena;
  int64_t t = 0;
  EXPECT_EQ(arena.Allocate(0, &t), nullptr);
  EXPECT_EQ(t, -1);
  EXPECT_EQ(arena.Allocate(CopyArena::kBytes / 4 + 1, &t), nullptr);
  arena.Free(12345);  // an unknown ticket changes nothing
  EXPECT_NE(arena.Allocate(10, &t), nullptr);
}

// Random sizes, frees in random order: live allocations never overlap and
// stay inside the arena, and each keeps the bytes written into it.
TEST(CopyArenaTest, LiveAllocationsNeverOverlap) {
  CopyArena arena;
  std::mt19937 random(7);
  std::vector<Live> live;
  int declined = 0;
  uint8_t* base = nullptr;
  for (int step = 0; step < 200000; ++step) {
    if (live.empty() || random() % 100 < 55) {
      const size_t bytes = 1 + random() % 9000;
      int64_t ticket = -1;
      uint8_t* at = arena.Allocate(bytes, &ticket);
      if (at == nullptr) {
        ++declined;
        continue;
      }
      if (base == nullptr || at < base) base = at;
      std::memset(at, static_cast<int>(ticket & 0xff), bytes);
      for (const Live& l : live) {
        ASSERT_TRUE(at + bytes <= l.at || l.at + l.bytes <= at) << "step " << step;
      }
      live.push_back({ticket, at, bytes});
    } else {
      const size_t i = random() % live.size();
      const Live l = live[i];
      for (size_t k = 0; k < l.bytes; ++k) {
        ASSERT_EQ(l.at[k], static_cast<uint8_t>(l.ticket & 0xff)) << "step " << step;
      }
      arena.Free(l.ticket);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  for (const Live& l : live) EXPECT_LE(l.at + l.bytes, base + CopyArena::kBytes);
  EXPECT_GT(declined, 0) << "the test should also have filled the arena";
}

sockaddr_in Peer() {
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(0x7f000001);
  to.sin_port = htons(4791);
  return to;
}

// The datagrams of one message (headers, payload, trailer), as the engine
// hands them to Send.
struct Message {
  std::vector<std::vector<uint8_t>> headers, payloads, trailers;
  explicit Message(int datagrams) {
    for (int i = 0; i < datagrams; ++i) {
      headers.emplace_back(12, static_cast<uint8_t>(0x10 + i));
      payloads.emplace_back(4096, static_cast<uint8_t>(0x40 + i));
      trailers.emplace_back(4, static_cast<uint8_t>(0x80 + i));
    }
  }
  std::vector<iovec> Pieces(int i) {
    return {{headers[i].data(), 12}, {payloads[i].data(), 4096}, {trailers[i].data(), 4}};
  }
};

TEST(BuildGsoTest, CopiedDatagramsOfARunLeaveAsOnePiece) {
  SendPool pool;
  Message m(8);
  std::vector<int> ids;
  for (int i = 0; i < 8; ++i) ids.push_back(pool.Acquire(0, Peer(), m.Pieces(i)));
  GsoMessage out;
  BuildGso(pool, [&](int k) { return ids[k]; }, 8, /*gso=*/true, &out);
  EXPECT_EQ(out.count, 8);
  ASSERT_EQ(out.msg.msg_iovlen, 1u);
  ASSERT_EQ(out.iov[0].iov_len, 8u * 4112);
  const auto* bytes = static_cast<const uint8_t*>(out.iov[0].iov_base);
  for (int i = 0; i < 8; ++i) {
    const uint8_t* d = bytes + i * 4112;
    EXPECT_EQ(d[0], 0x10 + i);
    EXPECT_EQ(d[12], 0x40 + i);
    EXPECT_EQ(d[12 + 4095], 0x40 + i);
    EXPECT_EQ(d[4108], 0x80 + i);
  }
  for (int id : ids) pool.Release(id);
}

TEST(BuildGsoTest, BorrowedPayloadsStayPiecesOfTheirOwn) {
  SendPool pool;
  Message m(4);
  std::vector<int> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(pool.Acquire(0, Peer(), m.Pieces(i), 0, Gathered::kBorrowPayload));
  GsoMessage out;
  BuildGso(pool, [&](int k) { return ids[k]; }, 4, /*gso=*/true, &out);
  EXPECT_EQ(out.count, 4);
  ASSERT_EQ(out.msg.msg_iovlen, 12u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out.iov[3 * i + 1].iov_base, m.payloads[i].data());
  for (int id : ids) pool.Release(id);
}

}  // namespace
}  // namespace rdmaemu::net::internal
