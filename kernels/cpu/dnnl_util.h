// Small helpers shared by the oneDNN-backed CPU ops (internal to kernels/cpu).
#ifndef DTRAIN_KERNELS_CPU_DNNL_UTIL_H_
#define DTRAIN_KERNELS_CPU_DNNL_UTIL_H_

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/denormals.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace dtrain::kernels::cpu {

// 64-byte aligned heap memory, freed on destruction.
struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<uint8_t, AlignedFree>;

inline AlignedBuffer AllocAligned(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  return AlignedBuffer(static_cast<uint8_t*>(std::aligned_alloc(64, rounded)));
}

// Memory an op needs only for the length of one call (today: a convolution's weights reordered into the
// layout its primitive wants, forward, backward-data, or the backward-weights output before it is reordered
// into the caller's layout), shared by every op of one Device. The CPU backend runs its ops one at a time on
// the calling thread, so one buffer as large as the largest need serves them all: a conv net's weights were
// otherwise held three more times (ResNet-sized nets: 3 x the parameters; regnet_y_128gf: 7.6 GB). Ops
// Reserve their need when they are made and take the buffer with Data() in each call, which grows it when an
// op made since needs more (ops are made as a graph first runs; the CPU backend captures no graphs, so a later
// allocation is allowed). Nothing survives from one call to the next. Thread-compatible: the Device's thread.
class TransientArena {
 public:
  void Reserve(size_t bytes) { want_ = std::max(want_, bytes); }
  void* Data() {
    if (have_ < want_) {
      buffer_.reset();  // the old buffer first: never both at once
      buffer_ = AllocAligned(want_);
      have_ = want_;
    }
    return buffer_.get();
  }
  size_t bytes() const { return want_; }

 private:
  size_t want_ = 0, have_ = 0;
  AlignedBuffer buffer_;
};

// What the matrix-product ops of one bf16 Device were made to compute in, for Device::PrecisionReport: the ops in
// bf16 with oneDNN's implementation names, and those that fell back to fp32 with the reason. Thread-compatible:
// the Device's thread.
class PrecisionLog {
 public:
  // `kind` names the op ("conv2d", "dense", "matmul"); `impls` are oneDNN's implementation names of its
  // primitives (impl_info_str), `why` the reason it is fp32 (oneDNN's error for the bf16 primitive).
  void Bf16(const std::string& kind, std::initializer_list<std::string> impls) {
    ++bf16_[kind];
    for (const std::string& i : impls) impls_.insert(i);
  }
  void Fp32(const std::string& what, const std::string& why) { fp32_.push_back(absl::StrCat(what, " (", why, ")")); }
  // A convolution whose `fp32_passes` ("forward, backward-weights") run on fp32 Winograd because they timed
  // faster than bf16 here; its other passes run in bf16 on `impls`.
  void Winograd(const std::string& what, const std::string& fp32_passes, const std::vector<std::string>& impls) {
    winograd_.push_back(absl::StrCat(what, " ", fp32_passes));
    for (const std::string& i : impls) impls_.insert(i);
  }
  // "compute bf16 ... on oneDNN's avx512_core_bf16: bf16 2 conv2d, 2 dense [brg:avx512_core_bf16, ...]; fp32
  // Winograd where it timed faster: ...; fp32 fallback: none; ...".
  std::string Report() const;

  // The passes (kernels/cpu/cpu_conv.cc's bit set) each convolution shape runs in bf16, timed once per Device.
  std::map<std::string, int> conv_routes;

 private:
  std::map<std::string, int> bf16_;
  std::set<std::string> impls_;
  std::vector<std::string> fp32_, winograd_;
};

// oneDNN's name for the instruction set its kernels use on this CPU ("avx512_core_bf16", "avx512_core_amx",
// "avx2", ...), as ONEDNN_VERBOSE prints it.
std::string EffectiveCpuIsa();

// What every op of one CPU Device shares: the oneDNN engine, its (in-order, synchronous on the CPU) stream,
// the OpenMP thread count and the compute dtype of matrix products. The handles are reference-counted, so ops
// may keep copies. Thread-compatible: used by the one thread that owns the Device.
struct DnnlContext {
  dnnl::engine engine;
  dnnl::stream stream;
  int threads = 1;
  // Convolutions, Dense and MatMul compute in bf16 (kernels/device.h, ComputeDtype) and record in `precision`
  // whether they could.
  bool bf16 = false;
  // One per Device (copies of the context share it).
  std::shared_ptr<TransientArena> transient = std::make_shared<TransientArena>();
  std::shared_ptr<PrecisionLog> precision = std::make_shared<PrecisionLog>();
};

// A private bf16 copy of an fp32 operand in the same logical layout (bf16 compute): Stage rounds the caller's
// buffer into it (a oneDNN reorder: round to nearest even), and View describes the copy's bytes differently
// (a transposed read of the same matrix). Thread-compatible.
class Bf16Operand {
 public:
  // `f32` describes the caller's buffer, `bf16` the copy (the same dims; the layout may differ).
  void Init(const dnnl::engine& engine, const dnnl::memory::desc& f32, const dnnl::memory::desc& bf16) {
    user_ = dnnl::memory(f32, engine, DNNL_MEMORY_NONE);
    copy_ = dnnl::memory(bf16, engine);
    reorder_ = dnnl::reorder(user_, copy_);
  }
  void Stage(const dnnl::stream& stream, const float* p) {
    user_.set_data_handle(const_cast<float*>(p));
    reorder_.execute(stream, user_, copy_);
  }
  // For an operand two calls share (dy, read by both backward products): rounds unless the other call just did,
  // then the copy is used and forgotten, so that a later call with new values behind the same pointer rounds
  // them again. Forget() (Forward) starts over.
  void StageShared(const dnnl::stream& stream, const float* p) {
    if (shared_ == p) {
      shared_ = nullptr;
      return;
    }
    Stage(stream, p);
    shared_ = p;
  }
  void Forget() { shared_ = nullptr; }
  dnnl::memory& memory() { return copy_; }
  // The copy's bytes under another descriptor (of no more bytes).
  dnnl::memory View(const dnnl::engine& engine, const dnnl::memory::desc& md) const {
    return dnnl::memory(md, engine, copy_.get_data_handle());
  }

 private:
  dnnl::memory user_, copy_;
  dnnl::reorder reorder_;
  const float* shared_ = nullptr;
};

// An op's Init with bf16 compute: build(true) makes its primitives reading bf16; when oneDNN has none for the
// shape (dnnl::error), build(false) makes them in fp32 and the context's PrecisionLog names `what` with oneDNN's
// reason. Without bf16 compute, build(false).
template <typename Build>
void BuildPreferringBf16(const DnnlContext& ctx, bool bf16, const std::string& what, Build&& build) {
  if (bf16) {
    try {
      build(true);
      return;
    } catch (const dnnl::error& e) {
      ctx.precision->Fp32(what, e.what());
    }
  }
  build(false);
}

// Flush-to-zero and denormals-are-zero on the calling thread and on the OpenMP threads it runs ops with (its
// own pool: libgomp keeps one per thread that starts parallel regions), once per thread and thread count.
// See common/denormals.h for why.
inline void FlushDenormalsOnThreads(int threads) {
  thread_local int flushed_threads = 0;
  if (threads <= flushed_threads) return;
  SetFlushDenormals();
#pragma omp parallel num_threads(threads)
  SetFlushDenormals();
  flushed_threads = threads;
}

// OpenMP's thread count is a per-thread setting (an ICV of the calling thread), and oneDNN's OpenMP runtime
// reads it when it creates and when it executes a primitive. Every op calls this before doing work so that
// two towers in two std::threads each run with their own count (and their threads flush denormals).
inline void UseThreads(int threads) {
  FlushDenormalsOnThreads(threads);
  if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
}

// Converts a oneDNN exception into a Status naming the op and its shape.
inline absl::Status DnnlError(absl::string_view what, const dnnl::error& e) {
  return absl::InternalError(
      absl::StrCat(what, ": oneDNN error ", static_cast<int>(e.status), ": ", e.what()));
}

// Runs `fn` (an op's pass: the memories' handles set, its primitives executed) with the context's threads
// (UseThreads). Returns DnnlError naming `what` and `pass` ("conv [...]", " forward") when oneDNN throws. `fn`
// returns nothing: what may fail in it throws.
template <typename Fn>
absl::Status RunDnnl(const DnnlContext& ctx, absl::string_view what, absl::string_view pass, Fn&& fn) {
  UseThreads(ctx.threads);
  try {
    fn();
  } catch (const dnnl::error& e) {
    return DnnlError(absl::StrCat(what, pass), e);
  }
  return absl::OkStatus();
}

// Makes a oneDNN-backed op, Op(args...), and its primitives (Op::Init) with the context's threads: oneDNN plans its
// work split for the thread count at creation. DnnlError naming `what` (the op and its shape) when oneDNN
// throws.
template <typename Op, typename... Args>
absl::StatusOr<std::unique_ptr<Op>> MakeDnnlOp(const DnnlContext& ctx, absl::string_view what, Args&&... args) {
  UseThreads(ctx.threads);
  auto op = std::make_unique<Op>(std::forward<Args>(args)...);
  try {
    op->Init();
  } catch (const dnnl::error& e) {
    return DnnlError(what, e);
  }
  return op;
}

// oneDNN memory handles take void*; inputs are const in our interface and never written by the primitives.
inline void* Mutable(const float* p) { return const_cast<float*>(p); }

// Attributes every primitive of ours is made with: the scratchpad is ours (SharedScratchpad), never the
// library's global one, so Devices in different threads never share scratch memory.
inline dnnl::primitive_attr UserScratchpadAttr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// One scratchpad buffer shared by the primitives of one op, which never run concurrently. Use: Reserve()
// every primitive descriptor, then Allocate(), then For(pd) to get each primitive's scratchpad memory.
// Thread-compatible.
class SharedScratchpad {
 public:
  void Reserve(const dnnl::primitive_desc_base& pd) {
    bytes_ = std::max(bytes_, pd.scratchpad_desc().get_size());
  }
  void Allocate() { buffer_ = AllocAligned(bytes_); }
  // Reserve every primitive's need, Allocate, and set each paired memory to its primitive's scratchpad (For).
  void Share(const dnnl::engine& engine,
             std::initializer_list<std::pair<const dnnl::primitive_desc_base*, dnnl::memory*>> uses) {
    for (const auto& [pd, scratchpad] : uses) Reserve(*pd);
    Allocate();
    for (const auto& [pd, scratchpad] : uses) *scratchpad = For(*pd, engine);
  }
  dnnl::memory For(const dnnl::primitive_desc_base& pd, const dnnl::engine& engine) const {
    return dnnl::memory(pd.scratchpad_desc(), engine, buffer_.get());
  }
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_ = 0;
  AlignedBuffer buffer_;
};

}  // namespace dtrain::kernels::cpu

#endif  // DTRAIN_KERNELS_CPU_DNNL_UTIL_H_
