#include "kv_cache.h"

#include <algorithm>

#include "common.h"

namespace runlm {

BlockManager::BlockManager(int n_pages, int block_size) : block_size_(block_size) {
  RUNLM_CHECK(block_size >= 8 && block_size <= 256 && (block_size & (block_size - 1)) == 0,
              "--block-size must be a power of two in [8, 256], got %d", block_size);
  RUNLM_CHECK(n_pages > 0, "the KV cache has no pages (-c or --kv-mem too small)");
  ref_.assign(static_cast<size_t>(n_pages), 0);
  page_key_.assign(static_cast<size_t>(n_pages), 0);
  evict_pos_.assign(static_cast<size_t>(n_pages), evictable_.end());
  // Low page indices come out first (a fresh single sequence gets 0, 1, 2...).
  for (int p = n_pages - 1; p >= 0; --p) free_.push_back(p);
}

BlockManager::Sequence& BlockManager::seq(int seq_id) {
  auto it = seqs_.find(seq_id);
  RUNLM_CHECK(it != seqs_.end(), "KV cache: unknown sequence %d", seq_id);
  return it->second;
}
const BlockManager::Sequence& BlockManager::seq(int seq_id) const {
  auto it = seqs_.find(seq_id);
  RUNLM_CHECK(it != seqs_.end(), "KV cache: unknown sequence %d", seq_id);
  return it->second;
}

uint64_t BlockManager::page_hash(uint64_t prev, const int* tokens) const {
  // FNV-1a over the previous hash and the page's tokens; 0 is reserved for
  // "not registered".
  uint64_t h = 1469598103934665603ull ^ prev;
  for (int i = 0; i < block_size_; ++i) {
    h ^= static_cast<uint32_t>(tokens[i]);
    h *= 1099511628211ull;
  }
  return h ? h : 1;
}

int BlockManager::alloc_page() {
  int p;
  if (!free_.empty()) {
    p = free_.back();
    free_.pop_back();
  } else {
    // Reuse the cached page freed longest ago; it no longer holds a prefix.
    p = evictable_.front();
    evictable_.pop_front();
    evict_pos_[p] = evictable_.end();
    by_hash_.erase(page_key_[p]);
    page_key_[p] = 0;
  }
  ref_[p] = 1;
  return p;
}

void BlockManager::retain_page(int page) {
  if (ref_[page]++ == 0) {  // a cached page comes back into use
    evictable_.erase(evict_pos_[page]);
    evict_pos_[page] = evictable_.end();
  }
}

void BlockManager::release_page(int page) {
  if (--ref_[page] > 0) return;
  if (page_key_[page]) {
    evict_pos_[page] = evictable_.insert(evictable_.end(), page);
  } else {
    free_.push_back(page);
  }
}

int BlockManager::add_sequence(int seq_id, const std::vector<int>& prompt) {
  RUNLM_CHECK(!seqs_.count(seq_id), "KV cache: sequence %d exists already", seq_id);
  Sequence s;
  // Share full pages while the chain of hashes is known. The last prompt
  // token is never covered: its logits are needed, so it must be computed.
  const int shareable = std::max(0, static_cast<int>(prompt.size()) - 1) / block_size_;
  for (int j = 0; j < shareable; ++j) {
    const uint64_t h = page_hash(s.last_hash, prompt.data() + static_cast<size_t>(j) * block_size_);
    auto it = by_hash_.find(h);
    if (it == by_hash_.end()) break;
    retain_page(it->second);
    s.pages.push_back(it->second);
    s.last_hash = h;
    ++s.n_committed_pages;
  }
  s.len = static_cast<int>(s.pages.size()) * block_size_;
  const int covered = s.len;
  seqs_.emplace(seq_id, std::move(s));
  return covered;
}

bool BlockManager::grow(int seq_id, int new_len) {
  Sequence& s = seq(seq_id);
  const int need = pages_for(new_len) - static_cast<int>(s.pages.size());
  if (need > n_free()) return false;
  for (int i = 0; i < need; ++i) s.pages.push_back(alloc_page());
  s.len = std::max(s.len, new_len);
  return true;
}

void BlockManager::commit(int seq_id, const std::vector<int>& tokens, int n) {
  Sequence& s = seq(seq_id);
  RUNLM_CHECK(n <= static_cast<int>(tokens.size()) && n <= s.len, "KV cache: commit past the sequence");
  const int full = n / block_size_;
  for (int j = s.n_committed_pages; j < full; ++j) {
    const uint64_t h = page_hash(s.last_hash, tokens.data() + static_cast<size_t>(j) * block_size_);
    const int page = s.pages[j];
    // Another sequence may have registered the same content first: keep its
    // page in the table and leave this one private (it is freed with us).
    if (!by_hash_.count(h) && !page_key_[page]) {
      by_hash_.emplace(h, page);
      page_key_[page] = h;
    }
    s.last_hash = h;
    s.n_committed_pages = j + 1;
  }
}

void BlockManager::free_sequence(int seq_id) {
  Sequence& s = seq(seq_id);
  for (int32_t p : s.pages)
    if (p >= 0) release_page(p);
  seqs_.erase(seq_id);
}

void BlockManager::release_before(int seq_id, int first_needed) {
  Sequence& s = seq(seq_id);
  const int n = std::min(first_needed / block_size_, static_cast<int>(s.pages.size()));
  for (int j = s.n_released; j < n; ++j) {
    release_page(s.pages[j]);
    s.pages[j] = -1;
  }
  s.n_released = std::max(s.n_released, n);
}

void BlockManager::truncate(int seq_id, int n) {
  Sequence& s = seq(seq_id);
  if (n >= s.len) return;
  const int keep = pages_for(n);
  RUNLM_CHECK(keep > s.n_released || keep == 0, "KV cache: cannot truncate into released pages of sequence %d", seq_id);
  for (int j = static_cast<int>(s.pages.size()) - 1; j >= keep; --j)
    if (s.pages[j] >= 0) release_page(s.pages[j]);
  s.pages.resize(static_cast<size_t>(keep));
  s.len = n;
  // A partly kept last page will be written again: it must not be shared.
  // Re-derive the hash chain up to the last full page kept.
  if (s.n_committed_pages > n / block_size_) {
    s.n_committed_pages = 0;
    s.last_hash = 0;
  }
  if (keep > 0 && n % block_size_ != 0 && ref_[s.pages[keep - 1]] == 1 && page_key_[s.pages[keep - 1]]) {
    // Our own registered page will be overwritten from n on: unregister it.
    by_hash_.erase(page_key_[s.pages[keep - 1]]);
    page_key_[s.pages[keep - 1]] = 0;
  }
  if (keep > 0 && n % block_size_ != 0 && ref_[s.pages[keep - 1]] > 1) {
    // The partial page is shared with another sequence: copying it would need
    // the engine; give this sequence a fresh page instead and let it recompute.
    release_page(s.pages[keep - 1]);
    s.pages.pop_back();
    s.len = (keep - 1) * block_size_;
  }
}

const std::vector<int32_t>& BlockManager::block_table(int seq_id) const { return seq(seq_id).pages; }
int BlockManager::seq_len(int seq_id) const { return seq(seq_id).len; }

}  // namespace runlm
