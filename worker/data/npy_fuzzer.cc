// libFuzzer harness for the NumPy readers (ParseNpz, ParseNpy): a .npz archive's bytes (or, with the first byte
// odd, a .npy's). Arrays that parse must lie inside what holds them; malformed input must fail with DataLoss or
// InvalidArgument, never read out of bounds.
// Seeds: fuzz/seeds/npy_fuzzer/ (fuzz/make_seeds.cc writes .npy and .npz files).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "glog/logging.h"
#include "worker/data/npy_file.h"

namespace {

void CheckArray(absl::string_view holder, const absl::StatusOr<dtrain::data::NpyArray>& a) {
  if (!a.ok()) {
    CHECK(absl::IsDataLoss(a.status()) || absl::IsInvalidArgument(a.status())) << a.status();
    return;
  }
  const uint64_t bytes = static_cast<uint64_t>(a->count()) * a->element_size();
  CHECK(a->data >= holder.data() && a->data + bytes <= holder.data() + holder.size());
  double sum = 0;
  for (int64_t i = 0; i < std::min<int64_t>(a->count(), 64); ++i) sum += dtrain::data::NpyValue(*a, i);
  (void)sum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtrain::data;  // NOLINT
  if (size < 1) return 0;
  const absl::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) {
    CheckArray(bytes, ParseNpy(bytes, "fuzz.npy"));
    return 0;
  }
  std::vector<std::unique_ptr<std::string>> inflated;
  absl::StatusOr<NpzMembers> members = ParseNpz(bytes, "fuzz.npz", &inflated);
  if (!members.ok()) {
    CHECK(absl::IsDataLoss(members.status()) || absl::IsInvalidArgument(members.status())) << members.status();
    return 0;
  }
  for (const auto& [name, npy] : *members) {
    bool inside = npy.data() >= bytes.data() && npy.data() + npy.size() <= bytes.data() + bytes.size();
    for (const auto& s : inflated) inside = inside || (npy.data() >= s->data() && npy.data() + npy.size() <= s->data() + s->size());
    CHECK(inside) << name;
    CheckArray(npy, ParseNpy(npy, name));
  }
  return 0;
}
