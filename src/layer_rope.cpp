#include "layer_rope.h"

namespace runlm {

std::vector<RopeSpec> layer_rope_specs(const Model& model, int n_ctx, std::vector<float>* factors) {
  const ModelConfig& c = model.config();
  const ModelWeights& mw = model.weights();
  auto decode = [&](const WeightView& w) {
    factors->assign(static_cast<size_t>(w.ne0), 0.0f);
    get_row(QMatrix{w.type, w.data, w.row_bytes, w.ne0, w.ne1}, 0, factors->data());
  };
  factors->clear();
  if (c.rope_factors == RopeFactors::Freqs) decode(mw.rope_long);
  if (c.rope_factors == RopeFactors::LongShort) decode(n_ctx > c.rope_orig_ctx ? mw.rope_long : mw.rope_short);
  std::vector<RopeSpec> specs;
  for (int l = 0; l < c.n_layers; ++l) {
    const bool local = c.local_rope && c.layer_uses_window(l);
    RopeSpec rs;
    rs.neox = c.rope_style == RopeStyle::NeoX;
    rs.n_rot = c.n_rot;
    rs.theta = local ? c.rope_theta_local : c.rope_theta;
    rs.freq_scale = local ? c.rope_freq_scale_local : c.rope_freq_scale;
    rs.factors = factors->empty() ? nullptr : factors->data();
    rs.attn_factor = c.rope_attn_factor;
    if (c.rope_yarn) {
      rs.ext_factor = 1.0f;
      rope_yarn_corr_dims(c.n_rot, c.rope_orig_ctx, rs.theta, c.rope_yarn_beta_fast, c.rope_yarn_beta_slow,
                          rs.corr_dims);
    }
    specs.push_back(rs);
  }
  return specs;
}

}  // namespace runlm
