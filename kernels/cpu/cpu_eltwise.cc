// The activations oneDNN's eltwise primitive computes vectorized (exact GELU, SiLU): made per call (oneDNN's
// primitive cache keeps the compiled kernels, so a repeated shape costs a lookup), run on the device's threads.
#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_ops.h"

namespace dtrain::kernels::cpu {
namespace {

using dnnl::memory;

bool Algorithm(ActivationParams::Kind kind, dnnl::algorithm* alg, float* alpha) {
  switch (kind) {
    case ActivationParams::Kind::kGelu:
      *alg = dnnl::algorithm::eltwise_gelu_erf;
      *alpha = 0.0f;
      return true;
    case ActivationParams::Kind::kSilu:
      *alg = dnnl::algorithm::eltwise_swish;  // x sigmoid(alpha x)
      *alpha = 1.0f;
      return true;
    default:
      return false;
  }
}

}  // namespace

bool HasDnnlEltwise(ActivationParams::Kind kind) {
  dnnl::algorithm alg;
  float alpha;
  return Algorithm(kind, &alg, &alpha);
}

absl::Status DnnlEltwiseForward(const DnnlContext& ctx, const ActivationParams& p, const float* x, float* y,
                                int64_t n) {
  if (n == 0) return absl::OkStatus();
  dnnl::algorithm alg;
  float alpha;
  if (!Algorithm(p.kind, &alg, &alpha)) return absl::InternalError("DnnlEltwiseForward: not an eltwise kind");
  UseThreads(ctx.threads);
  try {
    const memory::desc md({n}, memory::data_type::f32, memory::format_tag::a);
    dnnl::eltwise_forward::primitive_desc pd(
        dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, alg, md, alpha, 0.0f), ctx.engine);
    dnnl::eltwise_forward(pd).execute(ctx.stream, {{DNNL_ARG_SRC, memory(md, ctx.engine, Mutable(x))},
                                                   {DNNL_ARG_DST, memory(md, ctx.engine, y)}});
  } catch (const dnnl::error& e) {
    return DnnlError(absl::StrCat("Activation ", ActivationName(p.kind), " of ", n), e);
  }
  return absl::OkStatus();
}

absl::Status DnnlEltwiseBackward(const DnnlContext& ctx, const ActivationParams& p, const float* x, const float* dy,
                                 float* dx, int64_t n) {
  if (n == 0) return absl::OkStatus();
  dnnl::algorithm alg;
  float alpha;
  if (!Algorithm(p.kind, &alg, &alpha)) return absl::InternalError("DnnlEltwiseBackward: not an eltwise kind");
  UseThreads(ctx.threads);
  try {
    const memory::desc md({n}, memory::data_type::f32, memory::format_tag::a);
    dnnl::eltwise_forward::primitive_desc fwd_pd(
        dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, alg, md, alpha, 0.0f), ctx.engine);
    dnnl::eltwise_backward::primitive_desc pd(dnnl::eltwise_backward::desc(alg, md, md, alpha, 0.0f), ctx.engine,
                                              fwd_pd);
    dnnl::eltwise_backward(pd).execute(ctx.stream, {{DNNL_ARG_SRC, memory(md, ctx.engine, Mutable(x))},
                                                    {DNNL_ARG_DIFF_DST, memory(md, ctx.engine, Mutable(dy))},
                                                    {DNNL_ARG_DIFF_SRC, memory(md, ctx.engine, dx)}});
  } catch (const dnnl::error& e) {
    return DnnlError(absl::StrCat("ActivationBackward ", ActivationName(p.kind), " of ", n), e);
  }
  return absl::OkStatus();
}

}  // namespace dtrain::kernels::cpu
