#include "worker/data/example_proto.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dtrain::data {
namespace {

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

// ---- encoding ----

void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void PutLengthDelimited(uint32_t field, absl::string_view payload, std::string* out) {
  PutVarint((field << 3) | kLengthDelimited, out);
  PutVarint(payload.size(), out);
  out->append(payload.data(), payload.size());
}

// Feature{bytes_list{value: bytes}}
std::string BytesFeature(absl::string_view bytes) {
  std::string list, feature;
  PutLengthDelimited(1, bytes, &list);
  PutLengthDelimited(1, list, &feature);
  return feature;
}

// Feature{int64_list{value: [v] (packed)}}
std::string Int64Feature(int64_t v) {
  std::string packed, list, feature;
  PutVarint(static_cast<uint64_t>(v), &packed);
  PutLengthDelimited(1, packed, &list);
  PutLengthDelimited(3, list, &feature);
  return feature;
}

void PutMapEntry(absl::string_view key, const std::string& feature, std::string* features) {
  std::string entry;
  PutLengthDelimited(1, key, &entry);
  PutLengthDelimited(2, feature, &entry);
  PutLengthDelimited(1, entry, features);
}

// ---- decoding ----

class WireReader {
 public:
  explicit WireReader(absl::string_view b) : b_(b) {}
  bool done() const { return pos_ >= b_.size(); }

  absl::StatusOr<uint64_t> Varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= b_.size()) return Malformed("truncated varint");
      const auto byte = static_cast<unsigned char>(b_[pos_++]);
      v |= uint64_t{byte & 0x7Fu} << shift;
      if ((byte & 0x80) == 0) return v;
    }
    return Malformed("varint longer than 10 bytes");
  }

  absl::StatusOr<absl::string_view> LengthDelimited() {
    ASSIGN_OR_RETURN(uint64_t n, Varint());
    if (n > b_.size() - pos_) return Malformed("length-delimited field runs past the end");
    absl::string_view s = b_.substr(pos_, n);
    pos_ += n;
    return s;
  }

  absl::StatusOr<uint64_t> Fixed32() {  // the 4 bytes, little-endian
    if (4 > b_.size() - pos_) return Malformed("truncated fixed-width field");
    uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b_[pos_ + i]);
    pos_ += 4;
    return v;
  }

  absl::Status Skip(uint32_t wire_type) {
    switch (wire_type) {
      case kVarint:
        return Varint().status();
      case kLengthDelimited:
        return LengthDelimited().status();
      case kFixed64:
      case kFixed32: {
        const size_t n = wire_type == kFixed64 ? 8 : 4;
        if (n > b_.size() - pos_) return Malformed("truncated fixed-width field");
        pos_ += n;
        return absl::OkStatus();
      }
      default:
        return Malformed(absl::StrCat("unsupported wire type ", wire_type));
    }
  }

  absl::Status Malformed(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("malformed tf.train.Example: ", what, " (at byte ", pos_,
                                                   " of a ", b_.size(), "-byte message)"));
  }

 private:
  absl::string_view b_;
  size_t pos_ = 0;
};

// Feature -> its first bytes_list value.
absl::StatusOr<std::string> DecodeBytesFeature(absl::string_view key, absl::string_view feature) {
  WireReader r(feature);
  while (!r.done()) {
    ASSIGN_OR_RETURN(uint64_t tag, r.Varint());
    if (tag == ((1 << 3) | kLengthDelimited)) {
      ASSIGN_OR_RETURN(absl::string_view list, r.LengthDelimited());
      WireReader lr(list);
      while (!lr.done()) {
        ASSIGN_OR_RETURN(uint64_t ltag, lr.Varint());
        if (ltag == ((1 << 3) | kLengthDelimited)) {
          ASSIGN_OR_RETURN(absl::string_view v, lr.LengthDelimited());
          return std::string(v);
        }
        RETURN_IF_ERROR(lr.Skip(ltag & 7));
      }
      return absl::InvalidArgumentError(absl::StrCat("feature \"", key, "\": empty bytes_list"));
    }
    if ((tag >> 3) == 2 || (tag >> 3) == 3) {
      return absl::InvalidArgumentError(absl::StrCat("feature \"", key, "\": expected a bytes_list"));
    }
    RETURN_IF_ERROR(r.Skip(tag & 7));
  }
  return absl::InvalidArgumentError(absl::StrCat("feature \"", key, "\": no bytes_list"));
}

// Feature -> its first int64_list value (packed or unpacked).
absl::StatusOr<int64_t> DecodeInt64Feature(absl::string_view key, absl::string_view feature) {
  WireReader r(feature);
  while (!r.done()) {
    ASSIGN_OR_RETURN(uint64_t tag, r.Varint());
    if ((tag >> 3) == 3 && (tag & 7) == kLengthDelimited) {
      ASSIGN_OR_RETURN(absl::string_view list, r.LengthDelimited());
      WireReader lr(list);
      while (!lr.done()) {
        ASSIGN_OR_RETURN(uint64_t ltag, lr.Varint());
        if (ltag == ((1 << 3) | kVarint)) {
          ASSIGN_OR_RETURN(uint64_t v, lr.Varint());
          return static_cast<int64_t>(v);
        }
        if (ltag == ((1 << 3) | kLengthDelimited)) {  // packed
          ASSIGN_OR_RETURN(absl::string_view packed, lr.LengthDelimited());
          if (packed.empty()) continue;
          WireReader pr(packed);
          ASSIGN_OR_RETURN(uint64_t v, pr.Varint());
          return static_cast<int64_t>(v);
        }
        RETURN_IF_ERROR(lr.Skip(ltag & 7));
      }
      return absl::InvalidArgumentError(absl::StrCat("feature \"", key, "\": empty int64_list"));
    }
    if ((tag >> 3) == 1 || (tag >> 3) == 2) {
      return absl::InvalidArgumentError(absl::StrCat("feature \"", key, "\": expected an int64_list"));
    }
    RETURN_IF_ERROR(r.Skip(tag & 7));
  }
  return absl::InvalidArgumentError(absl::StrCat("feature \"", key, "\": no int64_list"));
}

absl::Status MapEntryKeyValue(absl::string_view entry, absl::string_view* key, absl::string_view* value) {
  WireReader r(entry);
  while (!r.done()) {
    ASSIGN_OR_RETURN(uint64_t tag, r.Varint());
    if (tag == ((1 << 3) | kLengthDelimited)) {
      ASSIGN_OR_RETURN(*key, r.LengthDelimited());
    } else if (tag == ((2 << 3) | kLengthDelimited)) {
      ASSIGN_OR_RETURN(*value, r.LengthDelimited());
    } else {
      RETURN_IF_ERROR(r.Skip(tag & 7));
    }
  }
  return absl::OkStatus();
}

// Calls each(key, value) for every map entry of a serialized Example.
template <typename Each>
absl::Status ForEachMapEntry(absl::string_view bytes, Each each) {
  WireReader r(bytes);
  while (!r.done()) {
    ASSIGN_OR_RETURN(uint64_t tag, r.Varint());
    if (tag != ((1 << 3) | kLengthDelimited)) {
      RETURN_IF_ERROR(r.Skip(tag & 7));
      continue;
    }
    ASSIGN_OR_RETURN(absl::string_view features, r.LengthDelimited());
    WireReader fr(features);
    while (!fr.done()) {
      ASSIGN_OR_RETURN(uint64_t ftag, fr.Varint());
      if (ftag != ((1 << 3) | kLengthDelimited)) {
        RETURN_IF_ERROR(fr.Skip(ftag & 7));
        continue;
      }
      ASSIGN_OR_RETURN(absl::string_view entry, fr.LengthDelimited());
      absl::string_view key, value;
      RETURN_IF_ERROR(MapEntryKeyValue(entry, &key, &value));
      RETURN_IF_ERROR(each(key, value));
    }
  }
  return absl::OkStatus();
}

// Float lists (defined below, beside the CTR examples' list codec).
absl::Status DecodeFloatList(absl::string_view key, absl::string_view feature, std::vector<float>* out);
std::string PackedFloats(const std::vector<float>& values);

absl::Status DecodeMapEntry(absl::string_view key, absl::string_view value, ImageExample* e, bool* have_image) {
  if (key == "image_raw") {
    ASSIGN_OR_RETURN(e->image_raw, DecodeBytesFeature(key, value));
    *have_image = true;
  } else if (key == "image_float") {
    e->image_float.clear();
    RETURN_IF_ERROR(DecodeFloatList(key, value, &e->image_float));
    *have_image = true;
  } else if (key == "label") {
    ASSIGN_OR_RETURN(e->label, DecodeInt64Feature(key, value));
  } else if (key == "height") {
    ASSIGN_OR_RETURN(e->height, DecodeInt64Feature(key, value));
  } else if (key == "width") {
    ASSIGN_OR_RETURN(e->width, DecodeInt64Feature(key, value));
  } else if (key == "depth") {
    ASSIGN_OR_RETURN(e->depth, DecodeInt64Feature(key, value));
  } else if (key == "pixels") {
    ASSIGN_OR_RETURN(e->pixels, DecodeInt64Feature(key, value));
  }
  return absl::OkStatus();
}

}  // namespace

std::string EncodeImageExample(const ImageExample& e) {
  std::string features;
  // The order TF's convert_to_records uses; map order carries no meaning on the wire.
  if (e.height >= 0) PutMapEntry("height", Int64Feature(e.height), &features);
  if (e.width >= 0) PutMapEntry("width", Int64Feature(e.width), &features);
  if (e.depth >= 0) PutMapEntry("depth", Int64Feature(e.depth), &features);
  if (e.pixels >= 0) PutMapEntry("pixels", Int64Feature(e.pixels), &features);
  if (e.label >= 0) PutMapEntry("label", Int64Feature(e.label), &features);
  if (!e.image_float.empty()) {
    PutMapEntry("image_float", PackedFloats(e.image_float), &features);
  } else {
    PutMapEntry("image_raw", BytesFeature(e.image_raw), &features);
  }
  std::string example;
  PutLengthDelimited(1, features, &example);
  return example;
}

absl::StatusOr<ImageExample> DecodeImageExample(absl::string_view bytes) {
  ImageExample e;
  bool have_image = false;
  RETURN_IF_ERROR(ForEachMapEntry(bytes, [&](absl::string_view key, absl::string_view value) {
    return DecodeMapEntry(key, value, &e, &have_image);
  }));
  if (!have_image) {
    return absl::InvalidArgumentError("tf.train.Example has no \"image_raw\" (or \"image_float\") feature");
  }
  if (e.label < 0) return absl::InvalidArgumentError("tf.train.Example has no (non-negative) \"label\" feature");
  return e;
}

// ---- CTR examples ----

namespace {

constexpr absl::string_view kSparsePrefix = "sparse_";

// The i of "sparse_i" (decimal, no leading zero), -1 for other keys; kMaxCtrSparseFeatures for one too large.
int SparseIndex(absl::string_view key) {
  if (!absl::StartsWith(key, kSparsePrefix)) return -1;
  key.remove_prefix(kSparsePrefix.size());
  if (key.empty() || (key.size() > 1 && key[0] == '0')) return -1;
  int i = 0;
  for (char c : key) {
    if (c < '0' || c > '9') return -1;
    i = std::min(i * 10 + (c - '0'), kMaxCtrSparseFeatures);
  }
  return i;
}

// Calls each(value) for the values of a Feature's list `list_field` (2: float_list, 3: int64_list), packed or
// not, as protobuf merges repeated occurrences; InvalidArgument for a list of another kind.
template <typename Each>
absl::Status ForEachListValue(absl::string_view key, absl::string_view feature, uint64_t list_field, Each each) {
  const bool is_float = list_field == 2;
  const uint32_t scalar_wire = is_float ? kFixed32 : kVarint;
  WireReader r(feature);
  while (!r.done()) {
    ASSIGN_OR_RETURN(uint64_t tag, r.Varint());
    const uint64_t field = tag >> 3;
    if (field >= 1 && field <= 3 && field != list_field) {
      return absl::InvalidArgumentError(
          absl::StrCat("feature \"", key, "\": expected ", is_float ? "a float_list" : "an int64_list"));
    }
    if (field != list_field || (tag & 7) != kLengthDelimited) {
      RETURN_IF_ERROR(r.Skip(tag & 7));
      continue;
    }
    ASSIGN_OR_RETURN(absl::string_view list, r.LengthDelimited());
    WireReader lr(list);
    while (!lr.done()) {
      ASSIGN_OR_RETURN(uint64_t ltag, lr.Varint());
      if (ltag == ((1 << 3) | scalar_wire)) {
        ASSIGN_OR_RETURN(uint64_t v, is_float ? lr.Fixed32() : lr.Varint());
        each(v);
      } else if (ltag == ((1 << 3) | kLengthDelimited)) {
        ASSIGN_OR_RETURN(absl::string_view packed, lr.LengthDelimited());
        WireReader pr(packed);
        if (is_float && packed.size() % 4 != 0) return pr.Malformed("packed float_list of a partial float");
        while (!pr.done()) {
          ASSIGN_OR_RETURN(uint64_t v, is_float ? pr.Fixed32() : pr.Varint());
          each(v);
        }
      } else {
        RETURN_IF_ERROR(lr.Skip(ltag & 7));
      }
    }
  }
  return absl::OkStatus();
}

float FloatFromBits(uint64_t bits) {
  const auto b = static_cast<uint32_t>(bits);
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// The Feature's list kind: 2 (float_list), 3 (int64_list), or 0 when it holds neither.
absl::StatusOr<uint64_t> ListKind(absl::string_view feature) {
  WireReader r(feature);
  while (!r.done()) {
    ASSIGN_OR_RETURN(uint64_t tag, r.Varint());
    if ((tag >> 3) == 2 || (tag >> 3) == 3) return tag >> 3;
    RETURN_IF_ERROR(r.Skip(tag & 7));
  }
  return 0;
}

absl::StatusOr<int64_t> DecodeCtrLabel(absl::string_view feature) {
  ASSIGN_OR_RETURN(uint64_t kind, ListKind(feature));
  bool have = false;
  double label = -1;
  if (kind != 0) {
    RETURN_IF_ERROR(ForEachListValue("label", feature, kind, [&](uint64_t v) {
      if (have) return;
      have = true;
      label = kind == 2 ? static_cast<double>(FloatFromBits(v)) : static_cast<double>(static_cast<int64_t>(v));
    }));
  }
  if (!have) return absl::InvalidArgumentError("feature \"label\": no value");
  if (label != 0 && label != 1) {
    return absl::InvalidArgumentError(absl::StrCat("feature \"label\": ", label, " is not 0 or 1"));
  }
  return static_cast<int64_t>(label);
}

std::string PackedList(uint32_t list_field, const std::string& packed) {
  std::string list, feature;
  if (!packed.empty()) PutLengthDelimited(1, packed, &list);
  PutLengthDelimited(list_field, list, &feature);
  return feature;
}

}  // namespace

namespace {

absl::Status DecodeFloatList(absl::string_view key, absl::string_view feature, std::vector<float>* out) {
  return ForEachListValue(key, feature, 2, [out](uint64_t v) { out->push_back(FloatFromBits(v)); });
}

std::string PackedFloats(const std::vector<float>& values) {
  std::string packed;
  for (float v : values) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    for (int i = 0; i < 4; ++i) packed.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  }
  return PackedList(2, packed);
}

}  // namespace

bool IsCtrExample(absl::string_view bytes) {
  bool image = false, ctr = false;
  const absl::Status s = ForEachMapEntry(bytes, [&](absl::string_view key, absl::string_view) {
    image |= key == "image_raw";
    ctr |= key == "dense" || key == "sparse_0";
    return absl::OkStatus();
  });
  return s.ok() && ctr && !image;
}

std::string EncodeCtrExample(const CtrExample& e) {
  std::string features;
  PutMapEntry("label", Int64Feature(e.label), &features);
  if (!e.dense.empty()) {
    std::string packed;
    for (float v : e.dense) {
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      for (int i = 0; i < 4; ++i) packed.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
    }
    PutMapEntry("dense", PackedList(2, packed), &features);
  }
  for (int f = 0; f < e.num_sparse(); ++f) {
    std::string packed;
    for (int64_t i = e.id_offsets[f]; i < e.id_offsets[f + 1]; ++i) PutVarint(static_cast<uint64_t>(e.ids[i]), &packed);
    PutMapEntry(absl::StrCat(kSparsePrefix, f), PackedList(3, packed), &features);
  }
  std::string example;
  PutLengthDelimited(1, features, &example);
  return example;
}

absl::Status DecodeCtrExample(absl::string_view bytes, CtrExample* e) {
  e->label = -1;
  e->dense.clear();
  e->ids.clear();
  e->id_offsets.clear();
  absl::string_view label, dense;
  bool have_label = false, have_dense = false;
  // (key, value) by index; a null key: absent.
  absl::InlinedVector<std::pair<absl::string_view, absl::string_view>, 32> sparse;
  RETURN_IF_ERROR(ForEachMapEntry(bytes, [&](absl::string_view key, absl::string_view value) {
    if (key == "label") {
      label = value;
      have_label = true;
    } else if (key == "dense") {
      dense = value;
      have_dense = true;
    } else if (const int i = SparseIndex(key); i >= 0) {
      if (i >= kMaxCtrSparseFeatures) {
        return absl::InvalidArgumentError(absl::StrCat("feature \"", key.substr(0, 20), "\": more than ",
                                                       kMaxCtrSparseFeatures, " sparse features"));
      }
      if (static_cast<size_t>(i) >= sparse.size()) sparse.resize(i + 1);
      sparse[i] = {key, value};
    }
    return absl::OkStatus();
  }));
  if (!have_label) return absl::InvalidArgumentError("tf.train.Example has no \"label\" feature");
  ASSIGN_OR_RETURN(e->label, DecodeCtrLabel(label));
  if (have_dense) {
    RETURN_IF_ERROR(ForEachListValue("dense", dense, 2, [e](uint64_t v) { e->dense.push_back(FloatFromBits(v)); }));
  }
  e->id_offsets.push_back(0);
  for (size_t i = 0; i < sparse.size(); ++i) {
    if (sparse[i].first.data() == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("tf.train.Example has \"sparse_", sparse.size() - 1, "\" but no \"sparse_", i, "\""));
    }
    RETURN_IF_ERROR(ForEachListValue(sparse[i].first, sparse[i].second, 3,
                                     [e](uint64_t v) { e->ids.push_back(static_cast<int64_t>(v)); }));
    e->id_offsets.push_back(static_cast<int64_t>(e->ids.size()));
  }
  if (sparse.empty()) e->id_offsets.clear();
  return absl::OkStatus();
}

}  // namespace dtrain::data
