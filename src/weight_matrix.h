// A model weight (src/model.h) as the matrix kernels take it (kernels/cpu/ops.h
// QMatrix): both engines hand their weights over through this one view.
#pragma once

#include "model.h"
#include "ops.h"

namespace runlm {

inline QMatrix qmatrix(const WeightView& w) { return QMatrix{w.type, w.data, w.row_bytes, w.ne0, w.ne1}; }

}  // namespace runlm
