// Factories for the CPU backend's shape-specialized ops (internal to kernels/cpu; the public entry point is
// CreateCpuDevice in kernels/device.h). Each validates its params (InvalidArgument naming the bad field),
// builds its oneDNN primitives, memory objects and scratch once, and returns an op whose calls only set data
// handles and execute. The ops are thread-compatible: one thread (the Device's owner) at a time.
#ifndef DTRAIN_KERNELS_CPU_CPU_OPS_H_
#define DTRAIN_KERNELS_CPU_CPU_OPS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/cpu/dnnl_util.h"
#include "kernels/device.h"

namespace dtrain::kernels::cpu {

absl::StatusOr<std::unique_ptr<Conv2D>> MakeCpuConv2D(const DnnlContext& ctx, const Conv2DParams& p);
absl::StatusOr<std::unique_ptr<MaxPool>> MakeCpuMaxPool(const DnnlContext& ctx, const PoolParams& p);
absl::StatusOr<std::unique_ptr<AvgPool>> MakeCpuAvgPool(const DnnlContext& ctx, const PoolParams& p);
absl::StatusOr<std::unique_ptr<Lrn>> MakeCpuLrn(const DnnlContext& ctx, const LrnParams& p);
absl::StatusOr<std::unique_ptr<Dense>> MakeCpuDense(const DnnlContext& ctx, const DenseParams& p);
// cpu_batchnorm.cc.
absl::StatusOr<std::unique_ptr<BatchNorm>> MakeCpuBatchNorm(const DnnlContext& ctx, const BatchNormParams& p);
// cpu_binary.cc (loops).
absl::StatusOr<std::unique_ptr<Binary>> MakeCpuBinary(const DnnlContext& ctx, const BroadcastParams& p);
// cpu_tensor_ops.cc (oneDNN matmul, softmax_v2 and layer_normalization; Reduce on tensor_loops.h).
absl::StatusOr<std::unique_ptr<MatMul>> MakeCpuMatMul(const DnnlContext& ctx, const MatMulParams& p);
absl::StatusOr<std::unique_ptr<Softmax>> MakeCpuSoftmax(const DnnlContext& ctx, const SoftmaxParams& p);
absl::StatusOr<std::unique_ptr<LayerNorm>> MakeCpuLayerNorm(const DnnlContext& ctx, const LayerNormParams& p);
absl::StatusOr<std::unique_ptr<Reduce>> MakeCpuReduce(const DnnlContext& ctx, const ReduceParams& p);
// cpu_eltwise.cc: the activations oneDNN's eltwise primitive computes (GELU, SiLU), for CpuDevice::Activation.
bool HasDnnlEltwise(ActivationParams::Kind kind);
absl::Status DnnlEltwiseForward(const DnnlContext& ctx, const ActivationParams& p, const float* x, float* y,
                                int64_t n);
absl::Status DnnlEltwiseBackward(const DnnlContext& ctx, const ActivationParams& p, const float* x, const float* dy,
                                 float* dx, int64_t n);
// cpu_optimizer.cc. `step` is a counter of the calling CpuDevice (checked there); `threads` as the device's.
absl::StatusOr<std::unique_ptr<DeviceOptimizer>> MakeCpuOptimizer(const OptimizerParams& p,
                                                                  const DeviceCounter* step, int threads);

// "conv2d[batch=50 in=28x28x1 out_c=32 k=5x5 stride=1x1 SAME]"-style descriptions for error messages.
std::string Describe(const Conv2DParams& p);
std::string Describe(const PoolParams& p);
std::string Describe(const LrnParams& p);
std::string Describe(const DenseParams& p);
std::string Describe(const BatchNormParams& p);
std::string Describe(const BroadcastParams& p);

}  // namespace dtrain::kernels::cpu

#endif  // DTRAIN_KERNELS_CPU_CPU_OPS_H_
