// Dense on oneDNN's matmul primitive. The logical weights [in, out] are row-major `ab`; the two backward
// products read w and x transposed in place through `ba` descriptors, so nothing is copied.
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_ops.h"

namespace dtrain::kernels::cpu {
namespace {

using dnnl::memory;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

class DnnlDense final : public Dense {
 public:
  DnnlDense(const DnnlContext& ctx, const DenseParams& p) : ctx_(ctx), p_(p), what_(Describe(p)) {}

  void Init() {
    const dnnl::engine& eng = ctx_.engine;
    const memory::dim B = p_.batch, I = p_.in, O = p_.out;
    const dnnl::primitive_attr attr = UserScratchpadAttr();
    // Forward: y[B,O] = x[B,I] w[I,O] + b[1,O].
    const memory::desc x_md({B, I}, dt::f32, tag::ab), w_md({I, O}, dt::f32, tag::ab);
    const memory::desc b_md({1, O}, dt::f32, tag::ab), y_md({B, O}, dt::f32, tag::ab);
    dnnl::matmul::primitive_desc fwd_pd(dnnl::matmul::desc(x_md, w_md, b_md, y_md), attr, eng);
    // Backward data: dx[B,I] = dy[B,O] w^T[O,I].
    const memory::desc wt_md({O, I}, dt::f32, tag::ba);
    dnnl::matmul::primitive_desc bwd_data_pd(dnnl::matmul::desc(y_md, wt_md, x_md), attr, eng);
    // Backward weights: dw[I,O] = x^T[I,B] dy[B,O].
    const memory::desc xt_md({I, B}, dt::f32, tag::ba);
    dnnl::matmul::primitive_desc bwd_w_pd(dnnl::matmul::desc(xt_md, y_md, w_md), attr, eng);

    x_ = memory(x_md, eng, DNNL_MEMORY_NONE);
    w_ = memory(w_md, eng, DNNL_MEMORY_NONE);
    b_ = memory(b_md, eng, DNNL_MEMORY_NONE);
    y_ = memory(y_md, eng, DNNL_MEMORY_NONE);
    wt_ = memory(wt_md, eng, DNNL_MEMORY_NONE);
    xt_ = memory(xt_md, eng, DNNL_MEMORY_NONE);
    scratch_.Reserve(fwd_pd);
    scratch_.Reserve(bwd_data_pd);
    scratch_.Reserve(bwd_w_pd);
    scratch_.Allocate();
    fwd_scratch_ = scratch_.For(fwd_pd, eng);
    bwd_data_scratch_ = scratch_.For(bwd_data_pd, eng);
    bwd_w_scratch_ = scratch_.For(bwd_w_pd, eng);
    fwd_ = dnnl::matmul(fwd_pd);
    bwd_data_ = dnnl::matmul(bwd_data_pd);
    bwd_w_ = dnnl::matmul(bwd_w_pd);
  }

  absl::Status Forward(const float* x, const float* w, const float* b, float* y) override {
    UseThreads(ctx_.threads);
    try {
      x_.set_data_handle(Mutable(x));
      w_.set_data_handle(Mutable(w));
      b_.set_data_handle(Mutable(b));
      y_.set_data_handle(y);
      fwd_.execute(ctx_.stream, {{DNNL_ARG_SRC, x_},
                                 {DNNL_ARG_WEIGHTS, w_},
                                 {DNNL_ARG_BIAS, b_},
                                 {DNNL_ARG_DST, y_},
                                 {DNNL_ARG_SCRATCHPAD, fwd_scratch_}});
    } catch (const dnnl::error& e) {
      return DnnlError(absl::StrCat(what_, " forward"), e);
    }
    return absl::OkStatus();
  }

  absl::Status BackwardData(const float* dy, const float* w, float* dx) override {
    UseThreads(ctx_.threads);
    try {
      y_.set_data_handle(Mutable(dy));
      wt_.set_data_handle(Mutable(w));
      x_.set_data_handle(dx);
      bwd_data_.execute(ctx_.stream, {{DNNL_ARG_SRC, y_},
                                      {DNNL_ARG_WEIGHTS, wt_},
                                      {DNNL_ARG_DST, x_},
                                      {DNNL_ARG_SCRATCHPAD, bwd_data_scratch_}});
    } catch (const dnnl::error& e) {
      return DnnlError(absl::StrCat(what_, " backward-data"), e);
    }
    return absl::OkStatus();
  }

  absl::Status BackwardWeights(const float* x, const float* dy, float* dw, float* db) override {
    UseThreads(ctx_.threads);
    try {
      xt_.set_data_handle(Mutable(x));
      y_.set_data_handle(Mutable(dy));
      w_.set_data_handle(dw);
      bwd_w_.execute(ctx_.stream, {{DNNL_ARG_SRC, xt_},
                                   {DNNL_ARG_WEIGHTS, y_},
                                   {DNNL_ARG_DST, w_},
                                   {DNNL_ARG_SCRATCHPAD, bwd_w_scratch_}});
    } catch (const dnnl::error& e) {
      return DnnlError(absl::StrCat(what_, " backward-weights"), e);
    }
    ColumnSums(dy, db);
    return absl::OkStatus();
  }

 private:
  // db[o] = sum_n dy[n, o]; the inner loop runs over contiguous o and vectorizes.
  void ColumnSums(const float* __restrict dy, float* __restrict db) const {
    const int out = p_.out;
    std::memcpy(db, dy, sizeof(float) * out);
    for (int n = 1; n < p_.batch; ++n) {
      const float* __restrict row = dy + static_cast<int64_t>(n) * out;
      for (int o = 0; o < out; ++o) db[o] += row[o];
    }
  }

  DnnlContext ctx_;
  DenseParams p_;
  std::string what_;
  dnnl::matmul fwd_, bwd_data_, bwd_w_;
  memory x_, w_, b_, y_, wt_, xt_;  // x_/w_/y_ double as dx/dw/dy
  SharedScratchpad scratch_;
  memory fwd_scratch_, bwd_data_scratch_, bwd_w_scratch_;
};

}  // namespace

std::string Describe(const DenseParams& p) {
  return absl::StrCat("dense[batch=", p.batch, " in=", p.in, " out=", p.out, "]");
}

absl::StatusOr<std::unique_ptr<Dense>> MakeCpuDense(const DnnlContext& ctx, const DenseParams& p) {
  if (p.batch <= 0 || p.in <= 0 || p.out <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("MakeDense: every size must be positive: ", Describe(p)));
  }
  UseThreads(ctx.threads);
  auto op = std::make_unique<DnnlDense>(ctx, p);
  try {
    op->Init();
  } catch (const dnnl::error& e) {
    return DnnlError(absl::StrCat("MakeDense ", Describe(p)), e);
  }
  return op;
}

}  // namespace dtrain::kernels::cpu
