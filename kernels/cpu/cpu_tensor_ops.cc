// The CPU backend's shape-specialized tensor ops of imported graphs (kernels/tensor_ops.h): batched MatMul,
// Softmax and LayerNorm on oneDNN's primitives (matmul with strided descriptors for the transposed operands,
// softmax_v2, layer_normalization), Reduce on the loops of tensor_loops.h.
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/tensor_loops.h"

namespace dtrain::kernels::cpu {
namespace {

using dnnl::memory;
using dt = dnnl::memory::data_type;

// [batch, rows, cols] stored row-major, or read transposed ([batch, cols, rows] storage) when `transposed`.
memory::desc Matrix(int64_t batch, int64_t rows, int64_t cols, bool transposed) {
  const memory::dims strides = transposed ? memory::dims{rows * cols, 1, rows} : memory::dims{rows * cols, cols, 1};
  return memory::desc({batch, rows, cols}, dt::f32, strides);
}

class DnnlMatMul final : public MatMul {
 public:
  DnnlMatMul(const DnnlContext& ctx, const MatMulParams& p) : ctx_(ctx), p_(p), what_(Describe(p)) {}

  void Init() {
    const dnnl::engine& eng = ctx_.engine;
    const int64_t B = p_.batch, M = p_.m, N = p_.n, K = p_.k;
    const dnnl::primitive_attr attr = UserScratchpadAttr();
    // Forward: y[M,N] = op(a)[M,K] op(b)[K,N].
    const memory::desc a_md = Matrix(B, M, K, p_.trans_a), b_md = Matrix(B, K, N, p_.trans_b);
    const memory::desc y_md = Matrix(B, M, N, false);
    dnnl::matmul::primitive_desc fwd_pd(dnnl::matmul::desc(a_md, b_md, y_md), attr, eng);
    // da in a's layout: op(a)' = dy[M,N] op(b)^T[N,K], written as [M,K] (trans_a: into [K,M] storage).
    const memory::desc bt_md = Matrix(B, N, K, !p_.trans_b), da_md = Matrix(B, M, K, p_.trans_a);
    dnnl::matmul::primitive_desc da_pd(dnnl::matmul::desc(y_md, bt_md, da_md), attr, eng);
    // db in b's layout: op(b)' = op(a)^T[K,M] dy[M,N].
    const memory::desc at_md = Matrix(B, K, M, !p_.trans_a), db_md = Matrix(B, K, N, p_.trans_b);
    dnnl::matmul::primitive_desc db_pd(dnnl::matmul::desc(at_md, y_md, db_md), attr, eng);
    a_ = memory(a_md, eng, DNNL_MEMORY_NONE);
    b_ = memory(b_md, eng, DNNL_MEMORY_NONE);
    y_ = memory(y_md, eng, DNNL_MEMORY_NONE);
    bt_ = memory(bt_md, eng, DNNL_MEMORY_NONE);
    da_ = memory(da_md, eng, DNNL_MEMORY_NONE);
    at_ = memory(at_md, eng, DNNL_MEMORY_NONE);
    db_ = memory(db_md, eng, DNNL_MEMORY_NONE);
    scratch_.Share(eng, {{&fwd_pd, &fwd_scratch_}, {&da_pd, &da_scratch_}, {&db_pd, &db_scratch_}});
    fwd_ = dnnl::matmul(fwd_pd);
    da_prim_ = dnnl::matmul(da_pd);
    db_prim_ = dnnl::matmul(db_pd);
  }

  absl::Status Forward(const float* a, const float* b, float* y) override {
    return Run(" forward", fwd_, a_, a, b_, b, y_, y, fwd_scratch_);
  }
  absl::Status BackwardA(const float* dy, const float* b, float* da) override {
    return Run(" backward (a)", da_prim_, y_, dy, bt_, b, da_, da, da_scratch_);
  }
  absl::Status BackwardB(const float* a, const float* dy, float* db) override {
    return Run(" backward (b)", db_prim_, at_, a, y_, dy, db_, db, db_scratch_);
  }

 private:
  absl::Status Run(const char* pass, dnnl::matmul& prim, memory& src, const float* s, memory& wei, const float* w,
                   memory& dst, float* d, memory& scratch) {
    return RunDnnl(ctx_, what_, pass, [&] {
      src.set_data_handle(Mutable(s));
      wei.set_data_handle(Mutable(w));
      dst.set_data_handle(d);
      prim.execute(ctx_.stream,
                   {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}, {DNNL_ARG_SCRATCHPAD, scratch}});
    });
  }

  DnnlContext ctx_;
  MatMulParams p_;
  std::string what_;
  dnnl::matmul fwd_, da_prim_, db_prim_;
  memory a_, b_, y_, bt_, da_, at_, db_;
  SharedScratchpad scratch_;
  memory fwd_scratch_, da_scratch_, db_scratch_;
};

class DnnlSoftmax final : public Softmax {
 public:
  DnnlSoftmax(const DnnlContext& ctx, const SoftmaxParams& p) : ctx_(ctx), p_(p), what_(Describe(p)) {}

  void Init() {
    const dnnl::engine& eng = ctx_.engine;
    const memory::desc md({p_.outer, p_.n, p_.inner}, dt::f32, memory::format_tag::abc);
    const dnnl::algorithm alg = p_.log ? dnnl::algorithm::softmax_log : dnnl::algorithm::softmax_accurate;
    const dnnl::primitive_attr attr = UserScratchpadAttr();
    dnnl::softmax_v2_forward::primitive_desc fwd_pd(
        dnnl::softmax_v2_forward::desc(dnnl::prop_kind::forward_training, alg, md, md, 1), attr, eng);
    dnnl::softmax_v2_backward::primitive_desc bwd_pd(dnnl::softmax_v2_backward::desc(alg, md, md, md, 1), attr,
                                                      eng, fwd_pd);
    x_ = memory(md, eng, DNNL_MEMORY_NONE);
    y_ = memory(md, eng, DNNL_MEMORY_NONE);
    dy_ = memory(md, eng, DNNL_MEMORY_NONE);
    dx_ = memory(md, eng, DNNL_MEMORY_NONE);
    scratch_.Share(eng, {{&fwd_pd, &fwd_scratch_}, {&bwd_pd, &bwd_scratch_}});
    fwd_ = dnnl::softmax_v2_forward(fwd_pd);
    bwd_ = dnnl::softmax_v2_backward(bwd_pd);
  }

  absl::Status Forward(const float* x, float* y) override {
    return RunDnnl(ctx_, what_, " forward", [&] {
      x_.set_data_handle(Mutable(x));
      y_.set_data_handle(y);
      fwd_.execute(ctx_.stream, {{DNNL_ARG_SRC, x_}, {DNNL_ARG_DST, y_}, {DNNL_ARG_SCRATCHPAD, fwd_scratch_}});
    });
  }

  absl::Status Backward(const float* y, const float* dy, float* dx) override {
    return RunDnnl(ctx_, what_, " backward", [&] {
      y_.set_data_handle(Mutable(y));
      dy_.set_data_handle(Mutable(dy));
      dx_.set_data_handle(dx);
      bwd_.execute(ctx_.stream, {{DNNL_ARG_DST, y_},
                                 {DNNL_ARG_DIFF_DST, dy_},
                                 {DNNL_ARG_DIFF_SRC, dx_},
                                 {DNNL_ARG_SCRATCHPAD, bwd_scratch_}});
    });
  }

 private:
  DnnlContext ctx_;
  SoftmaxParams p_;
  std::string what_;
  dnnl::softmax_v2_forward fwd_;
  dnnl::softmax_v2_backward bwd_;
  memory x_, y_, dy_, dx_;
  SharedScratchpad scratch_;
  memory fwd_scratch_, bwd_scratch_;
};

class DnnlLayerNorm final : public LayerNorm {
 public:
  DnnlLayerNorm(const DnnlContext& ctx, const LayerNormParams& p) : ctx_(ctx), p_(p), what_(Describe(p)) {}

  void Init() {
    const dnnl::engine& eng = ctx_.engine;
    const memory::desc md({p_.rows, p_.cols}, dt::f32, memory::format_tag::ab);
    const memory::desc stat_md({p_.rows}, dt::f32, memory::format_tag::a);
    const memory::desc param_md({p_.cols}, dt::f32, memory::format_tag::a);
    flags_ = dnnl::normalization_flags::use_scale;
    if (p_.has_bias) flags_ = flags_ | dnnl::normalization_flags::use_shift;
    const dnnl::primitive_attr attr = UserScratchpadAttr();
    dnnl::layer_normalization_forward::primitive_desc fwd_pd(
        dnnl::layer_normalization_forward::desc(dnnl::prop_kind::forward_training, md, stat_md, p_.epsilon,
                                                flags_),
        attr, eng);
    dnnl::layer_normalization_backward::primitive_desc bwd_pd(
        dnnl::layer_normalization_backward::desc(dnnl::prop_kind::backward, md, md, stat_md, p_.epsilon, flags_),
        attr, eng, fwd_pd);
    x_ = memory(md, eng, DNNL_MEMORY_NONE);
    y_ = memory(md, eng, DNNL_MEMORY_NONE);
    dy_ = memory(md, eng, DNNL_MEMORY_NONE);
    dx_ = memory(md, eng, DNNL_MEMORY_NONE);
    mean_ = memory(stat_md, eng, DNNL_MEMORY_NONE);
    var_ = memory(stat_md, eng, DNNL_MEMORY_NONE);
    scale_ = memory(param_md, eng, DNNL_MEMORY_NONE);
    shift_ = memory(param_md, eng, DNNL_MEMORY_NONE);
    dscale_ = memory(param_md, eng, DNNL_MEMORY_NONE);
    dshift_ = memory(param_md, eng, DNNL_MEMORY_NONE);
    scratch_.Share(eng, {{&fwd_pd, &fwd_scratch_}, {&bwd_pd, &bwd_scratch_}});
    fwd_ = dnnl::layer_normalization_forward(fwd_pd);
    bwd_ = dnnl::layer_normalization_backward(bwd_pd);
  }

  absl::Status Forward(const float* x, const float* scale, const float* bias, float* y, float* mean,
                       float* var) override {
    return RunDnnl(ctx_, what_, " forward", [&] {
      x_.set_data_handle(Mutable(x));
      y_.set_data_handle(y);
      mean_.set_data_handle(mean);
      var_.set_data_handle(var);
      scale_.set_data_handle(Mutable(scale));
      std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, x_},       {DNNL_ARG_DST, y_},
                                              {DNNL_ARG_MEAN, mean_},   {DNNL_ARG_VARIANCE, var_},
                                              {DNNL_ARG_SCALE, scale_}, {DNNL_ARG_SCRATCHPAD, fwd_scratch_}};
      if (p_.has_bias) {
        shift_.set_data_handle(Mutable(bias));
        args[DNNL_ARG_SHIFT] = shift_;
      }
      fwd_.execute(ctx_.stream, args);
    });
  }

  absl::Status Backward(const float* x, const float* dy, const float* scale, const float* mean, const float* var,
                        float* dx, float* dscale, float* dbias) override {
    return RunDnnl(ctx_, what_, " backward", [&] {
      x_.set_data_handle(Mutable(x));
      dy_.set_data_handle(Mutable(dy));
      dx_.set_data_handle(dx);
      mean_.set_data_handle(Mutable(mean));
      var_.set_data_handle(Mutable(var));
      scale_.set_data_handle(Mutable(scale));
      dscale_.set_data_handle(dscale);
      std::unordered_map<int, memory> args = {
          {DNNL_ARG_SRC, x_},           {DNNL_ARG_DIFF_DST, dy_},       {DNNL_ARG_DIFF_SRC, dx_},
          {DNNL_ARG_MEAN, mean_},       {DNNL_ARG_VARIANCE, var_},      {DNNL_ARG_SCALE, scale_},
          {DNNL_ARG_DIFF_SCALE, dscale_}, {DNNL_ARG_SCRATCHPAD, bwd_scratch_}};
      if (p_.has_bias) {
        dshift_.set_data_handle(dbias);
        args[DNNL_ARG_DIFF_SHIFT] = dshift_;
        // oneDNN checks that the shift is given although the gradients do not read it: the scale stands in.
        shift_.set_data_handle(Mutable(scale));
        args[DNNL_ARG_SHIFT] = shift_;
      }
      bwd_.execute(ctx_.stream, args);
    });
  }

 private:
  DnnlContext ctx_;
  LayerNormParams p_;
  std::string what_;
  dnnl::normalization_flags flags_;
  dnnl::layer_normalization_forward fwd_;
  dnnl::layer_normalization_backward bwd_;
  memory x_, y_, dy_, dx_, mean_, var_, scale_, shift_, dscale_, dshift_;
  SharedScratchpad scratch_;
  memory fwd_scratch_, bwd_scratch_;
};

class CpuReduce final : public Reduce {
 public:
  CpuReduce(const ReduceParams& p, int threads) : p_(p), threads_(threads) {
    if (p.kind == ReduceKind::kMax) argmax_.resize(p.outer * p.inner);
  }
  absl::Status Forward(const float* x, float* y) override {
    UseThreads(threads_);
    ReduceLoop(p_, x, y, argmax_.data(), threads_);
    return absl::OkStatus();
  }
  absl::Status Backward(const float* dy, float* dx) override {
    UseThreads(threads_);
    ReduceBackwardLoop(p_, dy, argmax_.data(), dx, threads_);
    return absl::OkStatus();
  }

 private:
  ReduceParams p_;
  int threads_;
  std::vector<int32_t> argmax_;  // kMax: the last Forward's maxima
};

}  // namespace

absl::StatusOr<std::unique_ptr<MatMul>> MakeCpuMatMul(const DnnlContext& ctx, const MatMulParams& p) {
  RETURN_IF_ERROR(CheckMatMulParams("MakeMatMul", p));
  return MakeDnnlOp<DnnlMatMul>(ctx, absl::StrCat("MakeMatMul ", Describe(p)), ctx, p);
}

absl::StatusOr<std::unique_ptr<Softmax>> MakeCpuSoftmax(const DnnlContext& ctx, const SoftmaxParams& p) {
  RETURN_IF_ERROR(CheckSoftmaxParams("MakeSoftmax", p));
  return MakeDnnlOp<DnnlSoftmax>(ctx, absl::StrCat("MakeSoftmax ", Describe(p)), ctx, p);
}

absl::StatusOr<std::unique_ptr<LayerNorm>> MakeCpuLayerNorm(const DnnlContext& ctx, const LayerNormParams& p) {
  RETURN_IF_ERROR(CheckLayerNormParams("MakeLayerNorm", p));
  return MakeDnnlOp<DnnlLayerNorm>(ctx, absl::StrCat("MakeLayerNorm ", Describe(p)), ctx, p);
}

absl::StatusOr<std::unique_ptr<Reduce>> MakeCpuReduce(const DnnlContext& ctx, const ReduceParams& p) {
  RETURN_IF_ERROR(CheckReduceParams("MakeReduce", p));
  if (p.kind == ReduceKind::kMax && p.reduce > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("MakeReduce: ", Describe(p), " reduces more than 2^31 elements"));
  }
  return std::unique_ptr<Reduce>(std::make_unique<CpuReduce>(p, ctx.threads));
}

}  // namespace dtrain::kernels::cpu
