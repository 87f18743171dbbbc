// Conv2D on oneDNN: NHWC activations, the primitive's preferred (blocked) weights layout, explicit (possibly
// asymmetric) padding: TensorFlow's SAME puts the extra padded row/column after. Dilations (oneDNN counts
// d - 1), groups (oneDNN's 5-D grouped weights [g, out_c/g, in_c/g, kh, kw], depthwise included) and both
// filter layouts are described to oneDNN by strides over the caller's buffer, so nothing is copied for them.
// With bf16 compute (DnnlContext::bf16) x, dy and the filter are rounded into private bf16 copies (x's is kept
// from Forward for BackwardWeights, dy's from BackwardWeights for BackwardData, the filter's from Forward for
// BackwardData), the primitives accumulate in fp32 and write y, dx, dw and db in fp32 straight into the
// caller's buffers. oneDNN has no bf16 Winograd, and on CPUs whose bf16 products run at twice fp32's rate (AVX-512
// BF16 without AMX) fp32 Winograd F(4x4, 3x3) can be as fast: a 3x3 convolution that has both times each pass
// (forward, backward-data, backward-weights) on each when it is made and runs every pass on the faster one
// (RoutedConv2D; the Device's PrecisionLog lists the passes that stayed fp32).
#include <algorithm>
#include <chrono>
#include <cstdlib>
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

// The caller's filter (HWIO or OIHW) as oneDNN's logical weights: {out_c, in_c, kh, kw} without groups,
// {groups, out_c/groups, in_c/groups, kh, kw} with them.
memory::desc UserWeightsDesc(const Conv2DParams& p, dt type = dt::f32) {
  const memory::dim G = p.groups, O = p.out_c, I = p.in_c / p.groups, KH = p.k_h, KW = p.k_w;
  const bool oihw = p.weight_layout == WeightLayout::kOIHW;
  if (G == 1) return memory::desc({O, I, KH, KW}, type, oihw ? tag::oihw : tag::hwio);
  const memory::dim Og = O / G;
  // Strides of (g, o, i, h, w); output channel g * Og + o in both layouts.
  const memory::dims strides = oihw ? memory::dims{Og * I * KH * KW, I * KH * KW, KH * KW, KW, 1}
                                    : memory::dims{Og, 1, O, KW * I * O, I * O};
  return memory::desc({G, Og, I, KH, KW}, type, strides);
}

// The passes of a convolution, as a bit set.
enum ConvPass { kForward = 1, kBackwardData = 2, kBackwardWeights = 4, kAllPasses = 7 };

// True when Winograd is worth trying for the shape (3x3, stride 1, many channels) and not turned off.
bool WinogradCandidate(const Conv2DParams& p) {
  const char* wino_env = std::getenv("DTRAIN_CONV_WINOGRAD");
  return p.k_h == 3 && p.k_w == 3 && p.stride_h == 1 && p.stride_w == 1 && p.in_c >= 16 && p.out_c >= 16 &&
         p.groups == 1 && p.dilation_h == 1 && p.dilation_w == 1 &&
         !(wino_env != nullptr && std::string(wino_env) == "0");
}

class DnnlConv2D final : public Conv2D {
 public:
  // `bf16`: the context's compute dtype, or false for the fp32 half of a RoutedConv2D.
  DnnlConv2D(const DnnlContext& ctx, const Conv2DParams& p, bool bf16)
      : ctx_(ctx), p_(p), what_(Describe(p)), want_bf16_(bf16) {}

  // Runs only `passes` from now on (RoutedConv2D): without kForward, the backward passes round or reorder x and
  // the filter themselves instead of reusing the copies a Forward of this op would have made.
  // Forgets a dy rounded by an earlier call (the timing runs' buffers are gone).
  void ServeOnly(int passes) {
    passes_ = passes;
    cached_dy_ = nullptr;
  }
  bool winograd() const { return blocked_; }

  // Builds everything; dnnl::error escapes to MakeCpuConv2D. With bf16 compute, a shape oneDNN has no bf16
  // primitive for is made in fp32 (the Device's PrecisionLog says so).
  void Init() {
    BuildPreferringBf16(ctx_, want_bf16_, what_, [this](bool bf16) { Build(bf16); });
  }

  void Build(bool bf16) {
    bf16_ = bf16;
    blocked_ = false;
    const dnnl::engine& eng = ctx_.engine;
    const memory::dims src_dims = {p_.batch, p_.in_c, p_.in_h, p_.in_w};
    const memory::dims dst_dims = {p_.batch, p_.out_c, p_.out_h(), p_.out_w()};
    const memory::dims strides = {p_.stride_h, p_.stride_w};
    const memory::dims dilates = {p_.dilation_h - 1, p_.dilation_w - 1};
    const Pads ph = p_.pads_h(), pw = p_.pads_w();
    const memory::dims pad_l = {ph.before, pw.before};
    const memory::dims pad_r = {ph.after, pw.after};

    const memory::desc src_md(src_dims, dt::f32, tag::nhwc);
    const memory::desc dst_md(dst_dims, dt::f32, tag::nhwc);
    const memory::desc user_w_md = UserWeightsDesc(p_);
    // bf16: the primitives read bf16 x, dy and filter (in the layouts they prefer for the filter) and write fp32.
    const dt in_type = bf16 ? dt::bf16 : dt::f32;
    const memory::desc any_w_md(user_w_md.dims(), in_type, tag::any);
    const memory::desc src_in_md(src_dims, in_type, tag::nhwc), dst_in_md(dst_dims, in_type, tag::nhwc);
    // A zero descriptor is oneDNN's "no bias" (no BIAS / DIFF_BIAS argument either).
    const memory::desc bias_md = p_.has_bias ? memory::desc({p_.out_c}, dt::f32, tag::x) : memory::desc();
    const dnnl::primitive_attr attr = UserScratchpadAttr();

    struct Pds {
      dnnl::convolution_forward::primitive_desc fwd;
      dnnl::convolution_backward_data::primitive_desc bwd_data;
      dnnl::convolution_backward_weights::primitive_desc bwd_w;
    };
    // s_md/d_md: x and y (dx and dy the same) in fp32; bf16 replaces what the primitives read (x, dy) with
    // src_in_md/dst_in_md and asks for fp32 diff weights in any layout.
    auto make = [&](dnnl::algorithm alg, const memory::desc& s_md, const memory::desc& d_md) {
      const memory::desc& x_md = bf16 ? src_in_md : s_md;
      const memory::desc& dy_md = bf16 ? dst_in_md : d_md;
      const memory::desc dw_md = bf16 ? memory::desc(user_w_md.dims(), dt::f32, tag::any) : any_w_md;
      Pds pds;
      pds.fwd = dnnl::convolution_forward::primitive_desc(
          dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, x_md, any_w_md, bias_md, d_md,
                                          strides, dilates, pad_l, pad_r),
          attr, eng);
      pds.bwd_data = dnnl::convolution_backward_data::primitive_desc(
          dnnl::convolution_backward_data::desc(alg, s_md, any_w_md, dy_md, strides, dilates, pad_l, pad_r), attr,
          eng, pds.fwd);
      pds.bwd_w = dnnl::convolution_backward_weights::primitive_desc(
          dnnl::convolution_backward_weights::desc(alg, x_md, dw_md, bias_md, dy_md, strides, dilates, pad_l, pad_r),
          attr, eng, pds.fwd);
      return pds;
    };
    // 3x3 stride-1 convolutions with many channels run 2-4x faster as Winograd F(4x4, 3x3) (oneDNN's
    // jit_wino_4x3), which needs blocked activations: then x/y/dy/dx are reordered between the caller's NHWC and
    // the blocked layout around each call (a few percent of the convolution's time). Everything else is direct
    // on NHWC. DTRAIN_CONV_WINOGRAD=0 turns Winograd off.
    Pds pds;
    if (!bf16 && WinogradCandidate(p_)) {
      try {
        pds = make(dnnl::algorithm::convolution_winograd, memory::desc(src_dims, dt::f32, tag::any),
                   memory::desc(dst_dims, dt::f32, tag::any));
        blocked_ = true;
      } catch (const dnnl::error&) {
        blocked_ = false;  // no Winograd implementation for this shape: direct below
      }
    }
    if (!blocked_) pds = make(dnnl::algorithm::convolution_direct, src_md, dst_md);
    const auto& fwd_pd = pds.fwd;
    const auto& bwd_data_pd = pds.bwd_data;
    const auto& bwd_w_pd = pds.bwd_w;
    impl_fwd_ = fwd_pd.impl_info_str();
    impl_bwd_data_ = bwd_data_pd.impl_info_str();
    impl_bwd_w_ = bwd_w_pd.impl_info_str();
    impls_ = absl::StrCat("fwd=", impl_fwd_, " bwd_data=", impl_bwd_data_, " bwd_weights=", impl_bwd_w_);

    // Plain-layout memories: handles are set per call.
    user_src_ = memory(src_md, eng, DNNL_MEMORY_NONE);
    user_dst_ = memory(dst_md, eng, DNNL_MEMORY_NONE);
    if (blocked_) {
      // A blocked layout of exactly one 16-channel block (nChw16c with 16 channels) is NHWC's bytes: such a
      // tensor is used in place (its handle set per call) instead of being reordered into a copy.
      auto nhwc_bytes = [](const memory::desc& md) {
        return md.dims()[1] == 16 && md == memory::desc(md.dims(), dt::f32, tag::nChw16c);
      };
      const bool src_in_place = nhwc_bytes(fwd_pd.src_desc()) && nhwc_bytes(bwd_data_pd.diff_src_desc());
      const bool dst_in_place = nhwc_bytes(fwd_pd.dst_desc()) && nhwc_bytes(bwd_w_pd.diff_dst_desc()) &&
                                bwd_data_pd.diff_dst_desc() == bwd_w_pd.diff_dst_desc();
      stage_x_ = stage_dx_ = !src_in_place;
      stage_y_ = stage_dy_ = !dst_in_place;
      if (src_in_place) {
        src_ = memory(fwd_pd.src_desc(), eng, DNNL_MEMORY_NONE);
        diff_src_ = memory(bwd_data_pd.diff_src_desc(), eng, DNNL_MEMORY_NONE);
      } else {
        src_ = memory(fwd_pd.src_desc(), eng);
        diff_src_ = memory(bwd_data_pd.diff_src_desc(), eng);
        to_src_ = dnnl::reorder(user_src_, src_);
        from_diff_src_ = dnnl::reorder(diff_src_, user_src_);
      }
      if (dst_in_place) {
        dst_ = memory(fwd_pd.dst_desc(), eng, DNNL_MEMORY_NONE);
        diff_dst_ = memory(bwd_w_pd.diff_dst_desc(), eng, DNNL_MEMORY_NONE);
      } else {
        dst_ = memory(fwd_pd.dst_desc(), eng);
        diff_dst_ = memory(bwd_w_pd.diff_dst_desc(), eng);
        from_dst_ = dnnl::reorder(dst_, user_dst_);
        to_diff_dst_ = dnnl::reorder(user_dst_, diff_dst_);
      }
    } else if (bf16) {
      // x and dy rounded into bf16 copies; y and dx written in place.
      stage_x_ = stage_dy_ = true;
      stage_y_ = stage_dx_ = false;
      src_ = memory(src_in_md, eng);
      to_src_ = dnnl::reorder(user_src_, src_);
      diff_dst_ = memory(dst_in_md, eng);
      to_diff_dst_ = dnnl::reorder(user_dst_, diff_dst_);
      dst_ = user_dst_;
      diff_src_ = user_src_;
    } else {
      stage_x_ = stage_dx_ = stage_y_ = stage_dy_ = false;
      src_ = user_src_;
      dst_ = user_dst_;
      diff_src_ = user_src_;
      diff_dst_ = user_dst_;
    }
    if (p_.has_bias) bias_ = memory(bias_md, eng, DNNL_MEMORY_NONE);
    user_w_ = memory(user_w_md, eng, DNNL_MEMORY_NONE);

    // Forward weights: a reordered copy unless the primitive takes HWIO as is. Backward-data weights: the
    // forward copy when the layouts agree (then it is kept from Forward to BackwardData, so it is this op's
    // own), else a second reorder. Copies needed only within one call live in the Device's transient arena.
    fwd_w_reorders_ = fwd_pd.weights_desc() != user_w_md;
    bwd_data_w_mode_ = bwd_data_pd.weights_desc() == fwd_pd.weights_desc() ? kShareForward
                       : bwd_data_pd.weights_desc() == user_w_md           ? kUser
                                                                           : kReorderFromUser;
    fwd_w_transient_ = fwd_w_reorders_ && bwd_data_w_mode_ != kShareForward;
    if (fwd_w_reorders_) {
      fwd_w_ = fwd_w_transient_ ? memory(fwd_pd.weights_desc(), eng, DNNL_MEMORY_NONE)
                                : memory(fwd_pd.weights_desc(), eng);
      if (fwd_w_transient_) ctx_.transient->Reserve(fwd_pd.weights_desc().get_size());
      fwd_w_reorder_ = dnnl::reorder(user_w_, fwd_w_);
    } else {
      fwd_w_ = memory(user_w_md, eng, DNNL_MEMORY_NONE);
    }
    if (bwd_data_w_mode_ == kReorderFromUser) {
      bwd_data_w_ = memory(bwd_data_pd.weights_desc(), eng, DNNL_MEMORY_NONE);
      ctx_.transient->Reserve(bwd_data_pd.weights_desc().get_size());
      bwd_data_w_reorder_ = dnnl::reorder(user_w_, bwd_data_w_);
    }
    // Backward-weights output: the primitive's layout (in the transient arena), reordered into the caller's.
    dw_reorders_ = bwd_w_pd.diff_weights_desc() != user_w_md;
    if (dw_reorders_) {
      dw_ = memory(bwd_w_pd.diff_weights_desc(), eng, DNNL_MEMORY_NONE);
      ctx_.transient->Reserve(bwd_w_pd.diff_weights_desc().get_size());
      dw_reorder_ = dnnl::reorder(dw_, user_w_);
    } else {
      dw_ = memory(user_w_md, eng, DNNL_MEMORY_NONE);
    }

    scratch_.Share(eng, {{&fwd_pd, &fwd_scratch_}, {&bwd_data_pd, &bwd_data_scratch_}, {&bwd_w_pd, &bwd_w_scratch_}});
    fwd_ = dnnl::convolution_forward(fwd_pd);
    bwd_data_ = dnnl::convolution_backward_data(bwd_data_pd);
    bwd_w_ = dnnl::convolution_backward_weights(bwd_w_pd);
  }

  absl::Status Forward(const float* x, const float* w, const float* b, float* y) override {
    return RunDnnl(ctx_, what_, " forward", [&] {
      if (fwd_w_reorders_) {
        user_w_.set_data_handle(Mutable(w));
        if (fwd_w_transient_) fwd_w_.set_data_handle(ctx_.transient->Data());
        fwd_w_reorder_.execute(ctx_.stream, user_w_, fwd_w_);
      } else {
        fwd_w_.set_data_handle(Mutable(w));
      }
      cached_dy_ = nullptr;
      if (stage_x_) {
        user_src_.set_data_handle(Mutable(x));
        to_src_.execute(ctx_.stream, user_src_, src_);  // kept for BackwardWeights (same x by contract)
      } else {
        src_.set_data_handle(Mutable(x));
      }
      if (!stage_y_) dst_.set_data_handle(y);
      std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, src_},
                                              {DNNL_ARG_WEIGHTS, fwd_w_},
                                              {DNNL_ARG_DST, dst_},
                                              {DNNL_ARG_SCRATCHPAD, fwd_scratch_}};
      if (p_.has_bias) {
        bias_.set_data_handle(Mutable(b));
        args[DNNL_ARG_BIAS] = bias_;
      }
      fwd_.execute(ctx_.stream, args);
      if (stage_y_) {
        user_dst_.set_data_handle(y);
        from_dst_.execute(ctx_.stream, dst_, user_dst_);
      }
    });
  }

  absl::Status BackwardData(const float* dy, const float* w, float* dx) override {
    return RunDnnl(ctx_, what_, " backward-data", [&] {
      memory* weights = &fwd_w_;
      switch (bwd_data_w_mode_) {
        case kShareForward:
          // The reordered copy made by the last Forward (the header's contract: same w), unless Forward runs
          // elsewhere.
          if (!fwd_w_reorders_) {
            fwd_w_.set_data_handle(Mutable(w));
          } else if (!(passes_ & kForward)) {
            user_w_.set_data_handle(Mutable(w));
            fwd_w_reorder_.execute(ctx_.stream, user_w_, fwd_w_);
          }
          break;
        case kUser:
          user_w_.set_data_handle(Mutable(w));
          weights = &user_w_;
          break;
        case kReorderFromUser:
          user_w_.set_data_handle(Mutable(w));
          bwd_data_w_.set_data_handle(ctx_.transient->Data());
          bwd_data_w_reorder_.execute(ctx_.stream, user_w_, bwd_data_w_);
          weights = &bwd_data_w_;
          break;
      }
      if (stage_dy_) {
        // BackwardWeights (called just before, with the same dy) may have reordered dy already.
        if (cached_dy_ != dy) {
          user_dst_.set_data_handle(Mutable(dy));
          to_diff_dst_.execute(ctx_.stream, user_dst_, diff_dst_);
        }
        cached_dy_ = nullptr;
      } else {
        diff_dst_.set_data_handle(Mutable(dy));
      }
      if (!stage_dx_) diff_src_.set_data_handle(dx);
      bwd_data_.execute(ctx_.stream, {{DNNL_ARG_DIFF_DST, diff_dst_},
                                      {DNNL_ARG_WEIGHTS, *weights},
                                      {DNNL_ARG_DIFF_SRC, diff_src_},
                                      {DNNL_ARG_SCRATCHPAD, bwd_data_scratch_}});
      if (stage_dx_) {
        user_src_.set_data_handle(dx);
        from_diff_src_.execute(ctx_.stream, diff_src_, user_src_);
      }
    });
  }

  absl::Status BackwardWeights(const float* x, const float* dy, float* dw, float* db) override {
    return RunDnnl(ctx_, what_, " backward-weights", [&] {
      // Staged, src_ still holds the reordered copy of the last Forward's x (the header's contract), unless
      // Forward runs elsewhere.
      if (!stage_x_) {
        src_.set_data_handle(Mutable(x));
      } else if (!(passes_ & kForward)) {
        user_src_.set_data_handle(Mutable(x));
        to_src_.execute(ctx_.stream, user_src_, src_);
      }
      if (stage_dy_) {
        user_dst_.set_data_handle(Mutable(dy));
        to_diff_dst_.execute(ctx_.stream, user_dst_, diff_dst_);
        cached_dy_ = dy;
      } else {
        diff_dst_.set_data_handle(Mutable(dy));
      }
      dw_.set_data_handle(dw_reorders_ ? ctx_.transient->Data() : dw);
      std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, src_},
                                              {DNNL_ARG_DIFF_DST, diff_dst_},
                                              {DNNL_ARG_DIFF_WEIGHTS, dw_},
                                              {DNNL_ARG_SCRATCHPAD, bwd_w_scratch_}};
      if (p_.has_bias) {
        bias_.set_data_handle(db);
        args[DNNL_ARG_DIFF_BIAS] = bias_;
      }
      bwd_w_.execute(ctx_.stream, args);
      if (dw_reorders_) {
        user_w_.set_data_handle(dw);
        dw_reorder_.execute(ctx_.stream, dw_, user_w_);
      }
    });
  }

  const std::string& impls() const { return impls_; }
  bool bf16() const { return bf16_; }
  std::string impl(int pass) const {
    return pass == kForward ? impl_fwd_ : pass == kBackwardData ? impl_bwd_data_ : impl_bwd_w_;
  }

 private:
  enum BwdDataWeights { kShareForward, kUser, kReorderFromUser };

  DnnlContext ctx_;
  Conv2DParams p_;
  std::string what_;
  std::string impls_, impl_fwd_, impl_bwd_data_, impl_bwd_w_;
  dnnl::convolution_forward fwd_;
  dnnl::convolution_backward_data bwd_data_;
  dnnl::convolution_backward_weights bwd_w_;
  // Direct: src_/dst_/diff_src_/diff_dst_ are the caller's NHWC buffers (handles set per call); bias_ doubles
  // as diff_bias (unused without has_bias). Winograd (blocked_): they are blocked buffers owned here, reordered from/to user_src_/user_dst_.
  memory src_, dst_, diff_src_, diff_dst_, bias_, user_w_, user_src_, user_dst_;
  bool want_bf16_ = false;
  int passes_ = kAllPasses;
  bool blocked_ = false;  // Winograd
  bool bf16_ = false;     // the primitives read bf16
  // Which of the caller's tensors go through an op-owned copy (Winograd's blocked layout unless it is NHWC's
  // bytes; bf16's x and dy) instead of being used in place.
  bool stage_x_ = false, stage_dx_ = false, stage_y_ = false, stage_dy_ = false;
  dnnl::reorder to_src_, from_dst_, to_diff_dst_, from_diff_src_;
  // dy reordered by BackwardWeights, reused by the BackwardData that follows (cleared by Forward and by use).
  const float* cached_dy_ = nullptr;
  memory fwd_w_, bwd_data_w_, dw_;
  // fwd_w_transient_: the forward copy lives in ctx_.transient (BackwardData does not reuse it).
  bool fwd_w_reorders_ = false, dw_reorders_ = false, fwd_w_transient_ = false;
  BwdDataWeights bwd_data_w_mode_ = kShareForward;
  dnnl::reorder fwd_w_reorder_, bwd_data_w_reorder_, dw_reorder_;
  SharedScratchpad scratch_;
  memory fwd_scratch_, bwd_data_scratch_, bwd_w_scratch_;
};

// bf16 compute of a convolution that also has fp32 Winograd: each pass on whichever runs it faster here.
class RoutedConv2D final : public Conv2D {
 public:
  RoutedConv2D(std::unique_ptr<DnnlConv2D> fp32, std::unique_ptr<DnnlConv2D> bf16, int bf16_passes)
      : fp32_(std::move(fp32)), bf16_(std::move(bf16)) {
    fp32_->ServeOnly(kAllPasses & ~bf16_passes);
    bf16_->ServeOnly(bf16_passes);
    fwd_ = bf16_passes & kForward ? bf16_.get() : fp32_.get();
    bwd_data_ = bf16_passes & kBackwardData ? bf16_.get() : fp32_.get();
    bwd_w_ = bf16_passes & kBackwardWeights ? bf16_.get() : fp32_.get();
  }
  absl::Status Forward(const float* x, const float* w, const float* b, float* y) override {
    return fwd_->Forward(x, w, b, y);
  }
  absl::Status BackwardData(const float* dy, const float* w, float* dx) override {
    return bwd_data_->BackwardData(dy, w, dx);
  }
  absl::Status BackwardWeights(const float* x, const float* dy, float* dw, float* db) override {
    return bwd_w_->BackwardWeights(x, dy, dw, db);
  }

 private:
  std::unique_ptr<DnnlConv2D> fp32_, bf16_;
  DnnlConv2D *fwd_, *bwd_data_, *bwd_w_;
};

// Seconds one pass of `op` takes (the best of two runs after a warm-up), with the staging it does when it
// runs that pass alone (ServeOnly). The buffers hold a small constant: the kernels' time does not depend on it.
double TimePass(DnnlConv2D& op, int pass, const Conv2DParams& p) {
  const int64_t x_n = static_cast<int64_t>(p.batch) * p.in_h * p.in_w * p.in_c;
  const int64_t y_n = static_cast<int64_t>(p.batch) * p.out_h() * p.out_w() * p.out_c;
  std::vector<float> x(x_n, 0.5f), y(y_n, 0.25f), w(p.weights_size(), 0.125f), b(p.out_c, 0.0f);
  op.ServeOnly(pass);
  double best = 1e30;
  for (int run = 0; run < 3; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status s = pass == kForward        ? op.Forward(x.data(), w.data(), b.data(), y.data())
                     : pass == kBackwardData ? op.BackwardData(y.data(), w.data(), x.data())
                                             : op.BackwardWeights(x.data(), y.data(), w.data(), b.data());
    if (!s.ok()) return 1e30;
    if (run > 0) best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  op.ServeOnly(kAllPasses);
  return best;
}

const char* PassName(int pass) {
  return pass == kForward ? "forward" : pass == kBackwardData ? "backward-data" : "backward-weights";
}

// bf16 compute: the bf16 op, or (a Winograd candidate) the passes split between bf16 and fp32 Winograd by
// timing, once per shape and Device. Records what it chose in the context's PrecisionLog.
absl::StatusOr<std::unique_ptr<Conv2D>> MakeBf16Conv2D(const DnnlContext& ctx, const Conv2DParams& p) {
  const std::string what = Describe(p);
  ASSIGN_OR_RETURN(std::unique_ptr<DnnlConv2D> bf16,
                   MakeDnnlOp<DnnlConv2D>(ctx, absl::StrCat("MakeConv2D ", what), ctx, p, true));
  const std::initializer_list<int> passes = {kForward, kBackwardData, kBackwardWeights};
  if (!bf16->bf16()) return std::unique_ptr<Conv2D>(std::move(bf16));  // fp32: the log says why
  std::unique_ptr<DnnlConv2D> fp32;
  if (WinogradCandidate(p)) {
    ASSIGN_OR_RETURN(fp32, MakeDnnlOp<DnnlConv2D>(ctx, absl::StrCat("MakeConv2D ", what), ctx, p, false));
    if (!fp32->winograd()) fp32.reset();
  }
  if (fp32 == nullptr) {
    ctx.precision->Bf16("conv2d", {bf16->impl(kForward), bf16->impl(kBackwardData), bf16->impl(kBackwardWeights)});
    return std::unique_ptr<Conv2D>(std::move(bf16));
  }
  // DTRAIN_CONV_BF16_PASSES pins the split (a bit set: 1 forward, 2 backward-data, 4 backward-weights).
  int bf16_passes = 0;
  const char* pinned = std::getenv("DTRAIN_CONV_BF16_PASSES");
  if (pinned != nullptr && *pinned != '\0') {
    bf16_passes = std::atoi(pinned) & kAllPasses;
  } else if (auto it = ctx.precision->conv_routes.find(what); it != ctx.precision->conv_routes.end()) {
    bf16_passes = it->second;
  } else {
    UseThreads(ctx.threads);
    for (int pass : passes) {
      if (TimePass(*bf16, pass, p) <= TimePass(*fp32, pass, p)) bf16_passes |= pass;
    }
    ctx.precision->conv_routes[what] = bf16_passes;
  }
  std::vector<std::string> impls;
  std::string fp32_passes;
  for (int pass : passes) {
    if (bf16_passes & pass) {
      impls.push_back(bf16->impl(pass));
    } else {
      absl::StrAppend(&fp32_passes, fp32_passes.empty() ? "" : ", ", PassName(pass));
    }
  }
  if (bf16_passes == kAllPasses) {
    ctx.precision->Bf16("conv2d", {impls[0], impls[1], impls[2]});
    return std::unique_ptr<Conv2D>(std::move(bf16));
  }
  ctx.precision->Winograd(what, fp32_passes, impls);
  if (bf16_passes == 0) return std::unique_ptr<Conv2D>(std::move(fp32));
  return std::unique_ptr<Conv2D>(new RoutedConv2D(std::move(fp32), std::move(bf16), bf16_passes));
}

}  // namespace

std::string Describe(const Conv2DParams& p) {
  std::string s = absl::StrCat("conv2d[batch=", p.batch, " in=", p.in_h, "x", p.in_w, "x", p.in_c, " out_c=", p.out_c,
                               " k=", p.k_h, "x", p.k_w, " stride=", p.stride_h, "x", p.stride_w);
  if (p.explicit_padding) {
    absl::StrAppend(&s, " pads=", p.pad_top, ",", p.pad_bottom, ",", p.pad_left, ",", p.pad_right);
  } else {
    absl::StrAppend(&s, p.padding == Padding::kSame ? " SAME" : " VALID");
  }
  if (p.dilation_h != 1 || p.dilation_w != 1) absl::StrAppend(&s, " dilation=", p.dilation_h, "x", p.dilation_w);
  if (p.groups != 1) absl::StrAppend(&s, " groups=", p.groups);
  if (p.weight_layout == WeightLayout::kOIHW) absl::StrAppend(&s, " OIHW");
  if (!p.has_bias) absl::StrAppend(&s, " no_bias");
  return s + "]";
}

absl::StatusOr<std::unique_ptr<Conv2D>> MakeCpuConv2D(const DnnlContext& ctx, const Conv2DParams& p) {
  if (p.batch <= 0 || p.in_h <= 0 || p.in_w <= 0 || p.in_c <= 0 || p.out_c <= 0 || p.k_h <= 0 || p.k_w <= 0 ||
      p.stride_h <= 0 || p.stride_w <= 0 || p.dilation_h <= 0 || p.dilation_w <= 0 || p.groups <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MakeConv2D: every size, stride, dilation and the groups must be positive: ", Describe(p)));
  }
  if (p.in_c % p.groups != 0 || p.out_c % p.groups != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MakeConv2D: in_c and out_c must be multiples of groups: ", Describe(p)));
  }
  if (p.explicit_padding && (p.pad_top < 0 || p.pad_bottom < 0 || p.pad_left < 0 || p.pad_right < 0)) {
    return absl::InvalidArgumentError(absl::StrCat("MakeConv2D: negative padding: ", Describe(p)));
  }
  if (p.out_h() <= 0 || p.out_w() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MakeConv2D: the (dilated) kernel is larger than the padded input: ", Describe(p)));
  }
  if (ctx.bf16) return MakeBf16Conv2D(ctx, p);
  ASSIGN_OR_RETURN(std::unique_ptr<DnnlConv2D> op,
                   MakeDnnlOp<DnnlConv2D>(ctx, absl::StrCat("MakeConv2D ", Describe(p)), ctx, p, false));
  return std::unique_ptr<Conv2D>(std::move(op));
}

}  // namespace dtrain::kernels::cpu
