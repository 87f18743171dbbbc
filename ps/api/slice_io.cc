#include "ps/api/slice_io.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "absl/strings/str_cat.h"

namespace dtrain::ps {
namespace {

uint16_t FloatToBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

float Bf16ToFloat(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &bits, 4);
  return x;
}

constexpr float kF16Max = 65504.0f;

float SaturateF16(float x) { return std::isfinite(x) ? std::clamp(x, -kF16Max, kF16Max) : x; }

// IEEE half from float, round to nearest even (portable path; F16C below when available).
uint16_t FloatToF16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 2^16: inf
  if (x < 0x38800000u) {                                             // below 2^-14: subnormal half or zero
    if (x < 0x33000000u) return static_cast<uint16_t>(sign);         // below half of the smallest subnormal
    const uint32_t mant = (x & 0x7fffffu) | 0x800000u;
    const int shift = 126 - static_cast<int>(x >> 23);               // 14..24
    const uint32_t r = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    return static_cast<uint16_t>(sign | (r + (rem > half || (rem == half && (r & 1u)))));
  }
  const uint32_t r = x + 0xfffu + ((x >> 13) & 1u) - 0x38000000u;  // rebias 127 -> 15 and round
  return static_cast<uint16_t>(sign | (r >> 13));
}

float F16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal half: normalize
    int e = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    bits = sign | (static_cast<uint32_t>(e) << 23) | ((mant & 0x3ffu) << 13);
  }
  float x;
  std::memcpy(&x, &bits, 4);
  return x;
}

}  // namespace

int DtypeBytes(WireDtype dtype) { return dtype == WireDtype::kF32 ? 4 : 2; }

absl::string_view DtypeName(WireDtype dtype) {
  switch (dtype) {
    case WireDtype::kF32:
      return "fp32";
    case WireDtype::kBF16:
      return "bf16";
    case WireDtype::kF16:
      return "fp16";
  }
  return "?";
}

absl::StatusOr<WireDtype> ParseWireDtype(absl::string_view name) {
  if (name == "fp32" || name == "f32" || name == "float32") return WireDtype::kF32;
  if (name == "bf16" || name == "bfloat16") return WireDtype::kBF16;
  if (name == "fp16" || name == "f16" || name == "float16") return WireDtype::kF16;
  return absl::InvalidArgumentError(absl::StrCat("--wire_dtype must be fp32, bf16 or fp16, got '", name, "'"));
}

void EncodeFloats(WireDtype dtype, const float* src, int64_t n, void* dst) {
  char* out = static_cast<char*>(dst);
  switch (dtype) {
    case WireDtype::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case WireDtype::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = FloatToBf16(src[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case WireDtype::kF16: {
      int64_t i = 0;
#if defined(__F16C__)
      for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(src + i);
        const __m256 limit = _mm256_set1_ps(kF16Max);
        const __m256 finite = _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), v),
                                            _mm256_set1_ps(INFINITY), _CMP_LT_OQ);
        const __m256 clamped = _mm256_max_ps(_mm256_min_ps(v, limit), _mm256_sub_ps(_mm256_setzero_ps(), limit));
        v = _mm256_blendv_ps(v, clamped, finite);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i),
                         _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      }
#endif
      for (; i < n; ++i) {
        const uint16_t h = FloatToF16(SaturateF16(src[i]));
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    }
  }
}

void DecodeFloats(WireDtype dtype, const void* src, int64_t n, float* dst) {
  const char* in = static_cast<const char*>(src);
  switch (dtype) {
    case WireDtype::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case WireDtype::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, in + 2 * i, 2);
        dst[i] = Bf16ToFloat(h);
      }
      return;
    case WireDtype::kF16: {
      int64_t i = 0;
#if defined(__F16C__)
      for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i))));
      }
#endif
      for (; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, in + 2 * i, 2);
        dst[i] = F16ToFloat(h);
      }
      return;
    }
  }
}

float RoundTrip(WireDtype dtype, float x) {
  switch (dtype) {
    case WireDtype::kF32:
      return x;
    case WireDtype::kBF16:
      return Bf16ToFloat(FloatToBf16(x));
    case WireDtype::kF16:
      return F16ToFloat(FloatToF16(SaturateF16(x)));
  }
  return x;
}

absl::Status WriteSlices(SliceUpload* upload, const float* flat, const std::vector<SliceSpec>& slices) {
  for (const SliceSpec& s : slices) {
    absl::Status status = upload->Write(s.key, 0, s.length, WireDtype::kF32, flat + s.flat_offset);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

FlatPullReceiver::FlatPullReceiver(const std::vector<SliceSpec>* slices, float* flat)
    : slices_(slices), flat_(flat), received_(slices->size(), 0) {
  for (size_t i = 0; i < slices->size(); ++i) {
    const uint32_t key = (*slices)[i].key;
    if (key >= index_of_key_.size()) index_of_key_.resize(key + 1, -1);
    index_of_key_[key] = static_cast<int>(i);
  }
}

absl::Status FlatPullReceiver::OnHeader(const PullHeader& header) {
  if (got_header_) return absl::DataLossError("pull: a second header");
  got_header_ = true;
  header_ = header;
  return absl::OkStatus();
}

absl::StatusOr<PullReceiver::Buffer> FlatPullReceiver::Destination(uint32_t key, int64_t offset, int64_t n) {
  const int i = key < index_of_key_.size() ? index_of_key_[key] : -1;
  if (!got_header_) return absl::DataLossError("pull: slice data before the header");
  if (i < 0) return absl::DataLossError(absl::StrCat("pull: slice key ", key, " was not expected from this task"));
  const SliceSpec& s = (*slices_)[i];
  if (offset != received_[i] || n < 0 || offset + n > s.length) {
    return absl::DataLossError(absl::StrCat("pull: slice key ", key, " ('", s.variable, "'): floats [", offset, ", ",
                                            offset + n, ") after ", received_[i], " of ", s.length));
  }
  return Buffer{flat_ + s.flat_offset + offset, WireDtype::kF32};
}

absl::Status FlatPullReceiver::Written(uint32_t key, int64_t offset, int64_t n) {
  received_[index_of_key_[key]] += n;
  bytes_ += n * static_cast<int64_t>(sizeof(float));
  return absl::OkStatus();
}

absl::Status FlatPullReceiver::Finish() const {
  if (!got_header_) return absl::DataLossError("pull: no header");
  for (size_t i = 0; i < slices_->size(); ++i) {
    if (received_[i] != (*slices_)[i].length) {
      return absl::DataLossError(absl::StrCat("pull: slice key ", (*slices_)[i].key, " ('", (*slices_)[i].variable,
                                              "') incomplete: ", received_[i], " of ", (*slices_)[i].length,
                                              " floats"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckPullRows(int64_t limit, int worker, int task, uint32_t table, int64_t n) {
  if (n >= 0 && n <= limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat("worker ", worker, "'s pull asks ps task ", task, " for ", n,
                                                   " rows of sparse table ", table, ", more than ", limit,
                                                   ": refused (--max_pull_rows)"));
}

}  // namespace dtrain::ps
