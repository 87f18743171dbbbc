// MaxPool, AvgPool and LRN on oneDNN, NHWC (and one loop for an average pooling oneDNN cannot express). Max
// pooling and LRN keep the forward's workspace (argmax / normalizers) for Backward.
#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/cpu_ops.h"

namespace dtrain::kernels::cpu {
namespace {

using dnnl::memory;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

// Max and average pooling on oneDNN's pooling primitive. oneDNN's pooling_max skips padded positions (they
// never win), which is TensorFlow's SAME semantics; pooling_avg_exclude_padding divides by the count of real
// inputs in the window, pooling_avg_include_padding by the whole window. The padding after the data is the
// effective one (explicit padding plus the ceil_mode overhang), so that oneDNN's output size is ours.
template <typename Base>
class DnnlPool final : public Base {
 public:
  DnnlPool(const DnnlContext& ctx, const PoolParams& p, dnnl::algorithm alg)
      : ctx_(ctx), p_(p), alg_(alg), what_(Describe(p)) {}

  void Init() {
    const dnnl::engine& eng = ctx_.engine;
    const memory::desc src_md({p_.batch, p_.channels, p_.in_h, p_.in_w}, dt::f32, tag::nhwc);
    const memory::desc dst_md({p_.batch, p_.channels, p_.out_h(), p_.out_w()}, dt::f32, tag::nhwc);
    const memory::dims strides = {p_.sh(), p_.sw()}, kernel = {p_.kh(), p_.kw()};
    const memory::dims pad_l = {p_.pads_h().before, p_.pads_w().before};
    const memory::dims pad_r = {p_.effective_pad_bottom(), p_.effective_pad_right()};
    const dnnl::primitive_attr attr = UserScratchpadAttr();

    dnnl::pooling_forward::primitive_desc fwd_pd(
        dnnl::pooling_forward::desc(dnnl::prop_kind::forward_training, alg_, src_md, dst_md, strides, kernel,
                                    pad_l, pad_r),
        attr, eng);
    dnnl::pooling_backward::primitive_desc bwd_pd(
        dnnl::pooling_backward::desc(alg_, src_md, dst_md, strides, kernel, pad_l, pad_r), attr, eng, fwd_pd);
    src_ = memory(src_md, eng, DNNL_MEMORY_NONE);
    dst_ = memory(dst_md, eng, DNNL_MEMORY_NONE);
    has_workspace_ = fwd_pd.workspace_desc().get_size() > 0;  // max pooling's argmax
    if (has_workspace_) workspace_ = memory(fwd_pd.workspace_desc(), eng);
    scratch_.Share(eng, {{&fwd_pd, &fwd_scratch_}, {&bwd_pd, &bwd_scratch_}});
    fwd_ = dnnl::pooling_forward(fwd_pd);
    bwd_ = dnnl::pooling_backward(bwd_pd);
  }

  absl::Status Forward(const float* x, float* y) override {
    return RunDnnl(ctx_, what_, " forward", [&] {
      src_.set_data_handle(Mutable(x));
      dst_.set_data_handle(y);
      std::unordered_map<int, memory> args = {
          {DNNL_ARG_SRC, src_}, {DNNL_ARG_DST, dst_}, {DNNL_ARG_SCRATCHPAD, fwd_scratch_}};
      if (has_workspace_) args[DNNL_ARG_WORKSPACE] = workspace_;
      fwd_.execute(ctx_.stream, args);
    });
  }

  absl::Status Backward(const float* dy, float* dx) override {
    return RunDnnl(ctx_, what_, " backward", [&] {
      dst_.set_data_handle(Mutable(dy));
      src_.set_data_handle(dx);
      std::unordered_map<int, memory> args = {
          {DNNL_ARG_DIFF_DST, dst_}, {DNNL_ARG_DIFF_SRC, src_}, {DNNL_ARG_SCRATCHPAD, bwd_scratch_}};
      if (has_workspace_) args[DNNL_ARG_WORKSPACE] = workspace_;
      bwd_.execute(ctx_.stream, args);
    });
  }

 private:
  DnnlContext ctx_;
  PoolParams p_;
  dnnl::algorithm alg_;
  std::string what_;
  dnnl::pooling_forward fwd_;
  dnnl::pooling_backward bwd_;
  memory src_, dst_, workspace_;  // src_/dst_ double as diff_src/diff_dst
  bool has_workspace_ = false;
  SharedScratchpad scratch_;
  memory fwd_scratch_, bwd_scratch_;
};

// Average pooling that counts the padding but not the ceil_mode overhang (PyTorch's count_include_pad with
// ceil_mode): the divisor of a window reaching into the overhang is the window clipped to the explicit
// padding, which oneDNN cannot express (include_padding divides by the whole window). Plain loops over NHWC,
// the channels innermost; images are split over the OpenMP threads.
class LoopAvgPool final : public AvgPool {
 public:
  LoopAvgPool(const DnnlContext& ctx, const PoolParams& p) : ctx_(ctx), p_(p) {
    const Pads ph = p.pads_h(), pw = p.pads_w();
    for (int oh = 0; oh < p.out_h(); ++oh) rows_.push_back(Window(oh * p.sh() - ph.before, p.kh(), p.in_h, ph.after));
    for (int ow = 0; ow < p.out_w(); ++ow) cols_.push_back(Window(ow * p.sw() - pw.before, p.kw(), p.in_w, pw.after));
  }

  absl::Status Forward(const float* x, float* y) override {
    UseThreads(ctx_.threads);
    const int C = p_.channels, oh_n = p_.out_h(), ow_n = p_.out_w();
#pragma omp parallel for num_threads(ctx_.threads) if (ctx_.threads > 1 && p_.batch > 1)
    for (int n = 0; n < p_.batch; ++n) {
      for (int oh = 0; oh < oh_n; ++oh)
        for (int ow = 0; ow < ow_n; ++ow) {
          const Span& r = rows_[oh];
          const Span& c = cols_[ow];
          float* __restrict out = y + ((int64_t{n} * oh_n + oh) * ow_n + ow) * C;
          std::fill(out, out + C, 0.0f);
          for (int ih = r.begin; ih < r.end; ++ih)
            for (int iw = c.begin; iw < c.end; ++iw) {
              const float* __restrict in = x + ((int64_t{n} * p_.in_h + ih) * p_.in_w + iw) * C;
              for (int k = 0; k < C; ++k) out[k] += in[k];
            }
          const float scale = 1.0f / static_cast<float>(r.divisor * c.divisor);
          for (int k = 0; k < C; ++k) out[k] *= scale;
        }
    }
    return absl::OkStatus();
  }

  absl::Status Backward(const float* dy, float* dx) override {
    UseThreads(ctx_.threads);
    const int C = p_.channels, oh_n = p_.out_h(), ow_n = p_.out_w();
    const int64_t image = int64_t{p_.in_h} * p_.in_w * C;
#pragma omp parallel for num_threads(ctx_.threads) if (ctx_.threads > 1 && p_.batch > 1)
    for (int n = 0; n < p_.batch; ++n) {
      std::fill(dx + n * image, dx + (n + 1) * image, 0.0f);
      for (int oh = 0; oh < oh_n; ++oh)
        for (int ow = 0; ow < ow_n; ++ow) {
          const Span& r = rows_[oh];
          const Span& c = cols_[ow];
          const float* __restrict g = dy + ((int64_t{n} * oh_n + oh) * ow_n + ow) * C;
          const float scale = 1.0f / static_cast<float>(r.divisor * c.divisor);
          for (int ih = r.begin; ih < r.end; ++ih)
            for (int iw = c.begin; iw < c.end; ++iw) {
              float* __restrict in = dx + ((int64_t{n} * p_.in_h + ih) * p_.in_w + iw) * C;
              for (int k = 0; k < C; ++k) in[k] += g[k] * scale;
            }
        }
    }
    return absl::OkStatus();
  }

 private:
  // One window along one dimension: its real inputs [begin, end) and its share of the divisor.
  struct Span {
    int begin, end, divisor;
  };
  static Span Window(int start, int k, int in, int pad_after) {
    return {std::max(start, 0), std::min(start + k, in), std::min(start + k, in + pad_after) - start};
  }

  DnnlContext ctx_;
  PoolParams p_;
  std::vector<Span> rows_, cols_;
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
    scratch_.Share(eng, {{&fwd_pd, &fwd_scratch_}, {&bwd_pd, &bwd_scratch_}});
    fwd_ = dnnl::lrn_forward(fwd_pd);
    bwd_ = dnnl::lrn_backward(bwd_pd);
  }

  absl::Status Forward(const float* x, float* y) override {
    return RunDnnl(ctx_, what_, " forward", [&] {
      x_.set_data_handle(Mutable(x));
      y_.set_data_handle(y);
      fwd_.execute(ctx_.stream, {{DNNL_ARG_SRC, x_},
                                 {DNNL_ARG_DST, y_},
                                 {DNNL_ARG_WORKSPACE, workspace_},
                                 {DNNL_ARG_SCRATCHPAD, fwd_scratch_}});
    });
  }

  // oneDNN's backward needs x, dy and the forward's workspace; y is implied by them.
  absl::Status Backward(const float* x, const float* y, const float* dy, float* dx) override {
    return RunDnnl(ctx_, what_, " backward", [&] {
      x_.set_data_handle(Mutable(x));
      y_.set_data_handle(Mutable(dy));
      dx_.set_data_handle(dx);
      bwd_.execute(ctx_.stream, {{DNNL_ARG_SRC, x_},
                                 {DNNL_ARG_DIFF_DST, y_},
                                 {DNNL_ARG_DIFF_SRC, dx_},
                                 {DNNL_ARG_WORKSPACE, workspace_},
                                 {DNNL_ARG_SCRATCHPAD, bwd_scratch_}});
    });
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
  std::string s = absl::StrCat("pool[batch=", p.batch, " in=", p.in_h, "x", p.in_w, "x", p.channels,
                               " window=", p.kh(), "x", p.kw(), " stride=", p.sh(), "x", p.sw());
  if (p.explicit_padding) {
    absl::StrAppend(&s, " pads=", p.pad_top, ",", p.pad_bottom, ",", p.pad_left, ",", p.pad_right,
                    p.ceil_mode ? " ceil_mode" : "");
  } else {
    absl::StrAppend(&s, p.padding == Padding::kSame ? " SAME" : " VALID");
  }
  if (p.count_include_pad) absl::StrAppend(&s, " count_include_pad");
  return s + "]";
}

namespace {

// What MaxPool and AvgPool require of their params (InvalidArgument naming `op` otherwise).
absl::Status CheckPoolParams(const char* op, const PoolParams& p) {
  if (p.batch <= 0 || p.in_h <= 0 || p.in_w <= 0 || p.channels <= 0 || p.kh() <= 0 || p.kw() <= 0 || p.sh() <= 0 ||
      p.sw() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": every size, window and stride must be positive: ", Describe(p)));
  }
  if (p.explicit_padding) {
    // Smaller pads than the window keep a real input in every window (PyTorch requires at most half of it).
    if (p.pad_top < 0 || p.pad_bottom < 0 || p.pad_left < 0 || p.pad_right < 0 || p.pad_top >= p.kh() ||
        p.pad_bottom >= p.kh() || p.pad_left >= p.kw() || p.pad_right >= p.kw()) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": explicit pads must be in [0, window) on each side: ", Describe(p)));
    }
  }
  if (p.out_h() <= 0 || p.out_w() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": the window is larger than the padded input: ", Describe(p)));
  }
  return absl::OkStatus();
}

template <typename Op>
absl::StatusOr<std::unique_ptr<Op>> InitPool(const char* op_name, std::unique_ptr<Op> op, const PoolParams& p) {
  try {
    op->Init();
  } catch (const dnnl::error& e) {
    return DnnlError(absl::StrCat(op_name, " ", Describe(p)), e);
  }
  return op;
}

}  // namespace

std::string Describe(const LrnParams& p) {
  return absl::StrCat("lrn[batch=", p.batch, " in=", p.h, "x", p.w, "x", p.channels,
                      " depth_radius=", p.depth_radius, " bias=", p.bias, " alpha=", p.alpha,
                      " beta=", p.beta, "]");
}

absl::StatusOr<std::unique_ptr<MaxPool>> MakeCpuMaxPool(const DnnlContext& ctx, const PoolParams& p) {
  if (absl::Status s = CheckPoolParams("MakeMaxPool", p); !s.ok()) return s;
  UseThreads(ctx.threads);
  auto op = std::make_unique<DnnlPool<MaxPool>>(ctx, p, dnnl::algorithm::pooling_max);
  ASSIGN_OR_RETURN(auto made, InitPool("MakeMaxPool", std::move(op), p));
  return std::unique_ptr<MaxPool>(std::move(made));
}

absl::StatusOr<std::unique_ptr<AvgPool>> MakeCpuAvgPool(const DnnlContext& ctx, const PoolParams& p) {
  if (absl::Status s = CheckPoolParams("MakeAvgPool", p); !s.ok()) return s;
  UseThreads(ctx.threads);
  const bool overhang = p.effective_pad_bottom() > p.pads_h().after || p.effective_pad_right() > p.pads_w().after;
  if (p.count_include_pad && overhang) return std::unique_ptr<AvgPool>(std::make_unique<LoopAvgPool>(ctx, p));
  auto op = std::make_unique<DnnlPool<AvgPool>>(ctx, p,
                                                p.count_include_pad ? dnnl::algorithm::pooling_avg_include_padding
                                                                    : dnnl::algorithm::pooling_avg_exclude_padding);
  ASSIGN_OR_RETURN(auto made, InitPool("MakeAvgPool", std::move(op), p));
  return std::unique_ptr<AvgPool>(std::move(made));
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
  return MakeDnnlOp<DnnlLrn>(ctx, absl::StrCat("MakeLrn ", Describe(p)), ctx, p);
}

}  // namespace dtrain::kernels::cpu
