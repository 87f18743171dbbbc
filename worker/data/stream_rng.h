// The random numbers of the batch streams (batch_stream.cc, source_batch_stream.cc): RNGs seeded from the numbers
// that define a stream's order, and a portable shuffle, so that batches depend only on (data, options).
//
// Thread-safety: stateless functions.
#ifndef DTRAIN_WORKER_DATA_STREAM_RNG_H_
#define DTRAIN_WORKER_DATA_STREAM_RNG_H_

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace dtrain::data {

// Stream tags keep the shuffle and distortion RNGs apart even for equal (seed, epoch/batch) numbers.
inline constexpr uint32_t kShuffleTag = 0x53485546;  // "SHUF"
inline constexpr uint32_t kDistortTag = 0x44495354;  // "DIST"
inline constexpr uint32_t kAugmentTag = 0x41554753;  // "AUGS": a source's per-example augmentation

inline std::mt19937_64 SeededRng(uint64_t seed, uint64_t counter, int shard, uint32_t tag) {
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                    static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32),
                    static_cast<uint32_t>(shard), tag};
  return std::mt19937_64(seq);
}

// Fisher-Yates with an explicit unbiased draw (std::shuffle's algorithm is implementation-defined).
inline void Shuffle(std::vector<int64_t>* v, std::mt19937_64* rng) {
  for (size_t i = v->size(); i > 1; --i) {
    const uint64_t bound = i;
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t r;
    do {
      r = (*rng)();
    } while (r >= limit);
    std::swap((*v)[i - 1], (*v)[r % bound]);
  }
}

}  // namespace dtrain::data

#endif  // DTRAIN_WORKER_DATA_STREAM_RNG_H_
