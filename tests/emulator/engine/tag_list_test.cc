// The matching list of a tag-matching SRQ, alone.
#include "emulator/engine/tag_list.h"

#include <gtest/gtest.h>

namespace rdmaemu::engine {
namespace {

TaggedBuffer Tag(uint64_t tag, uint64_t mask, uint64_t wr_id) {
  TaggedBuffer b;
  b.tag = tag;
  b.mask = mask;
  b.recv_wr_id = wr_id;
  return b;
}

TEST(TagListTest, MatchesUnderTheMaskAndConsumes) {
  TagList list(4);
  auto h = list.Add(Tag(0x1234, 0xff, 7));
  ASSERT_TRUE(h.ok());
  EXPECT_NE(*h, 0u);
  EXPECT_FALSE(list.Match(0x1233).has_value());
  auto m = list.Match(0x9934);  // differs only outside the mask
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->recv_wr_id, 7u);
  EXPECT_EQ(list.size(), 0u);
  EXPECT_FALSE(list.Match(0x1234).has_value());
  EXPECT_EQ(list.Remove(*h).code(), ENOENT);  // consumed
}

TEST(TagListTest, OldestMatchingBufferWinsEvenInALowerSlot) {
  TagList list(4);
  auto a = list.Add(Tag(1, ~0ull, 1));
  auto b = list.Add(Tag(5, 0, 2));  // matches anything
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(list.Remove(*a).ok());
  auto c = list.Add(Tag(5, ~0ull, 3));  // reuses slot 1, but is newer
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, *a);
  auto m = list.Match(5);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->recv_wr_id, 2u);
  m = list.Match(5);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->recv_wr_id, 3u);
}

TEST(TagListTest, FullListRefusesAndUnknownHandleIsNotFound) {
  TagList list(2);
  ASSERT_TRUE(list.Add(Tag(1, ~0ull, 1)).ok());
  ASSERT_TRUE(list.Add(Tag(2, ~0ull, 2)).ok());
  EXPECT_EQ(list.Add(Tag(3, ~0ull, 3)).status().code(), ENOMEM);
  EXPECT_EQ(list.Remove(0).code(), ENOENT);
  EXPECT_EQ(list.Remove(3).code(), ENOENT);
  EXPECT_TRUE(list.Remove(2).ok());
  EXPECT_EQ(list.Remove(2).code(), ENOENT);
  EXPECT_TRUE(list.Add(Tag(3, ~0ull, 3)).ok());
}

TEST(TagListTest, UnexpectedMessageSuspendsMatchingUntilSyncWithTheCount) {
  TagList list(4);
  ASSERT_TRUE(list.Add(Tag(9, ~0ull, 9)).ok());
  list.CountUnexpected();
  EXPECT_FALSE(list.matching());
  EXPECT_FALSE(list.Match(9).has_value());
  EXPECT_FALSE(list.Sync(0));  // stale: changes nothing
  list.CountUnexpected();
  EXPECT_FALSE(list.Sync(1));  // stale again: two arrived
  EXPECT_TRUE(list.Sync(2));
  EXPECT_EQ(list.acknowledged(), 2u);
  auto m = list.Match(9);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->recv_wr_id, 9u);
}

}  // namespace
}  // namespace rdmaemu::engine
