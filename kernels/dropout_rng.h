// The counter-based random function behind Device::Dropout, written so that every backend draws the same
// mask for the same (seed, counter). It is a pure function of its arguments (no state), so it is safe from
// any thread; the CUDA backend includes this header from device code (the functions are host+device when
// compiled by nvcc) to reproduce the CPU masks bit for bit.
//
// Definition (all arithmetic on uint64_t, wrapping):
//   Mix64(z)      = SplitMix64's finalizer: z ^= z >> 30; z *= 0xBF58476D1CE4E5B9;
//                                           z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31.
//   key           = Mix64(seed ^ Mix64(counter + 0x9E3779B97F4A7C15))
//   bits(i)       = Mix64(key + i * 0x9E3779B97F4A7C15) >> 40            (the top 24 bits)
//   u(i)          = bits(i) * 2^-24                                     (exact in fp32, in [0, 1))
//   kept(i)       = u(i) < keep_prob                                    (compared in fp32)
//   mask(i)       = kept(i) ? 1.0f / keep_prob : 0.0f                   (1.0f / keep_prob rounded once, fp32)
// Using 24 bits makes u exactly representable as a float, so the comparison has no rounding differences
// between backends.
//
// Device::DropoutDeviceCounter reads its counter from device memory when it runs:
//   counter       = uint64(*device_counter) * counter_stride + counter_offset        (wrapping)
// and then draws exactly the mask above, so it matches Dropout(..., counter) bit for bit.
#ifndef DTRAIN_KERNELS_DROPOUT_RNG_H_
#define DTRAIN_KERNELS_DROPOUT_RNG_H_

#include <cstdint>

#if defined(__CUDACC__)
#define DTRAIN_HOST_DEVICE __host__ __device__
#else
#define DTRAIN_HOST_DEVICE
#endif

namespace dtrain::kernels {

DTRAIN_HOST_DEVICE inline uint64_t DropoutMix64(uint64_t z) {
  z ^= z >> 30;
  z *= 0xBF58476D1CE4E5B9ull;
  z ^= z >> 27;
  z *= 0x94D049BB133111EBull;
  z ^= z >> 31;
  return z;
}

// The per-call key; compute once per Dropout call.
DTRAIN_HOST_DEVICE inline uint64_t DropoutKey(uint64_t seed, uint64_t counter) {
  return DropoutMix64(seed ^ DropoutMix64(counter + 0x9E3779B97F4A7C15ull));
}

// The counter of a DropoutDeviceCounter call whose device counter holds `value`.
DTRAIN_HOST_DEVICE inline uint64_t DropoutCounterFrom(int64_t value, uint64_t stride, uint64_t offset) {
  return static_cast<uint64_t>(value) * stride + offset;
}

// Uniform in [0, 1) for element i of the call keyed by `key`; a multiple of 2^-24.
DTRAIN_HOST_DEVICE inline float DropoutUniform(uint64_t key, uint64_t i) {
  const uint64_t bits = DropoutMix64(key + i * 0x9E3779B97F4A7C15ull) >> 40;
  return static_cast<float>(static_cast<uint32_t>(bits)) * (1.0f / 16777216.0f);
}

}  // namespace dtrain::kernels

#undef DTRAIN_HOST_DEVICE

#endif  // DTRAIN_KERNELS_DROPOUT_RNG_H_
