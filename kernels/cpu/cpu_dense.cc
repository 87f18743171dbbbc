// Dense on oneDNN's matmul primitive. The logical weights [in, out] are row-major `ab` ([out, in] when
// weights_transposed: `ba`); the backward products read w, x and dy transposed in place through `ba`/`ab`
// descriptors, so nothing is copied. alpha is the matmul's output scale; the bias is the matmul's own when
// alpha is 1 (scaled by beta into a private copy when beta is not 1), else added by a loop after it.
// With bf16 compute (DnnlContext::bf16) the products read bf16 copies of x and w (made by Forward, kept for the
// backward products) and of dy (made by the first backward call, used by the second), accumulate in fp32 and
// write y, dx and dw in fp32 into the caller's buffers.
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

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

  // With bf16 compute, a shape oneDNN has no bf16 matmul for is made in fp32 (the PrecisionLog says so).
  void Init() {
    BuildPreferringBf16(ctx_, ctx_.bf16, what_, [this](bool bf16) { Build(bf16); });
  }

  void Build(bool bf16) {
    bf16_ = bf16;
    const dnnl::engine& eng = ctx_.engine;
    const memory::dim B = p_.batch, I = p_.in, O = p_.out;
    const bool t = p_.weights_transposed;
    dnnl::primitive_attr attr = UserScratchpadAttr();
    if (p_.alpha != 1.0f) attr.set_output_scales(0, {p_.alpha});
    bias_in_matmul_ = p_.has_bias && p_.alpha == 1.0f;
    if (bias_in_matmul_ && p_.beta != 1.0f) scaled_bias_.resize(p_.out);
    // What the products read: fp32 (the caller's buffers) or bf16 (the staged copies, same layouts).
    const dt in = bf16 ? dt::bf16 : dt::f32;
    // Forward: y[B,O] = x[B,I] w[I,O] (+ b[1,O]).
    const memory::desc x_md({B, I}, dt::f32, tag::ab), w_md({I, O}, dt::f32, t ? tag::ba : tag::ab);
    const memory::desc x_in({B, I}, in, tag::ab), w_in({I, O}, in, t ? tag::ba : tag::ab);
    const memory::desc b_md = bias_in_matmul_ ? memory::desc({1, O}, dt::f32, tag::ab) : memory::desc();
    const memory::desc y_md({B, O}, dt::f32, tag::ab), dy_in({B, O}, in, tag::ab);
    dnnl::matmul::primitive_desc fwd_pd(dnnl::matmul::desc(x_in, w_in, b_md, y_md), attr, eng);
    // Backward data: dx[B,I] = dy[B,O] w^T[O,I].
    const memory::desc wt_in({O, I}, in, t ? tag::ab : tag::ba);
    dnnl::matmul::primitive_desc bwd_data_pd(dnnl::matmul::desc(dy_in, wt_in, x_md), attr, eng);
    // Backward weights in w's layout: dw[I,O] = x^T[I,B] dy[B,O], or dw[O,I] = dy^T[O,B] x[B,I].
    const memory::desc xt_in({I, B}, in, tag::ba), dyt_in({O, B}, in, tag::ba);
    const memory::desc dw_md({t ? O : I, t ? I : O}, dt::f32, tag::ab);
    dnnl::matmul::primitive_desc bwd_w_pd(
        t ? dnnl::matmul::desc(dyt_in, x_in, dw_md) : dnnl::matmul::desc(xt_in, dy_in, dw_md), attr, eng);

    y_ = memory(y_md, eng, DNNL_MEMORY_NONE);
    dx_ = memory(x_md, eng, DNNL_MEMORY_NONE);
    dw_ = memory(dw_md, eng, DNNL_MEMORY_NONE);
    if (bias_in_matmul_) b_ = memory(b_md, eng, DNNL_MEMORY_NONE);
    if (bf16) {
      x16_.Init(eng, x_md, x_in);
      w16_.Init(eng, w_md, w_in);
      dy16_.Init(eng, y_md, dy_in);
      x_ = x16_.memory();
      w_ = w16_.memory();
      dy_ = dy16_.memory();
      wt_ = w16_.View(eng, wt_in);
      xt_ = x16_.View(eng, xt_in);
      dyt_ = dy16_.View(eng, dyt_in);
    } else {
      x_ = memory(x_md, eng, DNNL_MEMORY_NONE);
      w_ = memory(w_md, eng, DNNL_MEMORY_NONE);
      dy_ = memory(y_md, eng, DNNL_MEMORY_NONE);
      wt_ = memory(wt_in, eng, DNNL_MEMORY_NONE);
      xt_ = memory(xt_in, eng, DNNL_MEMORY_NONE);
      dyt_ = memory(dyt_in, eng, DNNL_MEMORY_NONE);
    }
    scratch_.Share(eng, {{&fwd_pd, &fwd_scratch_}, {&bwd_data_pd, &bwd_data_scratch_}, {&bwd_w_pd, &bwd_w_scratch_}});
    fwd_ = dnnl::matmul(fwd_pd);
    bwd_data_ = dnnl::matmul(bwd_data_pd);
    bwd_w_ = dnnl::matmul(bwd_w_pd);
    if (bf16) {
      ctx_.precision->Bf16("dense", {fwd_pd.impl_info_str(), bwd_data_pd.impl_info_str(), bwd_w_pd.impl_info_str()});
    }
  }

  absl::Status Forward(const float* x, const float* w, const float* b, float* y) override {
    UseThreads(ctx_.threads);
    try {
      if (bf16_) {
        x16_.Stage(ctx_.stream, x);
        w16_.Stage(ctx_.stream, w);
        dy16_.Forget();
      } else {
        x_.set_data_handle(Mutable(x));
        w_.set_data_handle(Mutable(w));
      }
      y_.set_data_handle(y);
      std::unordered_map<int, memory> args = {
          {DNNL_ARG_SRC, x_}, {DNNL_ARG_WEIGHTS, w_}, {DNNL_ARG_DST, y_}, {DNNL_ARG_SCRATCHPAD, fwd_scratch_}};
      if (bias_in_matmul_) {
        if (!scaled_bias_.empty()) {
          for (int o = 0; o < p_.out; ++o) scaled_bias_[o] = p_.beta * b[o];
          b = scaled_bias_.data();
        }
        b_.set_data_handle(Mutable(b));
        args[DNNL_ARG_BIAS] = b_;
      }
      fwd_.execute(ctx_.stream, args);
    } catch (const dnnl::error& e) {
      return DnnlError(absl::StrCat(what_, " forward"), e);
    }
    if (p_.has_bias && !bias_in_matmul_) AddScaledBias(b, y);
    return absl::OkStatus();
  }

  absl::Status BackwardData(const float* dy, const float* w, float* dx) override {
    return RunDnnl(ctx_, what_, " backward-data", [&] {
      if (bf16_) {
        dy16_.StageShared(ctx_.stream, dy);  // w's bf16 copy is the last Forward's (the header's contract)
      } else {
        dy_.set_data_handle(Mutable(dy));
        wt_.set_data_handle(Mutable(w));
      }
      dx_.set_data_handle(dx);
      bwd_data_.execute(ctx_.stream, {{DNNL_ARG_SRC, dy_},
                                      {DNNL_ARG_WEIGHTS, wt_},
                                      {DNNL_ARG_DST, dx_},
                                      {DNNL_ARG_SCRATCHPAD, bwd_data_scratch_}});
    });
  }

  absl::Status BackwardWeights(const float* x, const float* dy, float* dw, float* db) override {
    UseThreads(ctx_.threads);
    try {
      dw_.set_data_handle(dw);
      if (bf16_) {
        dy16_.StageShared(ctx_.stream, dy);  // x's bf16 copy is the last Forward's (the header's contract)
      } else if (p_.weights_transposed) {
        dyt_.set_data_handle(Mutable(dy));
        x_.set_data_handle(Mutable(x));
      } else {
        xt_.set_data_handle(Mutable(x));
        dy_.set_data_handle(Mutable(dy));
      }
      if (p_.weights_transposed) {
        bwd_w_.execute(ctx_.stream, {{DNNL_ARG_SRC, dyt_},
                                     {DNNL_ARG_WEIGHTS, x_},
                                     {DNNL_ARG_DST, dw_},
                                     {DNNL_ARG_SCRATCHPAD, bwd_w_scratch_}});
      } else {
        bwd_w_.execute(ctx_.stream, {{DNNL_ARG_SRC, xt_},
                                     {DNNL_ARG_WEIGHTS, dy_},
                                     {DNNL_ARG_DST, dw_},
                                     {DNNL_ARG_SCRATCHPAD, bwd_w_scratch_}});
      }
    } catch (const dnnl::error& e) {
      return DnnlError(absl::StrCat(what_, " backward-weights"), e);
    }
    if (p_.has_bias && db != nullptr) ColumnSums(dy, db);
    return absl::OkStatus();
  }

 private:
  // db[o] = beta * sum_n dy[n, o]; the inner loop runs over contiguous o and vectorizes.
  void ColumnSums(const float* __restrict dy, float* __restrict db) const {
    const int out = p_.out;
    std::memcpy(db, dy, sizeof(float) * out);
    for (int n = 1; n < p_.batch; ++n) {
      const float* __restrict row = dy + static_cast<int64_t>(n) * out;
      for (int o = 0; o < out; ++o) db[o] += row[o];
    }
    if (p_.beta != 1.0f) {
      for (int o = 0; o < out; ++o) db[o] *= p_.beta;
    }
  }

  // y[n, :] += beta * b (when alpha is not 1, the matmul's output scale would also scale its bias).
  void AddScaledBias(const float* __restrict b, float* __restrict y) const {
    const int out = p_.out;
    for (int n = 0; n < p_.batch; ++n) {
      float* __restrict row = y + static_cast<int64_t>(n) * out;
      for (int o = 0; o < out; ++o) row[o] += p_.beta * b[o];
    }
  }

  DnnlContext ctx_;
  DenseParams p_;
  std::string what_;
  dnnl::matmul fwd_, bwd_data_, bwd_w_;
  // What the products read (the caller's buffers in fp32, views of the bf16 copies in bf16) and write.
  memory x_, w_, dy_, wt_, xt_, dyt_, b_, y_, dx_, dw_;
  bool bf16_ = false;
  Bf16Operand x16_, w16_, dy16_;
  bool bias_in_matmul_ = false;
  std::vector<float> scaled_bias_;  // beta * b, when the matmul adds a bias that beta scales
  SharedScratchpad scratch_;
  memory fwd_scratch_, bwd_data_scratch_, bwd_w_scratch_;
};

}  // namespace

std::string Describe(const DenseParams& p) {
  return absl::StrCat("dense[batch=", p.batch, " in=", p.in, " out=", p.out, p.weights_transposed ? " transposed" : "",
                      p.has_bias ? "" : " no_bias", p.alpha != 1.0f ? absl::StrCat(" alpha=", p.alpha) : "",
                      p.beta != 1.0f ? absl::StrCat(" beta=", p.beta) : "", "]");
}

absl::StatusOr<std::unique_ptr<Dense>> MakeCpuDense(const DnnlContext& ctx, const DenseParams& p) {
  if (p.batch <= 0 || p.in <= 0 || p.out <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("MakeDense: every size must be positive: ", Describe(p)));
  }
  return MakeDnnlOp<DnnlDense>(ctx, absl::StrCat("MakeDense ", Describe(p)), ctx, p);
}

}  // namespace dtrain::kernels::cpu
