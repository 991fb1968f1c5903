// Launch functions of the GPU attention backends, one per kernel file. Only
// src/attention.cpp calls them, after validating the parameters: each assumes
// its table row's constraints hold (head dim, dtype, SM) and launches on
// p.stream. Plain C++ header so the CPU-side dispatch can include it.
#pragma once

#include "attention.h"

namespace runlm {

void attn_naive_launch(const AttnParams& p);  // kernels/cuda/attn_naive.cu
void attn_fa2_launch(const AttnParams& p);    // kernels/cuda/attn_fa2.cu
void attn_fa3_launch(const AttnParams& p);    // kernels/cuda/fa3/attn_fa3.cu

// fa3's d128 kernel variants with BN 128 (attn_fa3.cu: 1 FA3-order O
// rescale, the default kernel's loop; 0 v4's order; 2 ping-pong in v4's
// order, 3 ping-pong in FA3's order; head_dim 128 contiguous K/V only).
// Normally read once from RUNLM_FA3_VARIANT (unset: -1, the default kernel,
// BN 176); the setter overrides it (tests), -1 returns to the environment's
// value. attn_fa3_variant() is the value launches use now.
void attn_fa3_set_variant(int variant);
int attn_fa3_variant();

}  // namespace runlm
