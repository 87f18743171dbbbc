// The mapper's image ops (onnx_mapper_internal.h): Conv, pooling, BatchNormalization, Dropout, LRN and the Pad
// merged into what reads it.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <set>
#include <tuple>
#include <string>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/models/onnx/onnx_attributes.h"
#include "worker/models/onnx/onnx_mapper_internal.h"

namespace dtrain::models::onnx {

using ::onnx::NodeProto;

absl::Status Mapper::MapConv(int i) {
  const NodeProto& n = node(i);
  ASSIGN_OR_RETURN(const ImageInput x, ImageInputOf(i));
  ASSIGN_OR_RETURN(VarSpec w, Param(i, 1, "weight"));
  if (w.shape.size() != 4) {
    return Refuse(i, absl::StrCat("its weight '", w.name, "' has shape ", ShapeText(w.shape),
                                  " (supported: 2-D convolutions, a 4-D weight [out, in / group, kH, kW])"));
  }
  const std::vector<int64_t> kernel = {w.shape[2], w.shape[3]};
  const std::vector<int64_t> ks = AttrInts(n, "kernel_shape");
  if (!ks.empty() && ks != kernel) {
    return Refuse(i, absl::StrCat("attribute kernel_shape=[", absl::StrJoin(ks, ","), "] does not match its weight ",
                                  ShapeText(w.shape)));
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> strides, Pair(i, "strides", 1));
  ASSIGN_OR_RETURN(std::vector<int64_t> dilations, Pair(i, "dilations", 1));
  const TensorShape& in = b_->shape(x.tensor);
  if (!in.is_image()) {
    return Refuse(i, absl::StrCat("its input has shape ", ShapeText(in.dims), " per example (supported: C x H x W images)"));
  }
  Node c = Make(i, Op::kConv);
  kernels::Conv2DParams& p = c.conv;
  p.k_h = static_cast<int>(kernel[0]);
  p.k_w = static_cast<int>(kernel[1]);
  p.out_c = static_cast<int>(w.shape[0]);
  p.stride_h = static_cast<int>(strides[0]);
  p.stride_w = static_cast<int>(strides[1]);
  p.dilation_h = static_cast<int>(dilations[0]);
  p.dilation_w = static_cast<int>(dilations[1]);
  p.groups = static_cast<int>(AttrInt(n, "group", 1));
  p.weight_layout = kernels::WeightLayout::kOIHW;
  p.explicit_padding = true;
  int64_t top, left, bottom, right;
  RETURN_IF_ERROR(SpatialPads(i, in.dims[1] + x.pad_top + x.pad_bottom, in.dims[2] + x.pad_left + x.pad_right, kernel,
                              strides, dilations, &top, &left, &bottom, &right));
  p.pad_top = static_cast<int>(top + x.pad_top);
  p.pad_left = static_cast<int>(left + x.pad_left);
  p.pad_bottom = static_cast<int>(bottom + x.pad_bottom);
  p.pad_right = static_cast<int>(right + x.pad_right);
  std::vector<VarSpec> vars = {std::move(w)};
  if (!InputName(n, 2).empty()) {
    ASSIGN_OR_RETURN(VarSpec bias, Param(i, 2, "bias"));
    vars.push_back(std::move(bias));
  }
  return Emit(i, std::move(c), {x.tensor}, std::move(vars));
}

absl::Status Mapper::MapPool(int i) {
  const NodeProto& n = node(i);
  const bool max = n.op_type() == "MaxPool";
  ASSIGN_OR_RETURN(const ImageInput x, ImageInputOf(i));
  const std::vector<int64_t> kernel = AttrInts(n, "kernel_shape");
  if (kernel.size() != 2) {
    return Refuse(i, absl::StrCat("attribute kernel_shape=[", absl::StrJoin(kernel, ","),
                                  "] is not supported (supported: 2-D pooling, two values)"));
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> strides, Pair(i, "strides", 1));
  ASSIGN_OR_RETURN(std::vector<int64_t> dilations, Pair(i, "dilations", 1));
  if (dilations[0] != 1 || dilations[1] != 1) {
    return Refuse(i, absl::StrCat("attribute dilations=[", absl::StrJoin(dilations, ","),
                                  "] is not supported (supported: 1, 1)"));
  }
  const TensorShape& in = b_->shape(x.tensor);
  if (!in.is_image()) {
    return Refuse(i, absl::StrCat("its input has shape ", ShapeText(in.dims), " per example (supported: C x H x W images)"));
  }
  Node p = Make(i, max ? Op::kMaxPool : Op::kAvgPool);
  kernels::PoolParams& pp = p.pool;
  pp.window = pp.window_h = static_cast<int>(kernel[0]);
  pp.window_w = static_cast<int>(kernel[1]);
  pp.stride = pp.stride_h = static_cast<int>(strides[0]);
  pp.stride_w = static_cast<int>(strides[1]);
  pp.explicit_padding = true;
  pp.ceil_mode = AttrInt(n, "ceil_mode", 0) != 0;
  pp.count_include_pad = !max && AttrInt(n, "count_include_pad", 0) != 0;
  int64_t top, left, bottom, right;
  RETURN_IF_ERROR(SpatialPads(i, in.dims[1] + x.pad_top + x.pad_bottom, in.dims[2] + x.pad_left + x.pad_right, kernel,
                              strides, {1, 1}, &top, &left, &bottom, &right));
  if (x.padded) {
    // The Pad's zeros are part of the input: they count in every window's divisor.
    if (!pp.count_include_pad && (top || left || bottom || right)) {
      return Refuse(i, "a Pad before an AveragePool with its own pads and count_include_pad=0 is not supported "
                       "(supported: a Pad before an AveragePool without pads, or with count_include_pad=1)");
    }
    pp.count_include_pad = true;
  }
  pp.pad_top = static_cast<int>(top + x.pad_top);
  pp.pad_left = static_cast<int>(left + x.pad_left);
  pp.pad_bottom = static_cast<int>(bottom + x.pad_bottom);
  pp.pad_right = static_cast<int>(right + x.pad_right);
  if (max) Unavailable(i, 1, "MaxPool's Indices, which dtrain does not compute");
  return Emit(i, std::move(p), {x.tensor}, {});
}

absl::Status Mapper::MapGlobalPool(int i) {
  const bool max = node(i).op_type() == "GlobalMaxPool";
  ASSIGN_OR_RETURN(int x, ImageTensor(i, 0));
  const TensorShape& in = b_->shape(x);
  if (!in.is_image()) {
    return Refuse(i, absl::StrCat("its input has shape ", ShapeText(in.dims), " per example (supported: C x H x W images)"));
  }
  Node p = Make(i, max ? Op::kMaxPool : Op::kAvgPool);
  p.pool.window = p.pool.window_h = static_cast<int>(in.dims[1]);
  p.pool.window_w = static_cast<int>(in.dims[2]);
  p.pool.stride = p.pool.stride_h = p.pool.stride_w = 1;
  p.pool.explicit_padding = true;
  return Emit(i, std::move(p), {x}, {});
}

absl::Status Mapper::MapBatchNorm(int i) {
  const NodeProto& n = node(i);
  ASSIGN_OR_RETURN(int x, Tensor(i, 0));
  if (b_->shape(x).dims.size() == 3) {
    ASSIGN_OR_RETURN(x, ImageTensor(i, 0));
  }
  std::vector<VarSpec> vars;
  const char* roles[] = {"scale", "bias", "running mean", "running variance"};
  for (int k = 1; k <= 4; ++k) {
    ASSIGN_OR_RETURN(VarSpec v, Param(i, k, roles[k - 1], /*state=*/k >= 3));
    vars.push_back(std::move(v));
  }
  Node bn = Make(i, Op::kBatchNorm);
  bn.epsilon = AttrFloat(n, "epsilon", 1e-5f);
  // ONNX's momentum weighs the running statistics, PyTorch's (ours) the batch's.
  bn.momentum = static_cast<float>(1.0 - static_cast<double>(AttrFloat(n, "momentum", 0.9f)));
  bn.unbiased_running_var = o_.bn_unbiased_running_var;
  Unavailable(i, 1, "one of BatchNormalization's running statistics, which are variables of the model in dtrain, "
                    "not tensors");
  return Emit(i, std::move(bn), {x}, std::move(vars));
}

absl::Status Mapper::MapDropout(int i) {
  const NodeProto& n = node(i);
  ASSIGN_OR_RETURN(int x, Tensor(i, 0));
  float ratio = 0.5f;
  if (f_.opset >= 12) {
    ASSIGN_OR_RETURN(const Const* r, ConstIn(i, 1));
    if (r != nullptr) {
      if (r->size() != 1) return Refuse(i, "its ratio must be one value");
      ratio = static_cast<float>(r->at(0));
    }
    ASSIGN_OR_RETURN(const Const* training, ConstIn(i, 2));  // constant or omitted; dtrain trains with dropout
    (void)training;
  } else {
    ratio = AttrFloat(n, "ratio", 0.5f);
  }
  if (!(ratio >= 0.0f && ratio < 1.0f)) {
    return Refuse(i, absl::StrCat("ratio ", ratio, " is not supported (supported: 0 <= ratio < 1)"));
  }
  Unavailable(i, 1, "Dropout's mask, which dtrain does not expose");
  ASSIGN_OR_RETURN(const Value* xv, Get(i, 0));
  return Emit(i, Node::Dropout(NodeName(n, i), 1.0f - ratio), {x}, {}, "", xv->span);
}

absl::Status Mapper::MapLrn(int i) {
  const NodeProto& n = node(i);
  ASSIGN_OR_RETURN(int x, ImageTensor(i, 0));
  const int64_t size = AttrInt(n, "size", 0);
  if (size < 1 || size % 2 == 0) {
    return Refuse(i, absl::StrCat("attribute size=", size, " is not supported (supported: odd sizes, a window "
                                                           "centred on each channel)"));
  }
  // ONNX divides alpha by the window's size; TensorFlow's LRN (ours) does not.
  const float alpha = AttrFloat(n, "alpha", 1e-4f) / static_cast<float>(size);
  return Emit(i, Node::Lrn(NodeName(n, i), static_cast<int>((size - 1) / 2), AttrFloat(n, "bias", 1.0f), alpha,
                           AttrFloat(n, "beta", 0.75f)),
              {x}, {});
}

absl::Status Mapper::MapPad(int i) {
  const NodeProto& n = node(i);
  {
    // Pads of zero (any mode, any tensor) change nothing: Swin's F.pad to a multiple of its window when the
    // image already is one.
    ASSIGN_OR_RETURN(const Const* pads, ConstIn(i, 1));
    bool none = pads != nullptr && pads->size() > 0;
    for (int64_t k = 0; none && k < pads->size(); ++k) none = pads->at(k) == 0.0;
    if (none) {
      ASSIGN_OR_RETURN(int t, Tensor(i, 0));
      ASSIGN_OR_RETURN(const Value* v, Get(i, 0));
      return Alias(i, t, v->span);
    }
  }
  ASSIGN_OR_RETURN(int x, ImageTensor(i, 0));
  const std::string mode = AttrString(n, "mode", "constant");
  if (mode != "constant") {
    return Refuse(i, absl::StrCat("attribute mode=", mode, " is not supported (supported: constant zeros)"));
  }
  ASSIGN_OR_RETURN(const Const* pads, ConstIn(i, 1));
  ASSIGN_OR_RETURN(const Const* value, ConstIn(i, 2));
  if (value != nullptr && (value->size() != 1 || value->at(0) != 0.0)) {
    return Refuse(i, "its constant_value is not 0 (supported: zero padding)");
  }
  const TensorShape& in = b_->shape(x);
  if (pads == nullptr || !in.is_image() || pads->size() != 8) {
    return Refuse(i, "its pads are not 8 constants of a C x H x W image (supported: zero padding of H and W)");
  }
  const std::vector<int64_t> p = {static_cast<int64_t>(pads->at(0)), static_cast<int64_t>(pads->at(1)),
                                  static_cast<int64_t>(pads->at(2)), static_cast<int64_t>(pads->at(3)),
                                  static_cast<int64_t>(pads->at(4)), static_cast<int64_t>(pads->at(5)),
                                  static_cast<int64_t>(pads->at(6)), static_cast<int64_t>(pads->at(7))};
  if (p[0] || p[1] || p[4] || p[5] || p[2] < 0 || p[3] < 0 || p[6] < 0 || p[7] < 0) {
    return Refuse(i, absl::StrCat("pads [", absl::StrJoin(p, ","),
                                  "] are not supported (supported: non-negative pads of H and W only)"));
  }
  const std::string& out = n.output(0);
  const int reader = IsGraphOutput(out) ? -1 : SoleReader(out);
  const bool fits = reader >= 0 && (node(reader).op_type() == "Conv" || node(reader).op_type() == "AveragePool") &&
                    node(reader).input(0) == out;
  if (!fits) {
    return Refuse(i, "its output is not read by exactly one Conv or AveragePool (supported: a Pad merged into the "
                     "Conv or AveragePool after it, as PyTorch exports AvgPool2d(padding=p))");
  }
  Value v;
  v.tensor = x;
  v.padded = true;
  v.pad_top = p[2];
  v.pad_left = p[3];
  v.pad_bottom = p[6];
  v.pad_right = p[7];
  values_[out] = v;
  return absl::OkStatus();
}

}  // namespace dtrain::models::onnx
