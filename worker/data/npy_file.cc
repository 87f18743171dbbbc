#include "worker/data/npy_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace dtrain::data {
namespace {

constexpr int64_t kMaxElements = int64_t{1} << 48;

uint64_t Le(const char* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

absl::Status ErrnoStatus(int err, const std::string& what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(err));
  if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  return absl::DataLossError(message);
}

// The value of 'key' in a header dict: the text after "'key':" up to the next top-level ',' or '}'.
bool DictValue(absl::string_view dict, absl::string_view key, absl::string_view* value) {
  for (const char* quote : {"'", "\""}) {
    const std::string k = absl::StrCat(quote, key, quote);
    size_t at = dict.find(k);
    if (at == absl::string_view::npos) continue;
    at = dict.find(':', at + k.size());
    if (at == absl::string_view::npos) return false;
    size_t end = at + 1;
    int depth = 0;
    bool in_string = false;
    for (; end < dict.size(); ++end) {
      const char c = dict[end];
      if (c == '\'' || c == '"') in_string = !in_string;
      if (in_string) continue;
      if (c == '(' || c == '[') ++depth;
      if (c == ')' || c == ']') --depth;
      if (depth == 0 && (c == ',' || c == '}')) break;
      if (depth < 0) break;
    }
    *value = absl::StripAsciiWhitespace(dict.substr(at + 1, end - at - 1));
    return true;
  }
  return false;
}

struct TypeName {
  const char* descr;
  NpyType type;
};
constexpr TypeName kTypes[] = {{"u1", NpyType::kU8},  {"i1", NpyType::kI8},  {"b1", NpyType::kBool},
                               {"u2", NpyType::kU16}, {"i2", NpyType::kI16}, {"f2", NpyType::kF16},
                               {"u4", NpyType::kU32}, {"i4", NpyType::kI32}, {"f4", NpyType::kF32},
                               {"u8", NpyType::kU64}, {"i8", NpyType::kI64}, {"f8", NpyType::kF64}};

}  // namespace

// ---- MappedFile ----

absl::StatusOr<std::shared_ptr<const MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot open ", path));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(err, absl::StrCat("cannot read ", path));
  }
  const size_t size = static_cast<size_t>(std::max<off_t>(st.st_size, 0));
  const char* data = "";
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return ErrnoStatus(err, absl::StrCat("cannot map ", path));
    }
    data = static_cast<const char*>(p);
  }
  ::close(fd);  // the mapping stays valid
  return std::shared_ptr<const MappedFile>(new MappedFile(path, data, size));
}

MappedFile::~MappedFile() {
  if (size_ > 0) ::munmap(const_cast<char*>(data_), size_);
}

// ---- .npy ----

int NpyArray::element_size() const {
  switch (type) {
    case NpyType::kU8: case NpyType::kI8: case NpyType::kBool: return 1;
    case NpyType::kU16: case NpyType::kI16: case NpyType::kF16: return 2;
    case NpyType::kU32: case NpyType::kI32: case NpyType::kF32: return 4;
    default: return 8;
  }
}

int64_t NpyArray::count() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes, const std::string& name) {
  auto loss = [&name](absl::string_view what) { return absl::DataLossError(absl::StrCat(name, ": ", what)); };
  if (bytes.size() < 10 || bytes.substr(0, 6) != "\x93NUMPY") {
    return loss("not a NumPy .npy array (no \\x93NUMPY magic)");
  }
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t header_at, header_len;
  if (major == 1) {
    header_at = 10;
    header_len = Le(bytes.data() + 8, 2);
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return loss("truncated header");
    header_at = 12;
    header_len = Le(bytes.data() + 8, 4);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(name, ": .npy format version ", major, " is not supported (1-3 are)"));
  }
  if (header_len > bytes.size() - header_at) return loss("truncated header");
  const absl::string_view dict = bytes.substr(header_at, header_len);
  absl::string_view descr, fortran, shape;
  if (!DictValue(dict, "descr", &descr) || !DictValue(dict, "fortran_order", &fortran) ||
      !DictValue(dict, "shape", &shape)) {
    return loss(absl::StrCat("header lacks descr, fortran_order or shape: ", dict));
  }
  NpyArray a;
  descr = absl::StripPrefix(absl::StripSuffix(descr, "'"), "'");
  descr = absl::StripPrefix(absl::StripSuffix(descr, "\""), "\"");
  a.descr = std::string(descr);
  bool known = false;
  if (descr.size() == 3) {
    const char order = descr[0];
    for (const TypeName& t : kTypes) {
      if (descr.substr(1) != t.descr) continue;
      const bool byte_sized = t.descr[1] == '1';
      // '<' little-endian, '|' not applicable (bytes), '=' native (little on the machines we run on).
      if (order == '<' || order == '=' || (order == '|' && byte_sized) || (order == '>' && byte_sized)) {
        a.type = t.type;
        known = true;
      }
    }
  }
  if (!known) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": element type '", descr, "' is not supported (uint8, float16/32/64, int8..int64 or bool, "
        "little-endian; e.g. save x.astype(np.float32))"));
  }
  if (fortran != "True" && fortran != "False") {
    return loss(absl::StrCat("fortran_order is '", fortran, "'"));
  }
  if (!absl::ConsumePrefix(&shape, "(") || !absl::ConsumeSuffix(&shape, ")")) {
    return loss(absl::StrCat("shape is not a tuple: ", shape));
  }
  int64_t elements = 1;
  for (absl::string_view d : absl::StrSplit(shape, ',', absl::SkipWhitespace())) {
    int64_t v;
    d = absl::StripSuffix(absl::StripAsciiWhitespace(d), "L");
    if (!absl::SimpleAtoi(d, &v) || v < 0 || (v > 0 && elements > kMaxElements / v)) {
      return loss(absl::StrCat("bad shape (", shape, ")"));
    }
    a.shape.push_back(v);
    elements *= v;
  }
  if (fortran == "True" && a.shape.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": the array is in Fortran order; save np.ascontiguousarray(array) instead"));
  }
  const size_t data_at = header_at + header_len;
  const uint64_t need = static_cast<uint64_t>(elements) * a.element_size();
  if (need > bytes.size() - data_at) {
    return loss(absl::StrCat("truncated: shape (", absl::StrJoin(a.shape, ", "), ") of '", a.descr, "' needs ", need,
                             " bytes of data, the file has ", bytes.size() - data_at));
  }
  a.data = bytes.data() + data_at;
  return a;
}

// ---- .npz ----

absl::StatusOr<NpzMembers> ParseNpz(absl::string_view bytes, const std::string& name,
                                    std::vector<std::unique_ptr<std::string>>* inflated) {
  auto loss = [&name](absl::string_view what) {
    return absl::DataLossError(absl::StrCat(name, ": not a valid .npz (zip) archive: ", what));
  };
  // The end-of-central-directory record: the last "PK\5\6" within the final 64 KiB + 22 bytes.
  if (bytes.size() < 22) return loss("too short");
  size_t eocd = absl::string_view::npos;
  const size_t lowest = bytes.size() > 22 + 65535 ? bytes.size() - 22 - 65535 : 0;
  for (size_t at = bytes.size() - 22 + 1; at-- > lowest;) {
    if (Le(bytes.data() + at, 4) == 0x06054b50) {
      eocd = at;
      break;
    }
  }
  if (eocd == absl::string_view::npos) return loss("no end-of-central-directory record");
  uint64_t entries = Le(bytes.data() + eocd + 10, 2);
  uint64_t cd_size = Le(bytes.data() + eocd + 12, 4), cd_offset = Le(bytes.data() + eocd + 16, 4);
  if (eocd >= 20 && Le(bytes.data() + eocd - 20, 4) == 0x07064b50) {  // ZIP64
    const uint64_t at = Le(bytes.data() + eocd - 20 + 8, 8);
    if (at > bytes.size() || bytes.size() - at < 56 || Le(bytes.data() + at, 4) != 0x06064b50) {
      return loss("bad ZIP64 end-of-central-directory record");
    }
    entries = Le(bytes.data() + at + 32, 8);
    cd_size = Le(bytes.data() + at + 40, 8);
    cd_offset = Le(bytes.data() + at + 48, 8);
  }
  if (cd_offset > bytes.size() || cd_size > bytes.size() - cd_offset) return loss("central directory out of range");
  NpzMembers members;
  size_t at = cd_offset;
  const size_t cd_end = cd_offset + cd_size;
  for (uint64_t e = 0; e < entries; ++e) {
    if (cd_end - at < 46 || at > cd_end || Le(bytes.data() + at, 4) != 0x02014b50) return loss("bad central directory entry");
    const char* h = bytes.data() + at;
    const uint64_t flags = Le(h + 8, 2), method = Le(h + 10, 2), crc = Le(h + 16, 4);
    uint64_t compressed = Le(h + 20, 4), size = Le(h + 24, 4);
    const size_t name_len = Le(h + 28, 2), extra_len = Le(h + 30, 2), comment_len = Le(h + 32, 2);
    uint64_t local = Le(h + 42, 4);
    if (cd_end - at - 46 < name_len + extra_len + comment_len) return loss("bad central directory entry");
    std::string member(h + 46, name_len);
    // ZIP64 extra field: the 64-bit values of the fields that hold 0xffffffff, in order.
    for (size_t x = 0; x + 4 <= extra_len;) {
      const char* f = h + 46 + name_len + x;
      const size_t id = Le(f, 2), len = Le(f + 2, 2);
      if (x + 4 + len > extra_len) break;
      if (id == 1) {
        size_t k = 4;
        for (uint64_t* v : {&size, &compressed, &local}) {
          if (*v != 0xffffffffu) continue;
          if (k + 8 > len + 4) return loss(absl::StrCat(member, ": short ZIP64 field"));
          *v = Le(f + k, 8);
          k += 8;
        }
      }
      x += 4 + len;
    }
    at += 46 + name_len + extra_len + comment_len;
    if (local > bytes.size() || bytes.size() - local < 30 || Le(bytes.data() + local, 4) != 0x04034b50) {
      return loss(absl::StrCat(member, ": bad local header"));
    }
    const uint64_t data_at = local + 30 + Le(bytes.data() + local + 26, 2) + Le(bytes.data() + local + 28, 2);
    if (data_at > bytes.size() || compressed > bytes.size() - data_at) {
      return loss(absl::StrCat(member, ": data out of range (truncated file?)"));
    }
    if (flags & 1) return absl::InvalidArgumentError(absl::StrCat(name, ": ", member, " is encrypted"));
    const absl::string_view raw = bytes.substr(data_at, compressed);
    absl::string_view npy;
    if (method == 0) {
      if (compressed != size) return loss(absl::StrCat(member, ": stored with two different sizes"));
      npy = raw;
    } else if (method == 8) {
      // Deflate expands at most 1032:1: a larger claimed size is corrupt (and must not be allocated).
      if (size > (uint64_t{1} << 40) || size / 1032 > compressed + 1) {
        return loss(absl::StrCat(member, ": implausible size ", size, " for ", compressed, " deflated bytes"));
      }
      auto out = std::make_unique<std::string>(size, '\0');
      z_stream z{};
      if (inflateInit2(&z, -MAX_WBITS) != Z_OK) return absl::InternalError("inflateInit2 failed");
      z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data()));
      z.avail_in = static_cast<uInt>(std::min<uint64_t>(raw.size(), UINT32_MAX));
      z.next_out = reinterpret_cast<Bytef*>(out->data());
      z.avail_out = static_cast<uInt>(std::min<uint64_t>(size, UINT32_MAX));
      int r = Z_OK;
      while (r == Z_OK) {
        r = inflate(&z, Z_NO_FLUSH);
        if (r == Z_OK && z.avail_in == 0 && raw.size() > z.total_in) {
          z.avail_in = static_cast<uInt>(std::min<uint64_t>(raw.size() - z.total_in, UINT32_MAX));
        }
        if (r == Z_OK && z.avail_out == 0 && size > z.total_out) {
          z.avail_out = static_cast<uInt>(std::min<uint64_t>(size - z.total_out, UINT32_MAX));
        }
        if (r == Z_OK && z.avail_in == 0 && z.avail_out == 0) break;
      }
      const uint64_t produced = z.total_out;
      inflateEnd(&z);
      if (r != Z_STREAM_END || produced != size) return loss(absl::StrCat(member, ": corrupt deflate data"));
      if (crc32_z(0, reinterpret_cast<const Bytef*>(out->data()), out->size()) != crc) {
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
        return loss(absl::StrCat(member, ": CRC mismatch"));
#endif
      }
      npy = *out;
      inflated->push_back(std::move(out));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": ", member, " uses zip compression method ", method, " (stored or deflate are read)"));
    }
    if (absl::EndsWith(member, ".npy")) member.resize(member.size() - 4);
    members[member] = npy;
  }
  return members;
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const int exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);  // subnormal (or zero)
  } else if (exp == 31) {
    f = mant ? std::nanf("") : INFINITY;
  } else {
    const uint32_t bits = ((exp + 112) << 23) | (mant << 13);
    std::memcpy(&f, &bits, 4);
  }
  return sign ? -f : f;
}

double NpyValue(const NpyArray& a, int64_t i) {
  const char* p = a.data + i * a.element_size();
  auto load = [p](auto v) {
    std::memcpy(&v, p, sizeof(v));
    return v;
  };
  switch (a.type) {
    case NpyType::kU8: return load(uint8_t{});
    case NpyType::kI8: return load(int8_t{});
    case NpyType::kBool: return load(uint8_t{}) != 0;
    case NpyType::kU16: return load(uint16_t{});
    case NpyType::kI16: return load(int16_t{});
    case NpyType::kF16: return HalfToFloat(load(uint16_t{}));
    case NpyType::kU32: return load(uint32_t{});
    case NpyType::kI32: return load(int32_t{});
    case NpyType::kF32: return load(float{});
    case NpyType::kU64: return static_cast<double>(load(uint64_t{}));
    case NpyType::kI64: return static_cast<double>(load(int64_t{}));
    case NpyType::kF64: return load(double{});
  }
  return 0;
}

}  // namespace dtrain::data
