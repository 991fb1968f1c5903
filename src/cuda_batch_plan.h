// The CUDA engine's batched step laid out for the device (BatchPlan): which
// items run through the paged decode kernel and which through prefill
// attention, their tokens, positions, cache slots and block tables.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "engine.h"

namespace runlm {

// Items of at most this many tokens run through the paged decode kernel.
constexpr int kMaxDecodeQ = 16;

// A batched step laid out for the device: tokens in execution order (short
// items first), where each goes, and the per-sequence tables of each group.
struct BatchPlan {
  std::vector<int> tokens, positions, slots;
  // Short items (paged decode kernel): query prefix sums, key lengths, tables.
  std::vector<int> dec_cu_q{0}, dec_seq_lens;
  std::vector<std::vector<int32_t>> dec_tables;
  // Long items (prefill attention on gathered K/V): query and key prefix sums.
  std::vector<int> pre_cu_q{0}, pre_cu_k{0};
  std::vector<std::vector<int32_t>> pre_tables;
  int dec_tokens = 0, max_dec_q = 0, max_dec_len = 0, max_pre_q = 0, max_pre_k = 0;
  // Rows of the step whose logits are wanted, in the items' order.
  std::vector<std::pair<int, int>> wanted;  // (item index, token row)
  std::vector<int32_t> logit_rows;

  void add(const BatchItem& it, const std::vector<int32_t>& table, int block_size, bool short_item, int item_index) {
    for (int i = 0; i < it.n_tokens; ++i) {
      const int p = it.pos + i;
      tokens.push_back(it.tokens[i]);
      positions.push_back(p);
      slots.push_back(table[p / block_size] * block_size + p % block_size);
    }
    const int len = it.pos + it.n_tokens;
    if (short_item) {
      max_dec_len = std::max(max_dec_len, len);
      dec_cu_q.push_back(dec_cu_q.back() + it.n_tokens);
      dec_seq_lens.push_back(len);
      dec_tables.push_back(table);
      dec_tokens += it.n_tokens;
      max_dec_q = std::max(max_dec_q, it.n_tokens);
    } else {
      pre_cu_q.push_back(pre_cu_q.back() + it.n_tokens);
      pre_cu_k.push_back(pre_cu_k.back() + len);
      pre_tables.push_back(table);
      max_pre_q = std::max(max_pre_q, it.n_tokens);
      max_pre_k = std::max(max_pre_k, len);
    }
    if (it.want_logits) {
      wanted.push_back({item_index, static_cast<int>(tokens.size()) - 1});
      std::sort(wanted.begin(), wanted.end());
      logit_rows.clear();
      for (const auto& w : wanted) logit_rows.push_back(w.second);
    }
  }
  int n_dec() const { return static_cast<int>(dec_seq_lens.size()); }
  int n_pre() const { return static_cast<int>(pre_cu_k.size()) - 1; }
};

}  // namespace runlm
