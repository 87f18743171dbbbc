#include "worker/data/example_proto.h"

#include <cstdint>
#include <string>

#include "absl/status/status.h"
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

absl::Status DecodeMapEntry(absl::string_view entry, ImageExample* e, bool* have_image) {
  WireReader r(entry);
  absl::string_view key, value;
  while (!r.done()) {
    ASSIGN_OR_RETURN(uint64_t tag, r.Varint());
    if (tag == ((1 << 3) | kLengthDelimited)) {
      ASSIGN_OR_RETURN(key, r.LengthDelimited());
    } else if (tag == ((2 << 3) | kLengthDelimited)) {
      ASSIGN_OR_RETURN(value, r.LengthDelimited());
    } else {
      RETURN_IF_ERROR(r.Skip(tag & 7));
    }
  }
  if (key == "image_raw") {
    ASSIGN_OR_RETURN(e->image_raw, DecodeBytesFeature(key, value));
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
  PutMapEntry("image_raw", BytesFeature(e.image_raw), &features);
  std::string example;
  PutLengthDelimited(1, features, &example);
  return example;
}

absl::StatusOr<ImageExample> DecodeImageExample(absl::string_view bytes) {
  ImageExample e;
  bool have_image = false;
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
      RETURN_IF_ERROR(DecodeMapEntry(entry, &e, &have_image));
    }
  }
  if (!have_image) return absl::InvalidArgumentError("tf.train.Example has no \"image_raw\" feature");
  if (e.label < 0) return absl::InvalidArgumentError("tf.train.Example has no (non-negative) \"label\" feature");
  return e;
}

}  // namespace dtrain::data
