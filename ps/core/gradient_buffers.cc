#include "ps/core/gradient_buffers.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace dtrain::ps {

void GradientBuffers::Buffer::Claim(int64_t step, uint64_t request_id) {
  if (step == step_ && request_id == request_id_) return;
  step_ = step;
  request_id_ = request_id;
  std::fill(received_.begin(), received_.end(), 0);
  std::fill(applied_.begin(), applied_.end(), 0);
  std::fill(lent_.begin(), lent_.end(), Lent{});
  num_complete_ = 0;
  nonfinite_slice_.clear();
  has_gradient_norm_ = false;
  gradient_norm_ = 0.0;
  for (SparseRows& t : sparse_) {
    t.ids.clear();
    t.grads.clear();
    t.writer.clear();
    t.row_of.clear();
  }
}

namespace {

// Whether every float is finite: the exponent bits of NaN and Inf are all ones. Branch-free, so it vectorizes.
bool AllFinite(const float* x, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, 4);
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

}  // namespace

absl::Status GradientBuffers::Buffer::Write(int slice, int64_t offset, int64_t n, WireDtype dtype,
                                            const void* data, bool check_finite) {
  const int64_t length = length_[slice];
  if (offset < 0 || n < 0 || offset > length - n) {
    return absl::InvalidArgumentError(absl::StrCat("gradient for '", names_[slice], "': floats [", offset, ", ",
                                                   offset + n, ") outside its ", length, " values"));
  }
  if (offset == 0) {
    SetReceived(slice, 0);
  } else if (offset != received_[slice]) {
    return absl::InvalidArgumentError(absl::StrCat("gradient for '", names_[slice], "': floats from ", offset,
                                                   " after ", received_[slice], " (pieces of a slice come in order)"));
  }
  std::vector<float>& values = values_[slice];
  if (values.empty()) values.resize(length);
  if (lent_[slice].data != nullptr) {
    // Written again from its start, or continued from elsewhere than the lent floats' end: copied from here on
    // (the part lent so far first).
    if (offset != 0) std::copy_n(lent_[slice].data, offset, values.data());
    lent_[slice] = Lent{};
  }
  DecodeFloats(dtype, data, n, values.data() + offset);
  if (check_finite && nonfinite_slice_.empty() && !AllFinite(values.data() + offset, n)) {
    nonfinite_slice_ = names_[slice];
  }
  SetReceived(slice, received_[slice] + n);
  return absl::OkStatus();
}

void GradientBuffers::Buffer::SetReceived(int slice, int64_t floats) {
  if (received_[slice] == length_[slice]) --num_complete_;
  received_[slice] = floats;
  if (floats == length_[slice]) ++num_complete_;
}

void GradientBuffers::Buffer::Unlend(uint64_t writer) {
  for (size_t i = 0; i < lent_.size(); ++i) {
    if (lent_[i].data == nullptr || (writer != 0 && lent_[i].writer != writer)) continue;
    lent_[i] = Lent{};
    SetReceived(static_cast<int>(i), 0);
  }
}

absl::Status GradientBuffers::Buffer::Borrow(int slice, int64_t offset, int64_t n, const float* data,
                                             std::shared_ptr<const void> keep, bool check_finite, uint64_t writer) {
  const int64_t length = length_[slice];
  const Lent& lent = lent_[slice];
  const bool starts = offset == 0 && n <= length;
  // The next floats right behind those lent by the same attempt: the slice stays lent, in pieces.
  const bool continues = offset > 0 && offset == received_[slice] && n <= length - offset && lent.data != nullptr &&
                         lent.writer == writer && lent.data + offset == data;
  if (!starts && !continues) return Write(slice, offset, n, WireDtype::kF32, data, check_finite);
  if (starts) lent_[slice] = Lent{data, std::move(keep), writer};
  if (check_finite && nonfinite_slice_.empty() && !AllFinite(data, n)) nonfinite_slice_ = names_[slice];
  SetReceived(slice, offset + n);
  return absl::OkStatus();
}

absl::Status GradientBuffers::Buffer::WriteSparse(int table, const int64_t* ids, int64_t n, WireDtype dtype,
                                                  const void* rows, bool check_finite, uint64_t writer) {
  SparseRows& t = sparse_[table];
  const int dim = t.dim;
  const int el = DtypeBytes(dtype);
  const char* src = static_cast<const char*>(rows);
  for (int64_t i = 0; i < n; ++i) {
    auto [it, inserted] = t.row_of.try_emplace(ids[i], static_cast<uint32_t>(t.ids.size()));
    const uint32_t row = it->second;
    if (inserted) {
      t.ids.push_back(ids[i]);
      t.grads.resize(t.grads.size() + dim);
      t.writer.push_back(writer);
    } else if (t.writer[row] == writer) {
      return absl::InvalidArgumentError(absl::StrCat("sparse gradients of '", t.name, "': id ", ids[i],
                                                     " repeated within one push (sum them per id)"));
    } else {
      t.writer[row] = writer;  // a retried upload sends it again
    }
    float* dst = t.grads.data() + static_cast<int64_t>(row) * dim;
    DecodeFloats(dtype, src + i * dim * el, dim, dst);
    if (check_finite && nonfinite_slice_.empty() && !AllFinite(dst, dim)) nonfinite_slice_ = t.name;
  }
  return absl::OkStatus();
}

std::string GradientBuffers::Buffer::DescribeMissing() const {
  std::string out;
  for (size_t i = 0; i < length_.size(); ++i) {
    if (received_[i] == length_[i]) continue;
    absl::StrAppend(&out, out.empty() ? "" : ", ", "'", names_[i], "' (", received_[i], " of ", length_[i],
                    " floats)");
  }
  return out;
}

GradientBuffers::GradientBuffers(int num_workers, const SliceStore& store, const SparseStore* tables) {
  for (int w = 0; w < num_workers; ++w) {
    auto e = std::make_unique<Entry>();
    for (int i = 0; i < store.num_slices(); ++i) {
      e->buffer.names_.push_back(store.spec(i).variable);
      e->buffer.length_.push_back(store.spec(i).length);
    }
    e->buffer.values_.resize(store.num_slices());
    e->buffer.lent_.resize(store.num_slices());
    e->buffer.received_.assign(store.num_slices(), 0);
    e->buffer.applied_.assign(store.num_slices(), 0);
    for (int t = 0; tables != nullptr && t < tables->num_tables(); ++t) {
      Buffer::SparseRows rows;
      rows.name = tables->spec(t).name;
      rows.dim = tables->spec(t).dim;
      e->buffer.sparse_.push_back(std::move(rows));
    }
    entries_.push_back(std::move(e));
  }
}

GradientBuffers::Locked GradientBuffers::Lock(int worker) {
  Entry& e = *entries_[worker];
  return Locked(&e.mu, &e.buffer);
}

}  // namespace dtrain::ps
