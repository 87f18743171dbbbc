// MaxPool and LRN on oneDNN, NHWC. Both keep the forward's workspace (argmax / normalizers) for Backward.
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_ops.h"

namespace dtrain::kernels::cpu {
namespace {

using dnnl::memory;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

// oneDNN's pooling_max skips padded positions (they never win), which is TensorFlow's SAME semantics; the
// pool test checks it on windows that overlap the padding.
class DnnlMaxPool final : public MaxPool {
 public:
  DnnlMaxPool(const DnnlContext& ctx, const PoolParams& p) : ctx_(ctx), p_(p), what_(Describe(p)) {}

  void Init() {
    const dnnl::engine& eng = ctx_.engine;
    const memory::desc src_md({p_.batch, p_.channels, p_.in_h, p_.in_w}, dt::f32, tag::nhwc);
    const memory::desc dst_md({p_.batch, p_.channels, p_.out_h(), p_.out_w()}, dt::f32, tag::nhwc);
    const int ph = PadBefore(p_.in_h, p_.window, p_.stride, p_.padding);
    const int pw = PadBefore(p_.in_w, p_.window, p_.stride, p_.padding);
    const int total_h = std::max(0, (p_.out_h() - 1) * p_.stride + p_.window - p_.in_h);
    const int total_w = std::max(0, (p_.out_w() - 1) * p_.stride + p_.window - p_.in_w);
    const memory::dims strides = {p_.stride, p_.stride}, kernel = {p_.window, p_.window};
    const memory::dims pad_l = {ph, pw}, pad_r = {total_h - ph, total_w - pw};
    const dnnl::primitive_attr attr = UserScratchpadAttr();

    dnnl::pooling_forward::primitive_desc fwd_pd(
        dnnl::pooling_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::pooling_max, src_md,
                                    dst_md, strides, kernel, pad_l, pad_r),
        attr, eng);
    dnnl::pooling_backward::primitive_desc bwd_pd(
        dnnl::pooling_backward::desc(dnnl::algorithm::pooling_max, src_md, dst_md, strides, kernel, pad_l,
                                     pad_r),
        attr, eng, fwd_pd);
    src_ = memory(src_md, eng, DNNL_MEMORY_NONE);
    dst_ = memory(dst_md, eng, DNNL_MEMORY_NONE);
    workspace_ = memory(fwd_pd.workspace_desc(), eng);
    scratch_.Reserve(fwd_pd);
    scratch_.Reserve(bwd_pd);
    scratch_.Allocate();
    fwd_scratch_ = scratch_.For(fwd_pd, eng);
    bwd_scratch_ = scratch_.For(bwd_pd, eng);
    fwd_ = dnnl::pooling_forward(fwd_pd);
    bwd_ = dnnl::pooling_backward(bwd_pd);
  }

  absl::Status Forward(const float* x, float* y) override {
    UseThreads(ctx_.threads);
    try {
      src_.set_data_handle(Mutable(x));
      dst_.set_data_handle(y);
      fwd_.execute(ctx_.stream, {{DNNL_ARG_SRC, src_},
                                 {DNNL_ARG_DST, dst_},
                                 {DNNL_ARG_WORKSPACE, workspace_},
                                 {DNNL_ARG_SCRATCHPAD, fwd_scratch_}});
    } catch (const dnnl::error& e) {
      return DnnlError(absl::StrCat(what_, " forward"), e);
    }
    return absl::OkStatus();
  }

  absl::Status Backward(const float* dy, float* dx) override {
    UseThreads(ctx_.threads);
    try {
      dst_.set_data_handle(Mutable(dy));
      src_.set_data_handle(dx);
      bwd_.execute(ctx_.stream, {{DNNL_ARG_DIFF_DST, dst_},
                                 {DNNL_ARG_DIFF_SRC, src_},
                                 {DNNL_ARG_WORKSPACE, workspace_},
                                 {DNNL_ARG_SCRATCHPAD, bwd_scratch_}});
    } catch (const dnnl::error& e) {
      return DnnlError(absl::StrCat(what_, " backward"), e);
    }
    return absl::OkStatus();
  }

 private:
  DnnlContext ctx_;
  PoolParams p_;
  std::string what_;
  dnnl::pooling_forward fwd_;
  dnnl::pooling_backward bwd_;
  memory src_, dst_, workspace_;  // src_/dst_ double as diff_src/diff_dst
  SharedScratchpad scratch_;
  memory fwd_scratch_, bwd_scratch_;
};

// Advances `pd` past implementations whose name contains "jit" (when another one is available).
template <typename Pd>
void SkipJitImpls(Pd& pd) {
  while (std::string(pd.impl_info_str()).find("jit") != std::string::npos && pd.next_impl()) {
  }
}

// TensorFlow's alpha multiplies the plain sum of squares; oneDNN's is divided by local_size, so oneDNN gets
// alpha * local_size.
class DnnlLrn final : public Lrn {
 public:
  DnnlLrn(const DnnlContext& ctx, const LrnParams& p) : ctx_(ctx), p_(p), what_(Describe(p)) {}

  void Init() {
    const dnnl::engine& eng = ctx_.engine;
    const memory::desc md({p_.batch, p_.channels, p_.h, p_.w}, dt::f32, tag::nhwc);
    const int size = 2 * p_.depth_radius + 1;
    const float alpha = p_.alpha * static_cast<float>(size);
    const dnnl::primitive_attr attr = UserScratchpadAttr();
    dnnl::lrn_forward::primitive_desc fwd_pd(
        dnnl::lrn_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::lrn_across_channels, md,
                                size, alpha, p_.beta, p_.bias),
        attr, eng);
    // oneDNN 2.6's lrn_jit:avx512_core backward crashes (SIGSEGV while generating code) for local_size 1;
    // take the reference implementation for that degenerate window (the pair must match for the workspace).
    if (size == 1) SkipJitImpls(fwd_pd);
    dnnl::lrn_backward::primitive_desc bwd_pd(
        dnnl::lrn_backward::desc(dnnl::algorithm::lrn_across_channels, md, md, size, alpha, p_.beta, p_.bias),
        attr, eng, fwd_pd);
    if (size == 1) SkipJitImpls(bwd_pd);
    x_ = memory(md, eng, DNNL_MEMORY_NONE);
    y_ = memory(md, eng, DNNL_MEMORY_NONE);
    dx_ = memory(md, eng, DNNL_MEMORY_NONE);
    workspace_ = memory(fwd_pd.workspace_desc(), eng);
    scratch_.Reserve(fwd_pd);
    scratch_.Reserve(bwd_pd);
    scratch_.Allocate();
    fwd_scratch_ = scratch_.For(fwd_pd, eng);
    bwd_scratch_ = scratch_.For(bwd_pd, eng);
    fwd_ = dnnl::lrn_forward(fwd_pd);
    bwd_ = dnnl::lrn_backward(bwd_pd);
  }

  absl::Status Forward(const float* x, float* y) override {
    UseThreads(ctx_.threads);
    try {
      x_.set_data_handle(Mutable(x));
      y_.set_data_handle(y);
      fwd_.execute(ctx_.stream, {{DNNL_ARG_SRC, x_},
                                 {DNNL_ARG_DST, y_},
                                 {DNNL_ARG_WORKSPACE, workspace_},
                                 {DNNL_ARG_SCRATCHPAD, fwd_scratch_}});
    } catch (const dnnl::error& e) {
      return DnnlError(absl::StrCat(what_, " forward"), e);
    }
    return absl::OkStatus();
  }

  // oneDNN's backward needs x, dy and the forward's workspace; y is implied by them.
  absl::Status Backward(const float* x, const float* y, const float* dy, float* dx) override {
    UseThreads(ctx_.threads);
    try {
      x_.set_data_handle(Mutable(x));
      y_.set_data_handle(Mutable(dy));
      dx_.set_data_handle(dx);
      bwd_.execute(ctx_.stream, {{DNNL_ARG_SRC, x_},
                                 {DNNL_ARG_DIFF_DST, y_},
                                 {DNNL_ARG_DIFF_SRC, dx_},
                                 {DNNL_ARG_WORKSPACE, workspace_},
                                 {DNNL_ARG_SCRATCHPAD, bwd_scratch_}});
    } catch (const dnnl::error& e) {
      return DnnlError(absl::StrCat(what_, " backward"), e);
    }
    return absl::OkStatus();
  }

 private:
  DnnlContext ctx_;
  LrnParams p_;
  std::string what_;
  dnnl::lrn_forward fwd_;
  dnnl::lrn_backward bwd_;
  memory x_, y_, dx_, workspace_;  // y_ doubles as diff_dst
  SharedScratchpad scratch_;
  memory fwd_scratch_, bwd_scratch_;
};

}  // namespace

std::string Describe(const PoolParams& p) {
  return absl::StrCat("maxpool[batch=", p.batch, " in=", p.in_h, "x", p.in_w, "x", p.channels,
                      " window=", p.window, " stride=", p.stride,
                      p.padding == Padding::kSame ? " SAME]" : " VALID]");
}

std::string Describe(const LrnParams& p) {
  return absl::StrCat("lrn[batch=", p.batch, " in=", p.h, "x", p.w, "x", p.channels,
                      " depth_radius=", p.depth_radius, " bias=", p.bias, " alpha=", p.alpha,
                      " beta=", p.beta, "]");
}

absl::StatusOr<std::unique_ptr<MaxPool>> MakeCpuMaxPool(const DnnlContext& ctx, const PoolParams& p) {
  if (p.batch <= 0 || p.in_h <= 0 || p.in_w <= 0 || p.channels <= 0 || p.window <= 0 || p.stride <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MakeMaxPool: every size and stride must be positive: ", Describe(p)));
  }
  if (p.out_h() <= 0 || p.out_w() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MakeMaxPool: the window is larger than the VALID-padded input: ", Describe(p)));
  }
  UseThreads(ctx.threads);
  auto op = std::make_unique<DnnlMaxPool>(ctx, p);
  try {
    op->Init();
  } catch (const dnnl::error& e) {
    return DnnlError(absl::StrCat("MakeMaxPool ", Describe(p)), e);
  }
  return op;
}

absl::StatusOr<std::unique_ptr<Lrn>> MakeCpuLrn(const DnnlContext& ctx, const LrnParams& p) {
  if (p.batch <= 0 || p.h <= 0 || p.w <= 0 || p.channels <= 0 || p.depth_radius < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MakeLrn: sizes must be positive and depth_radius >= 0: ", Describe(p)));
  }
  if (!(p.bias > 0) || !(p.alpha >= 0) || !(p.beta >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("MakeLrn: need bias > 0, alpha >= 0, beta >= 0: ", Describe(p)));
  }
  UseThreads(ctx.threads);
  auto op = std::make_unique<DnnlLrn>(ctx, p);
  try {
    op->Init();
  } catch (const dnnl::error& e) {
    return DnnlError(absl::StrCat("MakeLrn ", Describe(p)), e);
  }
  return op;
}

}  // namespace dtrain::kernels::cpu
