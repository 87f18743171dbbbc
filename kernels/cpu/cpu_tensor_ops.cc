// The CPU backend's shape-specialized tensor ops of imported graphs (kernels/tensor_ops.h): batched MatMul,
// Softmax and LayerNorm on oneDNN's primitives (matmul with strided descriptors for the transposed operands,
// softmax_v2, layer_normalization), Reduce on the loops of tensor_loops.h. With bf16 compute (DnnlContext::bf16)
// the MatMul's products read bf16 copies of a and b (made by Forward, kept for the backward products) and of dy
// (made by the first backward call, used by the second), accumulating in fp32 into fp32 outputs.
#include <array>
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
memory::desc Matrix(int64_t batch, int64_t rows, int64_t cols, bool transposed, dt type = dt::f32) {
  const memory::dims strides = transposed ? memory::dims{rows * cols, 1, rows} : memory::dims{rows * cols, cols, 1};
  return memory::desc({batch, rows, cols}, type, strides);
}

class DnnlMatMul final : public MatMul {
 public:
  DnnlMatMul(const DnnlContext& ctx, const MatMulParams& p) : ctx_(ctx), p_(p), what_(Describe(p)) {}

  // With bf16 compute, a shape oneDNN has no bf16 matmul for is made in fp32 (the PrecisionLog says so).
  void Init() {
    BuildPreferringBf16(ctx_, ctx_.bf16, what_, [this](bool bf16) { Build(bf16); });
  }

  void Build(bool bf16) {
    bf16_ = bf16;
    const dnnl::engine& eng = ctx_.engine;
    const int64_t B = p_.batch, M = p_.m, N = p_.n, K = p_.k;
    const dnnl::primitive_attr attr = UserScratchpadAttr();
    const dt in = bf16 ? dt::bf16 : dt::f32;  // what the products read
    const bool ta = p_.trans_a, tb = p_.trans_b;
    if (bf16) {
      a16_.Init(eng, Matrix(B, M, K, ta), Matrix(B, M, K, ta, in));
      b16_.Init(eng, Matrix(B, K, N, tb), Matrix(B, K, N, tb, in));
      dy16_.Init(eng, Matrix(B, M, N, false), Matrix(B, M, N, false, in));
    }
    // Every product writes a plain row-major matrix: oneDNN's optimized matmuls do not write a transposed
    // destination (it would run on its reference kernel), so a gradient stored transposed is computed as the
    // transposed product instead.
    // Forward: y[M,N] = op(a)[M,K] op(b)[K,N].
    fwd_ = MakeProduct(Operand(kA, Matrix(B, M, K, ta, in)), Operand(kB, Matrix(B, K, N, tb, in)),
                       Matrix(B, M, N, false), attr);
    // da in a's layout: [M,K] = dy[M,N] op(b)^T[N,K]; stored [K,M] (trans_a): op(b)[K,N] dy^T[N,M].
    da_ = ta ? MakeProduct(Operand(kB, Matrix(B, K, N, tb, in)), Operand(kDy, Matrix(B, N, M, true, in)),
                           Matrix(B, K, M, false), attr)
             : MakeProduct(Operand(kDy, Matrix(B, M, N, false, in)), Operand(kB, Matrix(B, N, K, !tb, in)),
                           Matrix(B, M, K, false), attr);
    // db in b's layout: [K,N] = op(a)^T[K,M] dy[M,N]; stored [N,K] (trans_b): dy^T[N,M] op(a)[M,K].
    db_ = tb ? MakeProduct(Operand(kDy, Matrix(B, N, M, true, in)), Operand(kA, Matrix(B, M, K, ta, in)),
                           Matrix(B, N, K, false), attr)
             : MakeProduct(Operand(kA, Matrix(B, K, M, !ta, in)), Operand(kDy, Matrix(B, M, N, false, in)),
                           Matrix(B, K, N, false), attr);
    scratch_.Share(eng, {{&fwd_.pd, &fwd_.scratch}, {&da_.pd, &da_.scratch}, {&db_.pd, &db_.scratch}});
    fwd_.prim = dnnl::matmul(fwd_.pd);
    da_.prim = dnnl::matmul(da_.pd);
    db_.prim = dnnl::matmul(db_.pd);
    if (bf16) ctx_.precision->Bf16("matmul", {fwd_.pd.impl_info_str(), da_.pd.impl_info_str(), db_.pd.impl_info_str()});
  }

  absl::Status Forward(const float* a, const float* b, float* y) override {
    return RunDnnl(ctx_, what_, " forward", [&] {
      if (bf16_) {
        a16_.Stage(ctx_.stream, a);
        b16_.Stage(ctx_.stream, b);
        dy16_.Forget();
      }
      Execute(fwd_, {a, b, nullptr}, y);
    });
  }
  // bf16: a's and b's copies are the last Forward's (the header's contract).
  absl::Status BackwardA(const float* dy, const float* b, float* da) override {
    return RunDnnl(ctx_, what_, " backward (a)", [&] {
      if (bf16_) dy16_.StageShared(ctx_.stream, dy);
      Execute(da_, {nullptr, b, dy}, da);
    });
  }
  absl::Status BackwardB(const float* a, const float* dy, float* db) override {
    return RunDnnl(ctx_, what_, " backward (b)", [&] {
      if (bf16_) dy16_.StageShared(ctx_.stream, dy);
      Execute(db_, {a, nullptr, dy}, db);
    });
  }

 private:
  enum Which { kA, kB, kDy };
  // One input of a product: which tensor, and how the product reads it (a view of the caller's buffer in fp32,
  // set per call; of the op's bf16 copy in bf16).
  struct Input {
    Which which;
    memory mem;
  };
  struct Product {
    dnnl::matmul::primitive_desc pd;
    dnnl::matmul prim;
    Input src, wei;
    memory dst, scratch;
  };

  Input Operand(Which which, const memory::desc& md) {
    if (!bf16_) return {which, memory(md, ctx_.engine, DNNL_MEMORY_NONE)};
    const Bf16Operand& copy = which == kA ? a16_ : which == kB ? b16_ : dy16_;
    return {which, copy.View(ctx_.engine, md)};
  }

  Product MakeProduct(Input src, Input wei, const memory::desc& dst_md, const dnnl::primitive_attr& attr) {
    Product p;
    p.pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(src.mem.get_desc(), wei.mem.get_desc(), dst_md), attr,
                                        ctx_.engine);
    p.src = std::move(src);
    p.wei = std::move(wei);
    p.dst = memory(dst_md, ctx_.engine, DNNL_MEMORY_NONE);
    return p;
  }

  // `tensors`: the caller's a, b, dy (those the pass has).
  void Execute(Product& p, std::array<const float*, 3> tensors, float* out) {
    if (!bf16_) {
      p.src.mem.set_data_handle(Mutable(tensors[p.src.which]));
      p.wei.mem.set_data_handle(Mutable(tensors[p.wei.which]));
    }
    p.dst.set_data_handle(out);
    p.prim.execute(ctx_.stream, {{DNNL_ARG_SRC, p.src.mem},
                                 {DNNL_ARG_WEIGHTS, p.wei.mem},
                                 {DNNL_ARG_DST, p.dst},
                                 {DNNL_ARG_SCRATCHPAD, p.scratch}});
  }

  DnnlContext ctx_;
  MatMulParams p_;
  std::string what_;
  Product fwd_, da_, db_;
  bool bf16_ = false;
  Bf16Operand a16_, b16_, dy16_;
  SharedScratchpad scratch_;
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
