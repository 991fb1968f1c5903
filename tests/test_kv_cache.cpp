// Block manager: pages, reference counts, prefix sharing, truncation.
#include <gtest/gtest.h>

#include <numeric>

#include "common.h"
#include "kv_cache.h"

using namespace runlm;

namespace {
std::vector<int> tokens(int n, int base = 100) {
  std::vector<int> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), base);
  return t;
}
}  // namespace

TEST(KvCache, GrowAllocatesPagesAndFreeReturnsThem) {
  BlockManager bm(10, 16);
  EXPECT_EQ(bm.add_sequence(1, tokens(5)), 0);
  ASSERT_TRUE(bm.grow(1, 33));  // 3 pages
  EXPECT_EQ(bm.block_table(1).size(), 3u);
  EXPECT_EQ(bm.n_free(), 7);
  EXPECT_EQ(bm.block_table(1)[0], 0);  // a fresh pool hands out 0, 1, 2...
  EXPECT_FALSE(bm.grow(1, 16 * 11));   // more than the pool: nothing changes
  EXPECT_EQ(bm.n_free(), 7);
  bm.free_sequence(1);
  EXPECT_EQ(bm.n_free(), 10);
  EXPECT_FALSE(bm.has_sequence(1));
}

TEST(KvCache, FullPagesOfACommonPrefixAreShared) {
  BlockManager bm(16, 16);
  auto a = tokens(40);
  bm.add_sequence(1, a);
  ASSERT_TRUE(bm.grow(1, 40));
  bm.commit(1, a, 40);  // pages 0 and 1 are full and registered
  auto b = tokens(40);
  b[35] = 7;  // differs inside the third page
  EXPECT_EQ(bm.add_sequence(2, b), 32);  // two full pages shared
  EXPECT_EQ(bm.block_table(2)[0], bm.block_table(1)[0]);
  EXPECT_EQ(bm.block_table(2)[1], bm.block_table(1)[1]);
  EXPECT_EQ(bm.ref_count(bm.block_table(1)[0]), 2);
  ASSERT_TRUE(bm.grow(2, 40));
  EXPECT_NE(bm.block_table(2)[2], bm.block_table(1)[2]);
  // Freeing the first keeps the shared pages alive for the second.
  const int shared = bm.block_table(1)[0];
  bm.free_sequence(1);
  EXPECT_EQ(bm.ref_count(shared), 1);
  auto c = tokens(40);
  EXPECT_EQ(bm.add_sequence(3, c), 32);  // still registered through sequence 2
}

TEST(KvCache, ADifferentFirstPageSharesNothing) {
  BlockManager bm(16, 16);
  auto a = tokens(40);
  bm.add_sequence(1, a);
  bm.grow(1, 40);
  bm.commit(1, a, 40);
  auto b = tokens(40);
  b[0] = 1;  // the chain differs from the first page on
  EXPECT_EQ(bm.add_sequence(2, b), 0);
}

TEST(KvCache, ThePromptsLastTokenIsNeverShared) {
  BlockManager bm(16, 16);
  auto a = tokens(32);
  bm.add_sequence(1, a);
  bm.grow(1, 32);
  bm.commit(1, a, 32);
  // An identical 32-token prompt shares one page only: the last token must
  // be computed again to get its logits.
  EXPECT_EQ(bm.add_sequence(2, a), 16);
}

TEST(KvCache, TruncateReleasesPagesAndUnregistersAPartialPage) {
  BlockManager bm(16, 16);
  auto a = tokens(48);
  bm.add_sequence(1, a);
  bm.grow(1, 48);
  bm.commit(1, a, 48);
  bm.truncate(1, 20);  // keeps page 0 (full) and page 1 (partial, will be rewritten)
  EXPECT_EQ(bm.block_table(1).size(), 2u);
  EXPECT_EQ(bm.seq_len(1), 20);
  EXPECT_EQ(bm.n_free(), 14);
  auto b = tokens(48);
  EXPECT_EQ(bm.add_sequence(2, b), 16);  // page 1 no longer matches: only page 0 is shared
}

TEST(KvCache, RejectsBadPageSizes) {
  EXPECT_THROW(BlockManager(8, 12), Error);
  EXPECT_THROW(BlockManager(8, 4), Error);
  EXPECT_THROW(BlockManager(8, 512), Error);
  EXPECT_THROW(BlockManager(0, 16), Error);
}

TEST(KvCache, FreedPrefixPagesStayCachedUntilThePoolNeedsThem) {
  BlockManager bm(4, 16);
  auto a = tokens(40);
  bm.add_sequence(1, a);
  ASSERT_TRUE(bm.grow(1, 40));
  bm.commit(1, a, 40);
  bm.free_sequence(1);
  EXPECT_EQ(bm.n_free(), 4);             // cached pages count as free
  EXPECT_EQ(bm.add_sequence(2, a), 32);  // and still serve the same prefix
  bm.free_sequence(2);
  // A different sequence that needs the whole pool evicts them.
  auto b = tokens(64, 5000);
  EXPECT_EQ(bm.add_sequence(3, b), 0);
  ASSERT_TRUE(bm.grow(3, 64));
  bm.free_sequence(3);
  EXPECT_EQ(bm.add_sequence(4, a), 0);   // the old prefix is gone
}
