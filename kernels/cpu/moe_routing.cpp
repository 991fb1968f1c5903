#include "moe_routing.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "common.h"
#include "ops.h"

namespace runlm {

void moe_route(const float* logits, const MoeRouting& r, int32_t* experts, float* weights, float* scratch) {
  RUNLM_CHECK(r.n_used > 0 && r.n_used <= r.n_expert, "moe_route: %d of %d experts", r.n_used, r.n_expert);
  std::copy(logits, logits + r.n_expert, scratch);
  if (r.softmax_first) softmax(scratch, r.n_expert);
  // ggml_argsort_top_k: indices by descending score.
  std::vector<int32_t> order(static_cast<size_t>(r.n_expert));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + r.n_used, order.end(), [&](int32_t a, int32_t b) {
    return scratch[a] > scratch[b] || (scratch[a] == scratch[b] && a < b);
  });
  for (int k = 0; k < r.n_used; ++k) {
    experts[k] = order[size_t(k)];
    weights[k] = scratch[order[size_t(k)]];
  }
  if (!r.softmax_first) softmax(weights, r.n_used);
  if (r.normalize) {
    double sum = 0;
    for (int k = 0; k < r.n_used; ++k) sum += weights[k];
    // llama.cpp clamps the sum at the smallest normal f16 against a division by zero.
    const float s = std::max(static_cast<float>(sum), 6.103515625e-5f);
    for (int k = 0; k < r.n_used; ++k) weights[k] /= s;
  }
  if (r.scale != 1.0f)
    for (int k = 0; k < r.n_used; ++k) weights[k] *= r.scale;
}

}  // namespace runlm
