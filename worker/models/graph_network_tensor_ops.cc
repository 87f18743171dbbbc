// GraphNetwork's tensor ops of imported graphs (graph.h: kTranspose ... kVariable): how each is made, run
// forward and backward on the Device's tensor ops (kernels/tensor_ops.h), and the broadcasting addressing that
// Binary and Expand share.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/models/graph_network.h"
#include "worker/models/graph_network_step.h"

namespace dtrain::models {
namespace {

int64_t Product(const std::vector<int64_t>& v, size_t from, size_t to) {
  int64_t n = 1;
  for (size_t k = from; k < to; ++k) n *= v[k];
  return n;
}

// A strided copy from dims and strides of any rank: size-1 dims dropped and neighbours contiguous on both sides
// merged; InvalidArgument when more than kMaxCopyRank dims remain.
absl::StatusOr<kernels::StridedCopyParams> MakeCopy(const std::vector<int64_t>& dims,
                                                    const std::vector<int64_t>& src,
                                                    const std::vector<int64_t>& dst) {
  std::vector<int64_t> d, s, t;
  for (size_t k = 0; k < dims.size(); ++k) {
    if (dims[k] == 1) continue;
    if (!d.empty() && s.back() == src[k] * dims[k] && t.back() == dst[k] * dims[k]) {
      d.back() *= dims[k];
      s.back() = src[k];
      t.back() = dst[k];
      continue;
    }
    d.push_back(dims[k]);
    s.push_back(src[k]);
    t.push_back(dst[k]);
  }
  if (d.empty()) d = {1}, s = {0}, t = {0};
  if (d.size() > static_cast<size_t>(kernels::kMaxCopyRank)) {
    return absl::InvalidArgumentError(absl::StrCat("a copy over ", d.size(), " dims (at most ",
                                                   kernels::kMaxCopyRank, " supported)"));
  }
  kernels::StridedCopyParams p;
  p.rank = static_cast<int>(d.size());
  for (int k = 0; k < p.rank; ++k) {
    p.dims[k] = d[k];
    p.src_strides[k] = s[k];
    p.dst_strides[k] = t[k];
  }
  return p;
}

// The same copy the other way (the backward of a copy that reads each source element at most once).
kernels::StridedCopyParams Reversed(kernels::StridedCopyParams p) {
  for (int k = 0; k < p.rank; ++k) std::swap(p.src_strides[k], p.dst_strides[k]);
  return p;
}

// Strides of `operand` along each full axis of y (right-aligned), 0 where it is broadcast.
std::vector<int64_t> AlignedStrides(const std::vector<int64_t>& y, const TensorShape& operand, int64_t batch) {
  const std::vector<int64_t> d = operand.FullDims(batch), s = operand.Strides(batch);
  std::vector<int64_t> out(y.size(), 0);
  const size_t shift = y.size() - d.size();
  for (size_t j = 0; j < d.size(); ++j) out[shift + j] = d[j] == 1 && y[shift + j] != 1 ? 0 : s[j];
  return out;
}

// Progression start and step of `indices` (step 1 for one index); false when they are not one.
bool Progression(const std::vector<int64_t>& indices, int64_t* start, int64_t* step) {
  *start = indices[0];
  *step = indices.size() > 1 ? indices[1] - indices[0] : 1;
  if (*step < 1) return false;
  for (size_t j = 1; j < indices.size(); ++j) {
    if (indices[j] - indices[j - 1] != *step) return false;
  }
  return true;
}

}  // namespace

std::vector<int> StorageOrder(const TensorShape& s) {
  if (s.is_image()) return {0, 2, 3, 1};
  std::vector<int> order(s.full_rank());
  std::iota(order.begin(), order.end(), 0);
  return order;
}

absl::StatusOr<kernels::BroadcastParams> BroadcastOver(const TensorShape& y, int64_t batch, const TensorShape& a,
                                                       const TensorShape& b, kernels::BinaryOp op) {
  const std::vector<int64_t> yd = y.FullDims(batch);
  const std::vector<int64_t> as = AlignedStrides(yd, a, batch), bs = AlignedStrides(yd, b, batch);
  // In y's storage order, size-1 dims dropped, neighbours contiguous for both operands merged (y is dense).
  std::vector<int64_t> md, mas, mbs;
  for (int k : StorageOrder(y)) {
    if (yd[k] == 1) continue;
    if (!md.empty() && mas.back() == as[k] * yd[k] && mbs.back() == bs[k] * yd[k]) {
      md.back() *= yd[k];
      mas.back() = as[k];
      mbs.back() = bs[k];
      continue;
    }
    md.push_back(yd[k]);
    mas.push_back(as[k]);
    mbs.push_back(bs[k]);
  }
  if (md.empty()) md = {1}, mas = {0}, mbs = {0};
  if (md.size() > static_cast<size_t>(kernels::kMaxBroadcastRank)) {
    return absl::InvalidArgumentError(absl::StrCat("broadcasting over ", md.size(), " dims (at most ",
                                                   kernels::kMaxBroadcastRank, " supported)"));
  }
  kernels::BroadcastParams p;
  p.op = op;
  p.rank = static_cast<int>(md.size());
  for (size_t k = 0; k < md.size(); ++k) {
    p.dims[k] = md[k];
    p.a_strides[k] = mas[k];
    p.b_strides[k] = mbs[k];
  }
  return p;
}

float* GraphNetwork::GradTarget(const Step& s, size_t k) const {
  return s.in_grad[k].accumulate ? scratch_ : s.in_grad[k].dst;
}

absl::Status GraphNetwork::FinishGrad(const Step& s, size_t k) {
  const Step::InGrad& g = s.in_grad[k];
  if (!g.accumulate) return absl::OkStatus();
  return device_->Axpy(1.0f, scratch_, g.dst, act_n_[s.node->inputs[k]]);
}

absl::Status GraphNetwork::BuildTensorOp(Step& s) {
  const Node& n = *s.node;
  const TensorShape& y = graph_.tensors[n.output];
  const std::vector<int64_t> yd = y.FullDims(batch_), ys = y.Strides(batch_);
  const TensorShape* x = n.inputs.empty() ? nullptr : &graph_.tensors[n.inputs[0]];
  switch (n.op) {
    case Op::kTranspose: {
      if (s.view) return absl::OkStatus();
      const std::vector<int64_t> xs = x->Strides(batch_);
      std::vector<int64_t> src;
      for (int k : n.perm) src.push_back(xs[k]);
      ASSIGN_OR_RETURN(s.copy, MakeCopy(yd, src, ys));
      return absl::OkStatus();
    }
    case Op::kSlice:
    case Op::kGather: {
      const std::vector<int64_t> xs = x->Strides(batch_);
      std::vector<int64_t> src = xs;
      s.src_offset = 0;
      if (n.op == Op::kSlice) {
        for (size_t k = 0; k < xs.size(); ++k) {
          s.src_offset += n.starts[k] * xs[k];
          src[k] = xs[k] * n.steps[k];
        }
        ASSIGN_OR_RETURN(s.copy, MakeCopy(yd, src, ys));
        return absl::OkStatus();
      }
      int64_t start, step;
      if (Progression(n.indices, &start, &step)) {  // a slice along the axis
        s.src_offset = start * xs[n.axis];
        src[n.axis] = xs[n.axis] * step;
        ASSIGN_OR_RETURN(s.copy, MakeCopy(yd, src, ys));
        return absl::OkStatus();
      }
      if (x->is_image()) {
        return absl::InvalidArgumentError("a Gather of arbitrary rows of an image (supported: rows of tensors "
                                          "stored in their logical order)");
      }
      // Rows picked by index: x as [outer, rows, inner], one Device::Gather per outer block.
      const std::vector<int64_t> xd = x->FullDims(batch_);
      const int64_t inner = Product(xd, n.axis + 1, xd.size());
      if (inner > INT32_MAX || xd[n.axis] > INT32_MAX) {
        return absl::InvalidArgumentError("a Gather of rows larger than 2^31 floats");
      }
      s.gather.rows = xd[n.axis];
      s.gather.dim = static_cast<int>(inner);
      s.gather.count = static_cast<int64_t>(n.indices.size());
      s.gather_outer = Product(xd, 0, n.axis);
      s.gather_x_block = xd[n.axis] * inner;
      s.gather_y_block = s.gather.count * inner;
      std::vector<int32_t> idx(n.indices.begin(), n.indices.end());
      std::vector<float> bits(idx.size());
      std::memcpy(bits.data(), idx.data(), idx.size() * sizeof(int32_t));
      ASSIGN_OR_RETURN(float* buf, Alloc(static_cast<int64_t>(bits.size())));
      RETURN_IF_ERROR(device_->CopyToDevice(bits.data(), buf, static_cast<int64_t>(bits.size())));
      s.gather_indices = reinterpret_cast<const int32_t*>(buf);
      return absl::OkStatus();
    }
    case Op::kMatMul: {
      const std::vector<int64_t> ad = x->FullDims(batch_);
      const std::vector<int64_t> bd = graph_.tensors[n.inputs[1]].FullDims(batch_);
      const size_t r = ad.size();
      kernels::MatMulParams p;
      p.batch = Product(ad, 0, r - 2);
      p.trans_a = n.trans_a;
      p.trans_b = n.trans_b;
      p.m = ad[n.trans_a ? r - 1 : r - 2];
      p.k = ad[n.trans_a ? r - 2 : r - 1];
      p.n = bd[n.trans_b ? r - 2 : r - 1];
      ASSIGN_OR_RETURN(s.matmul, device_->MakeMatMul(p));
      return absl::OkStatus();
    }
    case Op::kSoftmax: {
      kernels::SoftmaxParams p;
      p.outer = Product(yd, 0, n.axis);
      p.n = yd[n.axis];
      p.inner = Product(yd, n.axis + 1, yd.size());
      p.log = n.log_softmax;
      ASSIGN_OR_RETURN(s.softmax, device_->MakeSoftmax(p));
      return absl::OkStatus();
    }
    case Op::kLayerNorm: {
      kernels::LayerNormParams p;
      p.cols = Product(yd, n.axis, yd.size());
      p.rows = act_n_[n.output] / p.cols;
      p.epsilon = n.epsilon;
      p.has_bias = n.variables.size() == 2;
      ASSIGN_OR_RETURN(s.layer_norm, device_->MakeLayerNorm(p));
      ASSIGN_OR_RETURN(s.ln_mean, Alloc(p.rows));
      ASSIGN_OR_RETURN(s.ln_var, Alloc(p.rows));
      return absl::OkStatus();
    }
    case Op::kReduce: {
      const std::vector<int64_t> xd = x->FullDims(batch_);
      const auto [lo, hi] = std::minmax_element(n.axes.begin(), n.axes.end());
      if (*hi - *lo + 1 != static_cast<int>(n.axes.size())) {
        return absl::InvalidArgumentError("a reduction over axes that are not adjacent");
      }
      kernels::ReduceParams p;
      p.kind = n.reduce;
      p.outer = Product(xd, 0, *lo);
      p.reduce = Product(xd, *lo, *hi + 1);
      p.inner = Product(xd, *hi + 1, xd.size());
      ASSIGN_OR_RETURN(s.reduce, device_->MakeReduce(p));
      return absl::OkStatus();
    }
    case Op::kExpand: {
      TensorShape zero;  // a scalar without a batch axis: x + 0 broadcast over y
      zero.batch_axis = TensorShape::kNoBatch;
      ASSIGN_OR_RETURN(const kernels::BroadcastParams p, BroadcastOver(y, batch_, *x, zero, kernels::BinaryOp::kAdd));
      ASSIGN_OR_RETURN(s.binary, device_->MakeBinary(p));
      ASSIGN_OR_RETURN(float* z, Alloc(1));
      RETURN_IF_ERROR(device_->Fill(0.0f, z, 1));
      s.zero = z;
      return absl::OkStatus();
    }
    case Op::kVariable:
      return absl::OkStatus();  // a view of the parameters (Build)
    default:
      return absl::InternalError(absl::StrCat("BuildTensorOp: ", OpName(n.op), " is not a tensor op"));
  }
}

absl::Status GraphNetwork::ForwardTensorOp(Step& s) {
  const Node& n = *s.node;
  const float* x = n.inputs.empty() ? nullptr : act_[n.inputs[0]];
  float* y = act_[n.output];
  switch (n.op) {
    case Op::kTranspose:
      if (s.view) return absl::OkStatus();
      return device_->StridedCopy(s.copy, x, y, false);
    case Op::kSlice:
      return device_->StridedCopy(s.copy, x + s.src_offset, y, false);
    case Op::kGather:
      if (s.gather_indices == nullptr) return device_->StridedCopy(s.copy, x + s.src_offset, y, false);
      for (int64_t o = 0; o < s.gather_outer; ++o) {
        RETURN_IF_ERROR(device_->Gather(s.gather, x + o * s.gather_x_block, s.gather_indices, nullptr,
                                        y + o * s.gather_y_block));
      }
      return absl::OkStatus();
    case Op::kMatMul:
      return s.matmul->Forward(x, act_[n.inputs[1]], y);
    case Op::kSoftmax:
      return s.softmax->Forward(x, y);
    case Op::kLayerNorm:
      return s.layer_norm->Forward(x, s.w[0], s.w.size() > 1 ? s.w[1] : nullptr, y, s.ln_mean, s.ln_var);
    case Op::kReduce:
      return s.reduce->Forward(x, y);
    case Op::kExpand:
      return s.binary->Forward(x, s.zero, y);
    case Op::kVariable:
      return absl::OkStatus();
    default:
      return absl::InternalError(absl::StrCat("ForwardTensorOp: ", OpName(n.op), " is not a tensor op"));
  }
}

absl::Status GraphNetwork::BackwardTensorOp(Step& s, float* dy) {
  const Node& n = *s.node;
  const float* x = n.inputs.empty() ? nullptr : act_[n.inputs[0]];
  const float* y = act_[n.output];
  switch (n.op) {
    case Op::kVariable:
      // The gradient slot is overwritten (a constant's never is: it has no gradient flowing).
      if (!s.has_trainable) return absl::OkStatus();
      return device_->CopyOnDevice(dy, s.dw[0], graph_.variables[n.variables[0]].size());
    case Op::kLayerNorm: {
      const bool needed = s.in_grad[0].needed;
      float* dx = needed ? GradTarget(s, 0) : scratch_;  // the plan sized the scratch for an unused dx
      RETURN_IF_ERROR(s.layer_norm->Backward(x, dy, s.w[0], s.ln_mean, s.ln_var, dx, s.dw[0],
                                             s.dw.size() > 1 ? s.dw[1] : nullptr));
      return needed ? FinishGrad(s, 0) : absl::OkStatus();
    }
    case Op::kMatMul:
      if (s.in_grad[0].needed) {
        RETURN_IF_ERROR(s.matmul->BackwardA(dy, act_[n.inputs[1]], GradTarget(s, 0)));
        RETURN_IF_ERROR(FinishGrad(s, 0));
      }
      if (s.in_grad[1].needed) {
        RETURN_IF_ERROR(s.matmul->BackwardB(x, dy, GradTarget(s, 1)));
        RETURN_IF_ERROR(FinishGrad(s, 1));
      }
      return absl::OkStatus();
    default:
      break;
  }
  if (!s.in_grad[0].needed) return absl::OkStatus();
  const Step::InGrad& g = s.in_grad[0];
  const int64_t in_n = act_n_[n.inputs[0]];
  switch (n.op) {
    case Op::kTranspose:
      if (s.view) {
        if (g.alias) return absl::OkStatus();
        if (dy == g.dst) return g.accumulate ? device_->Scale(2.0f, dy, dy, in_n) : absl::OkStatus();
        return g.accumulate ? device_->Axpy(1.0f, dy, g.dst, in_n) : device_->CopyOnDevice(dy, g.dst, in_n);
      }
      return device_->StridedCopy(Reversed(s.copy), dy, g.dst, g.accumulate);
    case Op::kSlice:
    case Op::kGather:
      // Scattered back into x's shape: zeros where nothing was read (unless adding to other gradients).
      if (!g.accumulate) RETURN_IF_ERROR(device_->Fill(0.0f, g.dst, in_n));
      if (s.gather_indices == nullptr) return device_->StridedCopy(Reversed(s.copy), dy, g.dst + s.src_offset, true);
      for (int64_t o = 0; o < s.gather_outer; ++o) {
        RETURN_IF_ERROR(device_->GatherBackward(s.gather, dy + o * s.gather_y_block, s.gather_indices, nullptr,
                                                g.dst + o * s.gather_x_block));
      }
      return absl::OkStatus();
    case Op::kSoftmax:
      RETURN_IF_ERROR(s.softmax->Backward(y, dy, GradTarget(s, 0)));
      return FinishGrad(s, 0);
    case Op::kReduce:
      RETURN_IF_ERROR(s.reduce->Backward(dy, GradTarget(s, 0)));
      return FinishGrad(s, 0);
    case Op::kExpand:
      RETURN_IF_ERROR(s.binary->Backward(x, s.zero, dy, GradTarget(s, 0), nullptr));
      return FinishGrad(s, 0);
    default:
      return absl::InternalError(absl::StrCat("BackwardTensorOp: ", OpName(n.op), " is not a tensor op"));
  }
}

}  // namespace dtrain::models
