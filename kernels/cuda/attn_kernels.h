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

}  // namespace runlm
