// Packed steps for nn.LSTM, nn.GRU and nn.RNN over a PackedSequence (rnn_layers.cpp): where
// each step's samples lie in the packed data, and the row indices the node's forward and
// backward gather with.
//
// A PackedSequence holds its sentences longest first; step t holds the first batch_sizes[t]
// samples, in rows start(t)..start(t) + batch_sizes[t] of its data, step after step. The
// sizes live on the host (PyTorch keeps them on the CPU), so every index here is computed on
// the host and uploaded as a kept table (tables.h: a batch of lengths seen before is not
// uploaded again).
#pragma once

#include "common.h"
#include "tables.h"

#include <vector>

namespace dft {

class Packing {
 public:
  Packing() = default;
  // `sizes`: a PackedSequence's batch_sizes (non-increasing, the first the batch).
  explicit Packing(std::vector<int64_t> sizes) : sizes_(std::move(sizes)) {
    starts_.reserve(sizes_.size());
    for (auto n : sizes_) {
      starts_.push_back(rows_);
      rows_ += n;
    }
  }

  // Whether the steps are packed (else every step holds the whole batch).
  bool packed() const { return !sizes_.empty(); }
  const std::vector<int64_t>& sizes() const { return sizes_; }
  int64_t steps() const { return int64_t(sizes_.size()); }
  int64_t batch() const { return sizes_.front(); }
  // Rows of all steps: the packed data's first dim.
  int64_t rows() const { return rows_; }

  // The sizes on the device, the recurrence op's last operand.
  at::Tensor device_sizes() const { return on_device(sizes_); }

  // Each sample's row at its last step: where the forward direction leaves its last states.
  at::Tensor last_rows() const {
    std::vector<int64_t> idx(batch());
    for (int64_t t = 0; t < steps(); ++t) {
      for (int64_t b = 0; b < sizes_[t]; ++b) idx[b] = starts_[t] + b;
    }
    return on_device(idx);
  }

  // For every packed row, the row its step continued from in cat(steps' h [rows], h0 [batch]):
  // the sample's row at the walk's step before (direction `d`: 0 from the first step, 1 from
  // the last), or its h0 row where the sample starts.
  at::Tensor previous_rows(int64_t d) const {
    std::vector<int64_t> idx(rows_);
    for (int64_t t = 0; t < steps(); ++t) {
      for (int64_t b = 0; b < sizes_[t]; ++b) {
        bool goes_on = d == 0 ? t > 0 : t + 1 < steps() && b < sizes_[t + 1];
        int64_t from = d == 0 ? t - 1 : t + 1;
        idx[starts_[t] + b] = goes_on ? starts_[from] + b : rows_ + b;
      }
    }
    return on_device(idx);
  }

 private:
  static at::Tensor on_device(const std::vector<int64_t>& v) {
    return upload_table(v, {int64_t(v.size())});
  }

  std::vector<int64_t> sizes_, starts_;
  int64_t rows_ = 0;
};

}  // namespace dft
