#include "worker/models/onnx/onnx_constants.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/models/onnx/onnx_attributes.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "ONNX raw_data is little-endian; so must the host be");

namespace dtrain::models::onnx {
namespace {

using ::onnx::TensorProto;

absl::Status Error(const std::string& what) { return absl::InvalidArgumentError(what); }

int64_t Product(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

ConstRef MakeInts(std::vector<int64_t> dims, std::vector<int64_t> ints, std::vector<int64_t> batch = {}) {
  auto c = std::make_shared<Const>();
  c->type = Const::Type::kInt;
  c->data_type = TensorProto::INT64;
  c->dims = std::move(dims);
  c->ints = std::move(ints);
  if (std::find_if(batch.begin(), batch.end(), [](int64_t f) { return f != 0; }) != batch.end()) {
    c->batch = std::move(batch);
  }
  return c;
}

ConstRef MakeFloats(std::vector<int64_t> dims, std::vector<float> values) {
  auto c = std::make_shared<Const>();
  c->type = Const::Type::kFloat;
  c->data_type = TensorProto::FLOAT;
  c->dims = std::move(dims);
  c->floats = std::make_shared<const std::vector<float>>(std::move(values));
  return c;
}

// A copy of `c` with new dims (same elements), no longer an initializer but a view of the one `c` is or views.
ConstRef WithDims(const Const& c, std::vector<int64_t> dims) {
  auto out = std::make_shared<Const>(c);
  out->dims = std::move(dims);
  out->view_of = c.type == Const::Type::kFloat ? c.param() : "";
  out->initializer.clear();
  out->transpose_of.clear();
  return out;
}

// Reads `n` elements of type T from raw little-endian bytes.
template <typename T>
absl::Status ReadRaw(const std::string& raw, int64_t n, const std::string& what, std::vector<T>* out) {
  if (static_cast<int64_t>(raw.size()) != n * static_cast<int64_t>(sizeof(T))) {
    return Error(absl::StrCat(what, ": raw_data holds ", raw.size(), " bytes, its dims need ", n * sizeof(T)));
  }
  out->resize(n);
  if (n > 0) std::memcpy(out->data(), raw.data(), raw.size());
  return absl::OkStatus();
}

absl::Status CountMismatch(const std::string& what, int64_t have, int64_t want) {
  return Error(absl::StrCat(what, " holds ", have, " values, its dims need ", want));
}

// Normalizes an axis against `rank` (negative counts from the end).
absl::StatusOr<int64_t> Axis(int64_t axis, int64_t rank, const char* what) {
  if (axis < -rank || axis >= rank) return Error(absl::StrCat(what, " ", axis, " is outside rank ", rank));
  return axis < 0 ? axis + rank : axis;
}

// Ints of an optional constant input or, before `input_opset`, of an attribute.
std::vector<int64_t> IntsOf(const Const* c) {
  std::vector<int64_t> v;
  if (c == nullptr) return v;
  for (int64_t i = 0; i < c->size(); ++i) v.push_back(static_cast<int64_t>(c->at(i)));
  return v;
}

absl::StatusOr<std::vector<ConstRef>> Single(absl::StatusOr<ConstRef> c) {
  if (!c.ok()) return c.status();
  return std::vector<ConstRef>{*std::move(c)};
}

absl::StatusOr<ConstRef> FoldConstantNode(const ::onnx::NodeProto& n) {
  for (const ::onnx::AttributeProto& a : n.attribute()) {
    if (a.name() == "value") return DecodeTensor(a.t(), "its value");
    if (a.name() == "value_float") return MakeFloats({}, {a.f()});
    if (a.name() == "value_floats") {
      return MakeFloats({a.floats_size()}, std::vector<float>(a.floats().begin(), a.floats().end()));
    }
    if (a.name() == "value_int") return MakeInts({}, {a.i()});
    if (a.name() == "value_ints") {
      return MakeInts({a.ints_size()}, std::vector<int64_t>(a.ints().begin(), a.ints().end()));
    }
    return Error(absl::StrCat("attribute ", a.name(), " is not supported (supported: value, value_float(s), "
                              "value_int(s))"));
  }
  return Error("no value");
}

absl::StatusOr<ConstRef> Gather(const ::onnx::NodeProto& n, const Const& data, const Const& indices) {
  if (data.dims.size() != 1) return Error("only 1-D data is folded");
  if (indices.type != Const::Type::kInt) return Error("indices must be integers");
  ASSIGN_OR_RETURN(int64_t axis, Axis(AttrInt(n, "axis", 0), 1, "axis"));
  (void)axis;
  const int64_t len = data.dims[0];
  std::vector<int64_t> ints;
  std::vector<float> floats;
  std::vector<int64_t> batch;
  for (int64_t k = 0; k < indices.size(); ++k) {
    int64_t i = indices.ints[k];
    if (i < 0) i += len;
    if (i < 0 || i >= len) return Error(absl::StrCat("index ", indices.ints[k], " is outside [0, ", len, ")"));
    if (data.type == Const::Type::kInt) {
      ints.push_back(data.ints[i]);
      batch.push_back(data.batch_factor(i));
    } else {
      floats.push_back((*data.floats)[i]);
    }
  }
  if (data.type == Const::Type::kInt) return MakeInts(indices.dims, std::move(ints), std::move(batch));
  return MakeFloats(indices.dims, std::move(floats));
}

absl::StatusOr<ConstRef> Unsqueeze(const Const& data, std::vector<int64_t> axes) {
  const int64_t rank = static_cast<int64_t>(data.dims.size() + axes.size());
  std::set<int64_t> at;
  for (int64_t a : axes) {
    ASSIGN_OR_RETURN(int64_t k, Axis(a, rank, "axis"));
    if (!at.insert(k).second) return Error(absl::StrCat("axis ", a, " is repeated"));
  }
  std::vector<int64_t> dims;
  size_t next = 0;
  for (int64_t k = 0; k < rank; ++k) dims.push_back(at.count(k) ? 1 : data.dims[next++]);
  return WithDims(data, std::move(dims));
}

absl::StatusOr<ConstRef> Squeeze(const Const& data, const std::vector<int64_t>& axes) {
  const int64_t rank = static_cast<int64_t>(data.dims.size());
  std::set<int64_t> at;
  for (int64_t a : axes) {
    ASSIGN_OR_RETURN(int64_t k, Axis(a, rank, "axis"));
    if (data.dims[k] != 1) return Error(absl::StrCat("axis ", a, " has size ", data.dims[k], ", not 1"));
    at.insert(k);
  }
  std::vector<int64_t> dims;
  for (int64_t k = 0; k < rank; ++k) {
    if (axes.empty() ? data.dims[k] != 1 : at.count(k) == 0) dims.push_back(data.dims[k]);
  }
  return WithDims(data, std::move(dims));
}

absl::StatusOr<ConstRef> Concat(const ::onnx::NodeProto& n, const std::vector<const Const*>& in) {
  if (in.empty()) return Error("no inputs");
  const int64_t rank = static_cast<int64_t>(in[0]->dims.size());
  if (rank == 0) return Error("scalars cannot be concatenated");
  ASSIGN_OR_RETURN(int64_t axis, Axis(AttrInt(n, "axis", 0), rank, "axis"));
  std::vector<int64_t> dims = in[0]->dims;
  dims[axis] = 0;
  for (const Const* c : in) {
    if (c == nullptr) return Error("an omitted input");
    if (c->type != in[0]->type) return Error("inputs of different types");
    bool fits = static_cast<int64_t>(c->dims.size()) == rank;
    for (int64_t k = 0; fits && k < rank; ++k) fits = k == axis || c->dims[k] == in[0]->dims[k];
    if (!fits) return Error("input shapes do not fit");
    dims[axis] += c->dims[axis];
  }
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < axis; ++k) outer *= dims[k];
  for (int64_t k = axis + 1; k < rank; ++k) inner *= dims[k];
  std::vector<int64_t> ints;
  std::vector<float> floats;
  std::vector<int64_t> batch;
  for (int64_t o = 0; o < outer; ++o) {
    for (const Const* c : in) {
      const int64_t block = c->dims[axis] * inner;
      for (int64_t j = o * block; j < (o + 1) * block; ++j) {
        if (c->type == Const::Type::kInt) {
          ints.push_back(c->ints[j]);
          batch.push_back(c->batch_factor(j));
        } else {
          floats.push_back((*c->floats)[j]);
        }
      }
    }
  }
  if (in[0]->type == Const::Type::kInt) return MakeInts(dims, std::move(ints), std::move(batch));
  return MakeFloats(dims, std::move(floats));
}

absl::StatusOr<ConstRef> Slice(const Const& data, const std::vector<int64_t>& starts, const std::vector<int64_t>& ends,
                               const std::vector<int64_t>& axes, const std::vector<int64_t>& steps) {
  const int64_t rank = static_cast<int64_t>(data.dims.size());
  if (rank == 0) return Error("Slice of a scalar");
  if (starts.size() != ends.size() || (!axes.empty() && axes.size() != starts.size()) ||
      (!steps.empty() && steps.size() != starts.size())) {
    return Error("Slice's starts, ends, axes and steps differ in length");
  }
  // Per axis: first index, step and count (every axis whole unless sliced).
  std::vector<int64_t> first(rank, 0), stride(rank, 1), count = data.dims;
  std::vector<bool> seen(rank, false);
  for (size_t j = 0; j < starts.size(); ++j) {
    int64_t axis = axes.empty() ? static_cast<int64_t>(j) : axes[j];
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank || seen[axis]) return Error(absl::StrCat("Slice axis ", axis, " of rank ", rank));
    seen[axis] = true;
    const int64_t len = data.dims[axis];
    const int64_t step = steps.empty() ? 1 : steps[j];
    if (step == 0) return Error("step 0");
    auto clamp = [&](int64_t v) {
      if (v < 0) v += len;
      return step > 0 ? std::clamp<int64_t>(v, 0, len) : std::clamp<int64_t>(v, -1, len - 1);
    };
    const int64_t b = clamp(starts[j]), e = clamp(ends[j]);
    first[axis] = b;
    stride[axis] = step;
    count[axis] = step > 0 ? std::max<int64_t>(0, (e - b + step - 1) / step)
                           : std::max<int64_t>(0, (b - e + (-step) - 1) / (-step));
  }
  const int64_t n = Product(count);
  std::vector<int64_t> ints, batch;
  std::vector<float> floats;
  std::vector<int64_t> pos(rank, 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t src = 0;
    for (int64_t a = 0; a < rank; ++a) src = src * data.dims[a] + first[a] + pos[a] * stride[a];
    if (data.type == Const::Type::kInt) {
      ints.push_back(data.ints[src]);
      batch.push_back(data.batch_factor(src));
    } else {
      floats.push_back((*data.floats)[src]);
    }
    for (int64_t a = rank - 1; a >= 0; --a) {
      if (++pos[a] < count[a]) break;
      pos[a] = 0;
    }
  }
  if (data.type == Const::Type::kInt) return MakeInts(count, std::move(ints), std::move(batch));
  return MakeFloats(count, std::move(floats));
}

absl::StatusOr<ConstRef> Cast(const ::onnx::NodeProto& n, const Const& data) {
  const int64_t to = AttrInt(n, "to", 0);
  switch (to) {
    case TensorProto::FLOAT:
    case TensorProto::DOUBLE: {
      if (data.any_batch()) return Error("casting the batch size to a float is not supported");
      std::vector<float> v(data.size());
      for (int64_t i = 0; i < data.size(); ++i) v[i] = static_cast<float>(data.at(i));
      return MakeFloats(data.dims, std::move(v));
    }
    case TensorProto::INT64:
    case TensorProto::INT32:
    case TensorProto::INT16:
    case TensorProto::INT8:
    case TensorProto::UINT8:
    case TensorProto::BOOL: {
      std::vector<int64_t> v(data.size());
      std::vector<int64_t> batch(data.size());
      for (int64_t i = 0; i < data.size(); ++i) {
        const double x = data.at(i);
        v[i] = to == TensorProto::BOOL ? (x != 0) : static_cast<int64_t>(std::trunc(x));
        batch[i] = to == TensorProto::BOOL ? 0 : data.batch_factor(i);
      }
      return MakeInts(data.dims, std::move(v), std::move(batch));
    }
    default:
      return Error(absl::StrCat("attribute to=", DataTypeName(static_cast<int>(to)),
                                " is not supported (supported: FLOAT, DOUBLE and the integer types)"));
  }
}

// numpy broadcasting of constants' dims.
absl::StatusOr<std::vector<int64_t>> BroadcastDims(const std::vector<const Const*>& in) {
  size_t rank = 0;
  for (const Const* c : in) rank = std::max(rank, c->dims.size());
  std::vector<int64_t> out(rank, 1);
  for (const Const* c : in) {
    const size_t shift = rank - c->dims.size();
    for (size_t k = 0; k < c->dims.size(); ++k) {
      const int64_t d = c->dims[k];
      if (d != out[shift + k] && d != 1 && out[shift + k] != 1) {
        return Error(absl::StrCat("operand shapes do not broadcast (", absl::StrJoin(c->dims, "x"), " against ",
                                  absl::StrJoin(out, "x"), ")"));
      }
      if (d != 1) out[shift + k] = d;
    }
  }
  if (Product(out) > (int64_t{1} << 28)) return Error("too large");
  return out;
}

// The flat index into a constant of `dims` broadcast to `out` of the output's flat index `i`.
int64_t SourceIndex(const std::vector<int64_t>& out, int64_t i, const std::vector<int64_t>& dims) {
  int64_t src = 0, stride = 1;
  const size_t shift = out.size() - dims.size();
  for (size_t k = out.size(); k-- > 0;) {
    const int64_t idx = i % out[k];
    i /= out[k];
    if (k >= shift) {
      const int64_t d = dims[k - shift];
      if (d != 1) src += idx * stride;
      stride *= d;
    }
  }
  return src;
}

std::string FactorText(int64_t factor, int64_t value) {
  if (factor == 0) return absl::StrCat(value);
  return factor == 1 ? "the batch size" : absl::StrCat(factor, " times the batch size");
}

bool IsComparison(const std::string& op) {
  return op == "Equal" || op == "Less" || op == "Greater" || op == "LessOrEqual" || op == "GreaterOrEqual" ||
         op == "And" || op == "Or";
}

absl::StatusOr<ConstRef> Arithmetic(const std::string& op, const Const& a, const Const& b) {
  ASSIGN_OR_RETURN(const std::vector<int64_t> dims, BroadcastDims({&a, &b}));
  const int64_t n = Product(dims);
  auto ai = [&](int64_t i) { return SourceIndex(dims, i, a.dims); };
  auto bi = [&](int64_t i) { return SourceIndex(dims, i, b.dims); };
  if (IsComparison(op)) {
    std::vector<int64_t> v(n);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t fx = a.batch_factor(ai(i)), fy = b.batch_factor(bi(i));
      const double x = a.at(ai(i)), y = b.at(bi(i));
      if (fx != 0 || fy != 0) {
        // The batch size is at least 1: it equals no number below 1 (ViT's Where(shape == -1, 1, shape)).
        const double other = fx != 0 ? y : x;
        if (op != "Equal" || (fx != 0 && fy != 0) || other >= 1) {
          return Error(absl::StrCat(op, " of ", FactorText(fx, static_cast<int64_t>(x)), " and ",
                                    FactorText(fy, static_cast<int64_t>(y)), " depends on the batch size"));
        }
        v[i] = 0;
        continue;
      }
      v[i] = op == "Equal"            ? x == y
             : op == "Less"           ? x < y
             : op == "Greater"        ? x > y
             : op == "LessOrEqual"    ? x <= y
             : op == "GreaterOrEqual" ? x >= y
             : op == "And"            ? (x != 0 && y != 0)
                                      : (x != 0 || y != 0);
    }
    auto c = std::const_pointer_cast<Const>(MakeInts(dims, std::move(v)));
    c->data_type = TensorProto::BOOL;
    return ConstRef(c);
  }
  if (a.type == Const::Type::kInt && b.type == Const::Type::kInt) {
    std::vector<int64_t> v(n);
    std::vector<int64_t> batch(n, 0);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t x = a.ints[ai(i)], y = b.ints[bi(i)];
      const int64_t fx = a.batch_factor(ai(i)), fy = b.batch_factor(bi(i));
      if ((op == "Div" || op == "Mod") && y == 0) return Error("division by zero");
      v[i] = op == "Add"   ? x + y
             : op == "Sub" ? x - y
             : op == "Mul" ? x * y
             : op == "Div" ? x / y
             : op == "Mod" ? ((x % y) + y) % y
                           : static_cast<int64_t>(std::pow(static_cast<double>(x), static_cast<double>(y)));
      if (fx == 0 && fy == 0) continue;
      // A multiple of the batch size stays one under scaling (k N * m, k N / m when m divides k) and x + 0.
      int64_t f = 0;
      if (fx != 0 && fy == 0) {
        if ((op == "Add" || op == "Sub") && y == 0) f = fx;
        if (op == "Mul" && y > 0) f = fx * y;
        if (op == "Div" && y > 0 && fx % y == 0) f = fx / y;
      } else if (fy != 0 && fx == 0) {
        if (op == "Add" && x == 0) f = fy;
        if (op == "Mul" && x > 0) f = fy * x;
      }
      if (f == 0) {
        return Error(absl::StrCat(op, " of ", FactorText(fx, x), " and ", FactorText(fy, y),
                                  " (supported on the batch size: scaling by a constant, adding 0)"));
      }
      batch[i] = f;
    }
    return MakeInts(dims, std::move(v), std::move(batch));
  }
  if (a.any_batch() || b.any_batch()) return Error("float arithmetic on the batch size is not supported");
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) {
    const float x = static_cast<float>(a.at(ai(i))), y = static_cast<float>(b.at(bi(i)));
    v[i] = op == "Add"   ? x + y
           : op == "Sub" ? x - y
           : op == "Mul" ? x * y
           : op == "Div" ? x / y
           : op == "Mod" ? std::fmod(x, y)
                         : std::pow(x, y);
  }
  return MakeFloats(dims, std::move(v));
}

absl::StatusOr<ConstRef> Unary(const std::string& op, const Const& a) {
  if (a.any_batch()) return Error(absl::StrCat(op, " of the batch size is not supported"));
  if (a.type == Const::Type::kInt && (op == "Neg" || op == "Not" || op == "Abs")) {
    std::vector<int64_t> v(a.size());
    for (int64_t i = 0; i < a.size(); ++i) {
      v[i] = op == "Neg" ? -a.ints[i] : op == "Not" ? a.ints[i] == 0 : std::abs(a.ints[i]);
    }
    auto c = std::const_pointer_cast<Const>(MakeInts(a.dims, std::move(v)));
    if (op == "Not") c->data_type = TensorProto::BOOL;
    return ConstRef(c);
  }
  std::vector<float> v(a.size());
  for (int64_t i = 0; i < a.size(); ++i) {
    const double x = a.at(i);
    double r = 0;
    if (op == "Neg") r = -x;
    else if (op == "Abs") r = std::fabs(x);
    else if (op == "Sqrt") r = std::sqrt(x);
    else if (op == "Reciprocal") r = 1.0 / x;
    else if (op == "Exp") r = std::exp(x);
    else if (op == "Log") r = std::log(x);
    else if (op == "Floor") r = std::floor(x);
    else if (op == "Ceil") r = std::ceil(x);
    else return Error(absl::StrCat(op, " of ", a.type == Const::Type::kInt ? "integers" : "floats", " is not folded"));
    v[i] = static_cast<float>(r);
  }
  return MakeFloats(a.dims, std::move(v));
}

absl::StatusOr<ConstRef> Where(const Const& cond, const Const& a, const Const& b) {
  ASSIGN_OR_RETURN(const std::vector<int64_t> dims, BroadcastDims({&cond, &a, &b}));
  if (a.type != b.type) return Error("Where of operands of different types");
  const int64_t n = Product(dims);
  std::vector<int64_t> ints, batch;
  std::vector<float> floats;
  for (int64_t i = 0; i < n; ++i) {
    const bool pick_a = cond.at(SourceIndex(dims, i, cond.dims)) != 0;
    const Const& src = pick_a ? a : b;
    const int64_t j = SourceIndex(dims, i, src.dims);
    if (src.type == Const::Type::kInt) {
      ints.push_back(src.ints[j]);
      batch.push_back(src.batch_factor(j));
    } else {
      floats.push_back((*src.floats)[j]);
    }
  }
  if (cond.any_batch()) return Error("Where with a condition of the batch size");
  if (a.type == Const::Type::kInt) return MakeInts(dims, std::move(ints), std::move(batch));
  return MakeFloats(dims, std::move(floats));
}

// ScatterND (reduction none) of constants: data with the slices at indices [..., k] replaced by updates (Swin's
// shifted-window attention mask, built by slice assignments into zeros).
absl::StatusOr<ConstRef> ScatterND(const ::onnx::NodeProto& n, const Const& data, const Const& indices,
                                   const Const& updates) {
  if (AttrString(n, "reduction", "none") != "none") {
    return Error(absl::StrCat("ScatterND with reduction '", AttrString(n, "reduction", "none"), "' of constants"));
  }
  if (indices.type != Const::Type::kInt || indices.dims.empty()) return Error("ScatterND indices are not integers");
  if (data.type != updates.type) return Error("ScatterND of data and updates of different types");
  if (data.any_batch() || indices.any_batch() || updates.any_batch()) return Error("ScatterND of the batch size");
  const int64_t rank = static_cast<int64_t>(data.dims.size());
  const int64_t k = indices.dims.back();
  if (k < 1 || k > rank) return Error(absl::StrCat("ScatterND index depth ", k, " for rank ", rank));
  int64_t slice = 1;
  for (int64_t a = k; a < rank; ++a) slice *= data.dims[a];
  const int64_t count = indices.size() / k;
  if (updates.size() != count * slice) {
    return Error(absl::StrCat("ScatterND updates of ", updates.size(), " values for ", count, " slices of ", slice));
  }
  std::vector<int64_t> ints = data.ints;
  std::vector<float> floats = data.type == Const::Type::kFloat ? *data.floats : std::vector<float>{};
  for (int64_t u = 0; u < count; ++u) {
    int64_t offset = 0;
    for (int64_t a = 0; a < k; ++a) {
      int64_t idx = indices.ints[u * k + a];
      if (idx < 0) idx += data.dims[a];
      if (idx < 0 || idx >= data.dims[a]) return Error(absl::StrCat("ScatterND index ", idx, " out of range"));
      offset = offset * data.dims[a] + idx;
    }
    offset *= slice;
    for (int64_t e = 0; e < slice; ++e) {
      if (data.type == Const::Type::kInt) {
        ints[offset + e] = updates.ints[u * slice + e];
      } else {
        floats[offset + e] = (*updates.floats)[u * slice + e];
      }
    }
  }
  if (data.type == Const::Type::kInt) return MakeInts(data.dims, std::move(ints));
  return MakeFloats(data.dims, std::move(floats));
}

// Element i of a constant broadcast to `dims` (Expand).
absl::StatusOr<ConstRef> Expand(const Const& data, const Const& shape) {
  if (shape.any_batch()) return Error("a constant cannot take the batch size as a dimension");
  Const target;
  target.dims = IntsOf(&shape);
  ASSIGN_OR_RETURN(const std::vector<int64_t> dims, BroadcastDims({&data, &target}));
  if (data.any_batch()) return Error("Expand of the batch size");
  const int64_t n = Product(dims);
  if (data.type == Const::Type::kInt) {
    std::vector<int64_t> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = data.ints[SourceIndex(dims, i, data.dims)];
    return MakeInts(dims, std::move(v));
  }
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = (*data.floats)[SourceIndex(dims, i, data.dims)];
  return MakeFloats(dims, std::move(v));
}

absl::StatusOr<ConstRef> TransposeConst(const ::onnx::NodeProto& n, const Const& data) {
  const int64_t rank = static_cast<int64_t>(data.dims.size());
  std::vector<int64_t> perm = AttrInts(n, "perm");
  if (perm.empty()) {
    for (int64_t k = rank - 1; k >= 0; --k) perm.push_back(k);
  }
  std::vector<int64_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t k = 0; k < rank; ++k) {
    if (static_cast<int64_t>(sorted.size()) != rank || sorted[k] != k) return Error("perm is not a permutation");
  }
  if (data.any_batch()) return Error("Transpose of the batch size");
  std::vector<int64_t> dims, in_stride(rank, 1);
  for (int64_t k = rank - 2; k >= 0; --k) in_stride[k] = in_stride[k + 1] * data.dims[k + 1];
  for (int64_t k : perm) dims.push_back(data.dims[k]);
  const int64_t count = data.size();
  std::vector<int64_t> ints;
  std::vector<float> floats;
  for (int64_t i = 0; i < count; ++i) {
    int64_t rest = i, src = 0;
    for (int64_t k = rank - 1; k >= 0; --k) {
      src += (rest % dims[k]) * in_stride[perm[k]];
      rest /= dims[k];
    }
    if (data.type == Const::Type::kInt) {
      ints.push_back(data.ints[src]);
    } else {
      floats.push_back((*data.floats)[src]);
    }
  }
  if (data.type == Const::Type::kInt) return MakeInts(dims, std::move(ints));
  auto c = std::const_pointer_cast<Const>(MakeFloats(dims, std::move(floats)));
  c->data_type = data.data_type;
  if (rank == 2 && perm == std::vector<int64_t>{1, 0}) c->transpose_of = data.param();
  return ConstRef(c);
}

absl::StatusOr<ConstRef> Range(const Const& start, const Const& limit, const Const& delta) {
  if (start.any_batch() || limit.any_batch() || delta.any_batch()) return Error("a Range of the batch size");
  const double s = start.at(0), l = limit.at(0), d = delta.at(0);
  if (d == 0) return Error("a Range with delta 0");
  const int64_t count = std::max<int64_t>(0, static_cast<int64_t>(std::ceil((l - s) / d)));
  if (count > (int64_t{1} << 28)) return Error("too large");
  if (start.type == Const::Type::kInt) {
    std::vector<int64_t> v(count);
    for (int64_t i = 0; i < count; ++i) v[i] = start.ints[0] + i * delta.ints[0];
    return MakeInts({count}, std::move(v));
  }
  std::vector<float> v(count);
  for (int64_t i = 0; i < count; ++i) v[i] = static_cast<float>(s + i * d);
  return MakeFloats({count}, std::move(v));
}

absl::StatusOr<ConstRef> ReshapeConst(const ::onnx::NodeProto& n, const Const& data, const Const& shape) {
  if (shape.any_batch()) return Error("a constant cannot take the batch size as a dimension");
  std::vector<int64_t> dims = IntsOf(&shape);
  int64_t known = 1, infer = -1;
  for (size_t k = 0; k < dims.size(); ++k) {
    if (dims[k] == 0 && AttrInt(n, "allowzero", 0) == 0) {
      if (k >= data.dims.size()) return Error("a 0 beyond the data's rank");
      dims[k] = data.dims[k];
    }
    if (dims[k] == -1) {
      if (infer >= 0) return Error("two -1 dimensions");
      infer = static_cast<int64_t>(k);
    } else {
      known *= dims[k];
    }
  }
  if (infer >= 0) {
    if (known == 0 || data.size() % known != 0) return Error("the shape does not fit the data");
    dims[infer] = data.size() / known;
  }
  if (Product(dims) != data.size()) return Error("the shape does not fit the data");
  return WithDims(data, std::move(dims));
}

absl::StatusOr<ConstRef> ConstantOfShape(const ::onnx::NodeProto& n, const Const& shape) {
  if (shape.any_batch()) {
    return Error("a tensor as large as the batch is not a constant (ConstantOfShape of the batch size)");
  }
  std::vector<int64_t> dims = IntsOf(&shape);
  const int64_t count = Product(dims);
  if (count > (int64_t{1} << 28)) return Error("too large");
  const ::onnx::AttributeProto* value = FindAttr(n, "value");
  if (value == nullptr) return MakeFloats(dims, std::vector<float>(count, 0.0f));
  ASSIGN_OR_RETURN(ConstRef v, DecodeTensor(value->t(), "its value"));
  if (v->size() != 1) return Error("value must hold one element");
  if (v->type == Const::Type::kInt) return MakeInts(dims, std::vector<int64_t>(count, v->ints[0]));
  return MakeFloats(dims, std::vector<float>(count, (*v->floats)[0]));
}

}  // namespace

int64_t Const::size() const { return Product(dims); }

bool Const::any_batch() const { return std::find(batch.begin(), batch.end(), true) != batch.end(); }

double Const::at(int64_t i) const {
  return type == Type::kInt ? static_cast<double>(ints[i]) : static_cast<double>((*floats)[i]);
}

std::string DataTypeName(int data_type) {
  if (!::onnx::TensorProto_DataType_IsValid(data_type)) return absl::StrCat("type ", data_type);
  return ::onnx::TensorProto_DataType_Name(static_cast<TensorProto::DataType>(data_type));
}

absl::StatusOr<ConstRef> DecodeTensor(const TensorProto& t, const std::string& what) {
  if (t.data_location() == TensorProto::EXTERNAL || t.external_data_size() > 0) {
    return Error(absl::StrCat(what, " keeps its data in an external file"));
  }
  if (t.has_segment()) return Error(absl::StrCat(what, " is segmented"));
  auto c = std::make_shared<Const>();
  c->dims.assign(t.dims().begin(), t.dims().end());
  for (int64_t d : c->dims) {
    if (d < 0) return Error(absl::StrCat(what, " has a negative dimension"));
  }
  c->data_type = t.data_type();
  const int64_t n = c->size();
  const bool raw = t.has_raw_data();
  switch (t.data_type()) {
    case TensorProto::FLOAT: {
      c->type = Const::Type::kFloat;
      auto v = std::make_shared<std::vector<float>>();
      if (raw) {
        RETURN_IF_ERROR(ReadRaw(t.raw_data(), n, what, v.get()));
      } else {
        if (t.float_data_size() != n) return CountMismatch(what, t.float_data_size(), n);
        v->assign(t.float_data().begin(), t.float_data().end());
      }
      c->floats = std::move(v);
      return c;
    }
    case TensorProto::DOUBLE: {
      c->type = Const::Type::kFloat;
      std::vector<double> d;
      if (raw) {
        RETURN_IF_ERROR(ReadRaw(t.raw_data(), n, what, &d));
      } else {
        if (t.double_data_size() != n) return CountMismatch(what, t.double_data_size(), n);
        d.assign(t.double_data().begin(), t.double_data().end());
      }
      c->floats = std::make_shared<std::vector<float>>(d.begin(), d.end());
      return c;
    }
    case TensorProto::INT64: {
      c->type = Const::Type::kInt;
      if (raw) {
        RETURN_IF_ERROR(ReadRaw(t.raw_data(), n, what, &c->ints));
      } else {
        if (t.int64_data_size() != n) return CountMismatch(what, t.int64_data_size(), n);
        c->ints.assign(t.int64_data().begin(), t.int64_data().end());
      }
      return c;
    }
    case TensorProto::INT32:
    case TensorProto::INT16:
    case TensorProto::INT8:
    case TensorProto::UINT16:
    case TensorProto::UINT8:
    case TensorProto::BOOL: {
      c->type = Const::Type::kInt;
      if (raw) {
        const std::string& r = t.raw_data();
        const int type = t.data_type();
        const int64_t width = type == TensorProto::INT32 ? 4 : (type == TensorProto::INT16 || type == TensorProto::UINT16) ? 2 : 1;
        if (static_cast<int64_t>(r.size()) != n * width) {
          return Error(absl::StrCat(what, ": raw_data holds ", r.size(), " bytes, its dims need ", n * width));
        }
        c->ints.resize(n);
        for (int64_t i = 0; i < n; ++i) {
          const char* p = r.data() + i * width;
          if (type == TensorProto::INT32) {
            int32_t x;
            std::memcpy(&x, p, 4);
            c->ints[i] = x;
          } else if (type == TensorProto::INT16) {
            int16_t x;
            std::memcpy(&x, p, 2);
            c->ints[i] = x;
          } else if (type == TensorProto::UINT16) {
            uint16_t x;
            std::memcpy(&x, p, 2);
            c->ints[i] = x;
          } else if (type == TensorProto::INT8) {
            c->ints[i] = static_cast<int8_t>(*p);
          } else {
            c->ints[i] = static_cast<uint8_t>(*p);
          }
        }
      } else {
        if (t.int32_data_size() != n) return CountMismatch(what, t.int32_data_size(), n);
        c->ints.assign(t.int32_data().begin(), t.int32_data().end());
      }
      return c;
    }
    default:
      return Error(absl::StrCat(what, " has data type ", DataTypeName(t.data_type()),
                                " (supported: FLOAT, DOUBLE and the integer types)"));
  }
}

bool IsFoldable(const std::string& op) {
  static const std::set<std::string> kOps = {
      "Constant", "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Cast", "Add", "Sub", "Mul", "Div", "Mod",
      "Pow", "Reshape", "Identity", "ConstantOfShape", "Flatten", "Equal", "Less", "Greater", "LessOrEqual",
      "GreaterOrEqual", "And", "Or", "Not", "Neg", "Abs", "Sqrt", "Reciprocal", "Exp", "Log", "Floor", "Ceil",
      "Where", "Expand", "Transpose", "Range", "ScatterND"};
  return kOps.count(op) > 0;
}

absl::StatusOr<ConstRef> MakeShapeOf(const ::onnx::NodeProto& n, const std::vector<int64_t>& dims,
                                     const std::vector<int64_t>& batch_factors) {
  const int64_t rank = static_cast<int64_t>(dims.size());
  int64_t start = AttrInt(n, "start", 0), end = AttrInt(n, "end", rank);
  if (start < 0) start += rank;
  if (end < 0) end += rank;
  start = std::clamp<int64_t>(start, 0, rank);
  end = std::clamp<int64_t>(end, start, rank);
  std::vector<int64_t> ints(dims.begin() + start, dims.begin() + end);
  std::vector<int64_t> batch;
  for (int64_t k = start; k < end; ++k) batch.push_back(k < static_cast<int64_t>(batch_factors.size()) ? batch_factors[k] : 0);
  return MakeInts({end - start}, std::move(ints), std::move(batch));
}

absl::StatusOr<std::vector<ConstRef>> FoldNode(const ::onnx::NodeProto& n, const std::vector<const Const*>& in,
                                               int opset) {
  const std::string& op = n.op_type();
  auto input = [&](size_t k) -> const Const* { return k < in.size() ? in[k] : nullptr; };
  auto need = [&](size_t k) -> absl::StatusOr<const Const*> {
    if (input(k) == nullptr) return Error(absl::StrCat("input ", k, " is missing"));
    return input(k);
  };
  if (op == "Constant") return Single(FoldConstantNode(n));
  if (op == "Identity") {
    ASSIGN_OR_RETURN(const Const* x, need(0));
    return Single(WithDims(*x, x->dims));
  }
  if (op == "Gather") {
    ASSIGN_OR_RETURN(const Const* data, need(0));
    ASSIGN_OR_RETURN(const Const* indices, need(1));
    return Single(Gather(n, *data, *indices));
  }
  if (op == "Unsqueeze" || op == "Squeeze") {
    ASSIGN_OR_RETURN(const Const* data, need(0));
    const std::vector<int64_t> axes = opset >= 13 ? IntsOf(input(1)) : AttrInts(n, "axes");
    if (op == "Unsqueeze") return Single(Unsqueeze(*data, axes));
    return Single(Squeeze(*data, axes));
  }
  if (op == "Concat") return Single(Concat(n, in));
  if (op == "Slice") {
    ASSIGN_OR_RETURN(const Const* data, need(0));
    if (opset < 10) return Error("Slice before opset 10");
    ASSIGN_OR_RETURN(const Const* starts, need(1));
    ASSIGN_OR_RETURN(const Const* ends, need(2));
    return Single(Slice(*data, IntsOf(starts), IntsOf(ends), IntsOf(input(3)), IntsOf(input(4))));
  }
  if (op == "Cast") {
    ASSIGN_OR_RETURN(const Const* data, need(0));
    return Single(Cast(n, *data));
  }
  if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div" || op == "Mod" || op == "Pow" || IsComparison(op)) {
    ASSIGN_OR_RETURN(const Const* a, need(0));
    ASSIGN_OR_RETURN(const Const* b, need(1));
    return Single(Arithmetic(op, *a, *b));
  }
  if (op == "Not" || op == "Neg" || op == "Abs" || op == "Sqrt" || op == "Reciprocal" || op == "Exp" ||
      op == "Log" || op == "Floor" || op == "Ceil") {
    ASSIGN_OR_RETURN(const Const* a, need(0));
    return Single(Unary(op, *a));
  }
  if (op == "Where") {
    ASSIGN_OR_RETURN(const Const* c, need(0));
    ASSIGN_OR_RETURN(const Const* a, need(1));
    ASSIGN_OR_RETURN(const Const* b, need(2));
    return Single(Where(*c, *a, *b));
  }
  if (op == "Expand") {
    ASSIGN_OR_RETURN(const Const* data, need(0));
    ASSIGN_OR_RETURN(const Const* shape, need(1));
    return Single(Expand(*data, *shape));
  }
  if (op == "Transpose") {
    ASSIGN_OR_RETURN(const Const* data, need(0));
    return Single(TransposeConst(n, *data));
  }
  if (op == "Range") {
    ASSIGN_OR_RETURN(const Const* start, need(0));
    ASSIGN_OR_RETURN(const Const* limit, need(1));
    ASSIGN_OR_RETURN(const Const* delta, need(2));
    return Single(Range(*start, *limit, *delta));
  }
  if (op == "Reshape") {
    ASSIGN_OR_RETURN(const Const* data, need(0));
    ASSIGN_OR_RETURN(const Const* shape, need(1));
    return Single(ReshapeConst(n, *data, *shape));
  }
  if (op == "Flatten") {
    ASSIGN_OR_RETURN(const Const* data, need(0));
    const int64_t rank = static_cast<int64_t>(data->dims.size());
    ASSIGN_OR_RETURN(int64_t axis, Axis(AttrInt(n, "axis", 1), rank + 1, "axis"));
    int64_t outer = 1;
    for (int64_t k = 0; k < axis; ++k) outer *= data->dims[k];
    return Single(WithDims(*data, {outer, data->size() / std::max<int64_t>(outer, 1)}));
  }
  if (op == "ScatterND") {
    ASSIGN_OR_RETURN(const Const* data, need(0));
    ASSIGN_OR_RETURN(const Const* indices, need(1));
    ASSIGN_OR_RETURN(const Const* updates, need(2));
    return Single(ScatterND(n, *data, *indices, *updates));
  }
  if (op == "ConstantOfShape") {
    ASSIGN_OR_RETURN(const Const* shape, need(0));
    return Single(ConstantOfShape(n, *shape));
  }
  return Error(absl::StrCat(op, " of constants is not folded"));
}

}  // namespace dtrain::models::onnx
