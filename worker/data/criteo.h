// Criteo display-advertising text data (the Kaggle and Terabyte click logs): the reader, the hashing of
// categorical values to ids and the transform of the integer features.
//
// Format: one example per line, tab-separated fields
//   label \t I1 ... I13 \t C1 ... C26          (CriteoLayout: num_dense integer, num_sparse categorical fields)
//   label: "0" (no click) or "1" (click); never empty.
//   I_j:   a decimal integer (may be negative, at most 18 digits), or empty.
//   C_f:   a hexadecimal value of 1 to 16 digits (Criteo's have 8), either case, or empty.
// Lines end in "\n"; a "\r" before it is dropped (CRLF files read like LF files); the last line may lack its
// "\n". Every line must have exactly 1 + num_dense + num_sparse fields (an empty line is one field: an error).
// Files may be gzip-compressed, whatever their name (recognised by the magic bytes 1f 8b).
//
// What an example becomes (Dataset, dataset.h; one id per bag, so id_offsets stays empty):
//   label:     labels[e] = 0 or 1; num_classes = 2.
//   I_j:       dense[e * num_dense + j] = float(log(1 + max(I_j, 0))); an empty field gives 0.
//   C_f = v:   ids[e * num_sparse + f] = CriteoId(f, v), v read as an unsigned 64-bit number (so "0a3", "A3"
//              and "a3" are the same value);
//   C_f empty: ids[e * num_sparse + f] = CriteoMissingId(f) = CriteoId(f, kCriteoMissingValue).
//
// The hash (fixed: ids are stored in checkpoints and shard the embedding tables on the ps):
//   Mix64(z)       = splitmix64's finalizer: z ^= z >> 30; z *= 0xbf58476d1ce4e5b9; z ^= z >> 27;
//                    z *= 0x94d049bb133111eb; z ^= z >> 31 (a bijection of the 64-bit integers)
//   CriteoId(f, v) = Mix64(v ^ Mix64(kCriteoHashSalt + f)) & (2^63 - 1)
// so ids are non-negative int64, spread uniformly over [0, 2^63) (any id bits, or id modulo any count, shard
// evenly), differ between features for equal values, and two values of one feature share an id only when their
// mixes differ in the top bit alone (a chance of 2^-63 per pair of values).
//
// A directory may hold criteo_layout.txt ("num_dense=4 num_sparse=8", as dtrain_convert --synthetic_ctr writes
// it) for files with other field counts; without it LoadDataset reads the standard 13 + 26.
//
// Errors (DataLoss) name the file, the 1-based line and field and the value, e.g.
//   train.txt:1234: field 7 (I6): "12x" is not an integer
//   train.txt:5: 39 fields, expected 40 (label, 13 integer, 26 categorical)
// NotFound when a file cannot be opened; InvalidArgument for a bad layout.
//
// Thread-safety: the functions are stateless and thread-safe.
#ifndef DTRAIN_WORKER_DATA_CRITEO_H_
#define DTRAIN_WORKER_DATA_CRITEO_H_

#include <cmath>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/data/dataset.h"

namespace dtrain::data {

struct CriteoLayout {
  int num_dense = 13;   // integer fields I1..I{num_dense} after the label
  int num_sparse = 26;  // categorical fields C1..C{num_sparse} after them
};
inline constexpr int kMaxCriteoFields = 10000;  // a layout's 1 + num_dense + num_sparse at most

inline constexpr char kCriteoLayoutFile[] = "criteo_layout.txt";
inline constexpr uint64_t kCriteoHashSalt = 0x63726974656f0000;  // "criteo\0\0"
inline constexpr uint64_t kCriteoMissingValue = ~uint64_t{0};     // "ffffffffffffffff" stands for an empty field

inline constexpr uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
inline constexpr int64_t CriteoId(int feature, uint64_t value) {
  return static_cast<int64_t>(Mix64(value ^ Mix64(kCriteoHashSalt + static_cast<uint64_t>(feature))) &
                              ~(uint64_t{1} << 63));
}
inline constexpr int64_t CriteoMissingId(int feature) { return CriteoId(feature, kCriteoMissingValue); }

// The dense transform: log(1 + max(x, 0)) as a float (the reader uses a table for small x, equal to this).
inline float CriteoDense(int64_t x) { return x <= 0 ? 0.0f : static_cast<float>(std::log1p(static_cast<double>(x))); }

// Reads a Criteo text file (plain or gzip) into a CTR Dataset (see above). DataLoss for a malformed line or an
// empty file, NotFound when it cannot be opened, InvalidArgument for a layout outside [0, kMaxCriteoFields).
absl::StatusOr<Dataset> ReadCriteo(const std::string& path, const CriteoLayout& layout = {});

// The same over bytes in memory (plain or gzip); `name` stands for the path in errors.
absl::StatusOr<Dataset> ParseCriteo(absl::string_view bytes, const std::string& name = "criteo",
                                    const CriteoLayout& layout = {});

// The layout of `dir`: its criteo_layout.txt if there is one (InvalidArgument naming it when malformed), else
// the standard 13 + 26.
absl::StatusOr<CriteoLayout> ReadCriteoLayout(const std::string& dir);
// Writes `dir`/criteo_layout.txt.
absl::Status WriteCriteoLayout(const std::string& dir, const CriteoLayout& layout);

}  // namespace dtrain::data

#endif  // DTRAIN_WORKER_DATA_CRITEO_H_
