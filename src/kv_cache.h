// The paged KV cache's bookkeeping (vLLM's block manager): a pool of
// fixed-size pages with reference counts and a free list, a block table per
// sequence, and prefix sharing. Only full pages are shared: a full page is
// never written again, so sharing needs no copy-on-write. A full page is
// known by a hash chained over the tokens of every page up to it, so two
// sequences that start with the same tokens (a system prompt, earlier chat
// turns) map those pages to the same physical pages. A registered page whose
// last user is gone stays cached (least recently freed first to be reused),
// so a later request with the same prefix still finds it, as vLLM's
// automatic prefix caching does. The memory itself belongs to the engine
// (src/paged_kv.h describes its layout).
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

namespace runlm {

class BlockManager {
 public:
  BlockManager(int n_pages, int block_size);

  int block_size() const { return block_size_; }
  int n_pages() const { return static_cast<int>(ref_.size()); }
  // Pages a new allocation can take: never used, or cached but unreferenced.
  int n_free() const { return static_cast<int>(free_.size() + evictable_.size()); }
  // Pages a sequence of n tokens occupies.
  int pages_for(int n_tokens) const { return (n_tokens + block_size_ - 1) / block_size_; }

  // Starts a sequence. Shares the longest run of full pages of `prompt` that
  // another sequence has already computed; returns how many leading tokens
  // are covered (their K/V need not be computed again).
  int add_sequence(int seq_id, const std::vector<int>& prompt);
  // Makes room for positions [len, new_len): false (and nothing changes)
  // when the pool lacks free pages.
  bool grow(int seq_id, int new_len);
  // Records that positions [0, n) of the sequence now hold K/V for
  // tokens[0, n), so its full pages can be shared.
  void commit(int seq_id, const std::vector<int>& tokens, int n);
  // Drops the sequence's pages (shared ones are released, not freed).
  void free_sequence(int seq_id);
  // Shortens a sequence to n tokens (a chat turn that diverges).
  void truncate(int seq_id, int n);
  // Sliding window: gives back the pages that lie wholly before position
  // `first_needed` (no later query can see them). Their table entries become
  // -1; kernels never read pages outside the window.
  void release_before(int seq_id, int first_needed);

  bool has_sequence(int seq_id) const { return seqs_.count(seq_id) > 0; }
  const std::vector<int32_t>& block_table(int seq_id) const;
  int seq_len(int seq_id) const;
  int ref_count(int page) const { return ref_[page]; }

 private:
  struct Sequence {
    std::vector<int32_t> pages;
    int len = 0;              // positions reserved (grow) and, after commit, filled
    int n_committed_pages = 0;  // leading full pages registered in the hash table
    uint64_t last_hash = 0;   // hash chain value after the last committed page
    int n_released = 0;       // leading pages given back by release_before (entries -1)
  };
  int alloc_page();
  void retain_page(int page);
  void release_page(int page);
  uint64_t page_hash(uint64_t prev, const int* tokens) const;
  Sequence& seq(int seq_id);
  const Sequence& seq(int seq_id) const;

  int block_size_;
  std::vector<int> ref_;           // [n_pages] reference counts
  std::vector<int32_t> free_;      // unregistered free pages (a stack)
  std::list<int32_t> evictable_;   // registered pages with no user, least recently freed first
  std::vector<std::list<int32_t>::iterator> evict_pos_;  // [n_pages] position in evictable_
  std::vector<uint64_t> page_key_;  // [n_pages] hash of a registered full page, 0 = none
  std::unordered_map<uint64_t, int32_t> by_hash_;  // full page hash -> page
  std::unordered_map<int, Sequence> seqs_;
};

}  // namespace runlm
