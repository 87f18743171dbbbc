// BatchNorm on oneDNN's batch_normalization primitive: the NHWC tensor viewed as [batch, channels, spatial, 1]
// in oneDNN's nhwc (the same bytes as [batch * spatial, channels]); scale and shift as separate arguments
// (oneDNN 2.6's use_scale / use_shift, not the older packed use_scaleshift). oneDNN's training forward writes
// the batch mean and the biased variance, as BatchNorm's contract wants.
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_ops.h"

namespace dtrain::kernels::cpu {
namespace {

using dnnl::memory;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;
using flags = dnnl::normalization_flags;

class DnnlBatchNorm final : public BatchNorm {
 public:
  DnnlBatchNorm(const DnnlContext& ctx, const BatchNormParams& p) : ctx_(ctx), p_(p), what_(Describe(p)) {}

  void Init() {
    const dnnl::engine& eng = ctx_.engine;
    const memory::desc md({p_.batch, p_.channels, p_.spatial, 1}, dt::f32, tag::nhwc);
    const memory::desc c_md({p_.channels}, dt::f32, tag::x);
    const dnnl::primitive_attr attr = UserScratchpadAttr();
    const flags ss = flags::use_scale | flags::use_shift;
    using fwd = dnnl::batch_normalization_forward;
    using bwd = dnnl::batch_normalization_backward;
    fwd::primitive_desc train_pd(fwd::desc(dnnl::prop_kind::forward_training, md, p_.epsilon, ss), attr, eng);
    fwd::primitive_desc infer_pd(
        fwd::desc(dnnl::prop_kind::forward_inference, md, p_.epsilon, ss | flags::use_global_stats), attr, eng);
    bwd::primitive_desc bwd_pd(bwd::desc(dnnl::prop_kind::backward, md, md, p_.epsilon, ss), attr, eng, train_pd);
    x_ = memory(md, eng, DNNL_MEMORY_NONE);
    y_ = memory(md, eng, DNNL_MEMORY_NONE);
    dx_ = memory(md, eng, DNNL_MEMORY_NONE);
    for (memory* m : {&scale_, &shift_, &mean_, &var_, &dscale_, &dshift_}) *m = memory(c_md, eng, DNNL_MEMORY_NONE);
    scratch_.Share(eng, {{&train_pd, &train_scratch_}, {&infer_pd, &infer_scratch_}, {&bwd_pd, &bwd_scratch_}});
    train_ = fwd(train_pd);
    infer_ = fwd(infer_pd);
    bwd_ = bwd(bwd_pd);
  }

  absl::Status ForwardTraining(const float* x, const float* scale, const float* bias, float* y, float* batch_mean,
                               float* batch_var) override {
    return RunDnnl(ctx_, what_, " forward-training", [&] {
      x_.set_data_handle(Mutable(x));
      y_.set_data_handle(y);
      scale_.set_data_handle(Mutable(scale));
      shift_.set_data_handle(Mutable(bias));
      mean_.set_data_handle(batch_mean);
      var_.set_data_handle(batch_var);
      train_.execute(ctx_.stream, {{DNNL_ARG_SRC, x_},
                                   {DNNL_ARG_DST, y_},
                                   {DNNL_ARG_SCALE, scale_},
                                   {DNNL_ARG_SHIFT, shift_},
                                   {DNNL_ARG_MEAN, mean_},
                                   {DNNL_ARG_VARIANCE, var_},
                                   {DNNL_ARG_SCRATCHPAD, train_scratch_}});
    });
  }

  absl::Status ForwardInference(const float* x, const float* scale, const float* bias, const float* mean,
                                const float* var, float* y) override {
    return RunDnnl(ctx_, what_, " forward-inference", [&] {
      x_.set_data_handle(Mutable(x));
      y_.set_data_handle(y);
      scale_.set_data_handle(Mutable(scale));
      shift_.set_data_handle(Mutable(bias));
      mean_.set_data_handle(Mutable(mean));
      var_.set_data_handle(Mutable(var));
      infer_.execute(ctx_.stream, {{DNNL_ARG_SRC, x_},
                                   {DNNL_ARG_DST, y_},
                                   {DNNL_ARG_SCALE, scale_},
                                   {DNNL_ARG_SHIFT, shift_},
                                   {DNNL_ARG_MEAN, mean_},
                                   {DNNL_ARG_VARIANCE, var_},
                                   {DNNL_ARG_SCRATCHPAD, infer_scratch_}});
    });
  }

  absl::Status Backward(const float* x, const float* dy, const float* scale, const float* batch_mean,
                        const float* batch_var, float* dx, float* dscale, float* dbias) override {
    return RunDnnl(ctx_, what_, " backward", [&] {
      x_.set_data_handle(Mutable(x));
      y_.set_data_handle(Mutable(dy));
      dx_.set_data_handle(dx);
      scale_.set_data_handle(Mutable(scale));
      // oneDNN 2.6 wants a SHIFT argument with use_shift although the gradients do not depend on it: any
      // channels floats do (it is not read); scale is at hand.
      shift_.set_data_handle(Mutable(scale));
      mean_.set_data_handle(Mutable(batch_mean));
      var_.set_data_handle(Mutable(batch_var));
      dscale_.set_data_handle(dscale);
      dshift_.set_data_handle(dbias);
      bwd_.execute(ctx_.stream, {{DNNL_ARG_SRC, x_},
                                 {DNNL_ARG_DIFF_DST, y_},
                                 {DNNL_ARG_SCALE, scale_},
                                 {DNNL_ARG_SHIFT, shift_},
                                 {DNNL_ARG_MEAN, mean_},
                                 {DNNL_ARG_VARIANCE, var_},
                                 {DNNL_ARG_DIFF_SRC, dx_},
                                 {DNNL_ARG_DIFF_SCALE, dscale_},
                                 {DNNL_ARG_DIFF_SHIFT, dshift_},
                                 {DNNL_ARG_SCRATCHPAD, bwd_scratch_}});
    });
  }

 private:
  DnnlContext ctx_;
  BatchNormParams p_;
  std::string what_;
  dnnl::batch_normalization_forward train_, infer_;
  dnnl::batch_normalization_backward bwd_;
  memory x_, y_, dx_, scale_, shift_, mean_, var_, dscale_, dshift_;  // y_ doubles as diff_dst
  SharedScratchpad scratch_;
  memory train_scratch_, infer_scratch_, bwd_scratch_;
};

}  // namespace

std::string Describe(const BatchNormParams& p) {
  return absl::StrCat("batchnorm[batch=", p.batch, " spatial=", p.spatial, " channels=", p.channels,
                      " epsilon=", p.epsilon, "]");
}

absl::StatusOr<std::unique_ptr<BatchNorm>> MakeCpuBatchNorm(const DnnlContext& ctx, const BatchNormParams& p) {
  if (p.batch <= 0 || p.spatial <= 0 || p.channels <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("MakeBatchNorm: every size must be positive: ", Describe(p)));
  }
  if (!(p.epsilon >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("MakeBatchNorm: epsilon must be >= 0: ", Describe(p)));
  }
  return MakeDnnlOp<DnnlBatchNorm>(ctx, absl::StrCat("MakeBatchNorm ", Describe(p)), ctx, p);
}

}  // namespace dtrain::kernels::cpu
