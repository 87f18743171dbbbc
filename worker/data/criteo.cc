// Criteo text reader: each line is parsed in one pass, every field as its bytes are met, straight into the
// Dataset's vectors (no per-line allocation). Files are read through zlib's gzread (which passes plain files
// through) in chunks of whole lines; bytes in memory are inflated first when they are gzip.
#include "worker/data/criteo.h"

#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace dtrain::data {
namespace {

constexpr int kDenseTableSize = 1 << 12;
constexpr size_t kChunk = size_t{8} << 20;  // bytes per file read; a line must fit in one
constexpr int kMaxDecimalDigits = 18;       // |x| < 10^18 fits an int64 with room
constexpr int kMaxHexDigits = 16;
constexpr int kMaxQuoted = 40;              // bytes of a bad value quoted in an error

// CriteoDense of the small integers most Criteo integer fields hold (a log per field would cost a quarter of
// the parse).
const float* DenseTable() {
  static const float* const table = [] {
    auto* t = new float[kDenseTableSize];
    for (int i = 0; i < kDenseTableSize; ++i) t[i] = CriteoDense(i);
    return t;
  }();
  return table;
}

struct HexDigits {
  uint8_t value[256];
  constexpr HexDigits() : value() {
    for (int c = 0; c < 256; ++c) {
      value[c] = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                                : c >= 'A' && c <= 'F' ? c - 'A' + 10 : 0xFF;
    }
  }
};
constexpr HexDigits kHex;

absl::Status CheckLayout(const CriteoLayout& l) {
  if (l.num_dense < 0 || l.num_sparse < 0 || l.num_dense + l.num_sparse < 1 ||
      l.num_dense + l.num_sparse >= kMaxCriteoFields) {
    return absl::InvalidArgumentError(absl::StrCat("Criteo layout of ", l.num_dense, " integer and ", l.num_sparse,
                                                   " categorical fields: need at least one field and fewer than ",
                                                   kMaxCriteoFields, " in all"));
  }
  return absl::OkStatus();
}

// Thread-safety: one parser per thread (it appends to one Dataset).
class CriteoParser {
 public:
  CriteoParser(const CriteoLayout& layout, std::string name, Dataset* d)
      : num_dense_(layout.num_dense), num_sparse_(layout.num_sparse), name_(std::move(name)), d_(d),
        table_(DenseTable()) {
    d->num_classes = 2;
    d->num_dense = num_dense_;
    d->num_sparse = num_sparse_;
    for (int f = 0; f < num_sparse_; ++f) {
      keys_.push_back(Mix64(kCriteoHashSalt + static_cast<uint64_t>(f)));
      missing_.push_back(CriteoMissingId(f));
    }
  }

  // Parses every complete line of [p, end) (those ending in '\n'); returns where the unfinished rest begins.
  absl::StatusOr<const char*> Lines(const char* p, const char* end) {
    while (p < end) {
      const auto* nl = static_cast<const char*>(std::memchr(p, '\n', static_cast<size_t>(end - p)));
      if (nl == nullptr) break;
      RETURN_IF_ERROR(Line(p, nl));
      p = nl + 1;
    }
    return p;
  }

  // Parses one line, [line, end) without its '\n'.
  absl::Status Line(const char* const line, const char* end) {
    ++line_;
    if (end > line && end[-1] == '\r') --end;
    const char* p = line;
    if (p == end) return CountError(line, end);  // an empty line
    if (*p == '\t') return FieldError(line, end, 0, p, "is empty");
    if ((*p != '0' && *p != '1') || (p + 1 < end && p[1] != '\t')) {
      return FieldError(line, end, 0, p, "is not 0 or 1");
    }
    d_->labels.push_back(*p - '0');
    ++p;

    const size_t dense_base = d_->dense.size();
    d_->dense.resize(dense_base + num_dense_);
    float* dense = d_->dense.data() + dense_base;
    for (int j = 0; j < num_dense_; ++j) {
      if (p == end) return CountError(line, end);
      ++p;  // the tab before the field
      const char* field = p;
      const bool negative = p < end && *p == '-';
      if (negative) ++p;
      const char* digits = p;
      uint64_t x = 0;
      while (p < end && static_cast<unsigned>(*p - '0') < 10u) x = x * 10 + static_cast<unsigned>(*p++ - '0');
      if ((p < end && *p != '\t') || (negative && p == digits)) {
        return FieldError(line, end, 1 + j, field, "is not an integer");
      }
      if (p - digits > kMaxDecimalDigits) {
        return FieldError(line, end, 1 + j, field, absl::StrCat("has more than ", kMaxDecimalDigits, " digits"));
      }
      dense[j] = negative || x == 0 ? 0.0f
                 : x < kDenseTableSize ? table_[x]
                                       : CriteoDense(static_cast<int64_t>(x));
    }

    const size_t ids_base = d_->ids.size();
    d_->ids.resize(ids_base + num_sparse_);
    int64_t* ids = d_->ids.data() + ids_base;
    for (int f = 0; f < num_sparse_; ++f) {
      if (p == end) return CountError(line, end);
      ++p;
      const char* digits = p;
      uint64_t v = 0;
      while (p < end) {
        const uint8_t h = kHex.value[static_cast<unsigned char>(*p)];
        if (h > 15) break;
        v = (v << 4) | h;
        ++p;
      }
      if (p < end && *p != '\t') return FieldError(line, end, 1 + num_dense_ + f, digits, "is not hexadecimal");
      if (p - digits > kMaxHexDigits) {
        return FieldError(line, end, 1 + num_dense_ + f, digits,
                          absl::StrCat("has more than ", kMaxHexDigits, " hexadecimal digits"));
      }
      ids[f] = p == digits ? missing_[f] : static_cast<int64_t>(Mix64(v ^ keys_[f]) & ~(uint64_t{1} << 63));
    }
    if (p != end) return CountError(line, end);
    return absl::OkStatus();
  }

  int64_t lines() const { return line_; }

 private:
  std::string FieldName(int field) const {
    if (field == 0) return "label";
    if (field <= num_dense_) return absl::StrCat("I", field);
    return absl::StrCat("C", field - num_dense_);
  }

  // `value` points at the field's first byte.
  absl::Status FieldError(const char* line, const char* end, int field, const char* value,
                          absl::string_view what) const {
    const auto* tab = static_cast<const char*>(std::memchr(value, '\t', static_cast<size_t>(end - value)));
    const absl::string_view v(value, static_cast<size_t>((tab == nullptr ? end : tab) - value));
    const std::string where = absl::StrCat(name_, ":", line_, ": field ", field + 1, " (", FieldName(field), ")");
    if (v.empty()) return absl::DataLossError(absl::StrCat(where, " ", what));
    const std::string quoted = v.size() <= kMaxQuoted
                                   ? absl::CHexEscape(v)
                                   : absl::StrCat(absl::CHexEscape(v.substr(0, kMaxQuoted)), "...");
    return absl::DataLossError(absl::StrCat(where, ": \"", quoted, "\" ", what));
  }

  absl::Status CountError(const char* line, const char* end) const {
    const int64_t fields = 1 + std::count(line, end, '\t');
    return absl::DataLossError(absl::StrCat(name_, ":", line_, ": ", fields, fields == 1 ? " field" : " fields",
                                            ", expected ", 1 + num_dense_ + num_sparse_, " (label, ", num_dense_,
                                            " integer, ", num_sparse_, " categorical)"));
  }

  const int num_dense_, num_sparse_;
  const std::string name_;
  Dataset* const d_;
  const float* const table_;
  std::vector<uint64_t> keys_;    // Mix64(kCriteoHashSalt + f)
  std::vector<int64_t> missing_;  // CriteoMissingId(f)
  int64_t line_ = 0;
};

absl::Status Finish(const CriteoParser& parser, const std::string& name, const Dataset& d) {
  if (d.count() == 0) return absl::DataLossError(absl::StrCat(name, ": holds no examples"));
  CHECK_EQ(d.count(), parser.lines());
  return absl::OkStatus();
}

bool IsGzip(absl::string_view bytes) {
  return bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
         static_cast<unsigned char>(bytes[1]) == 0x8b;
}

// gzip in memory, inflated as gzread reads a file: concatenated members in turn; after a member, whatever is
// not another member is ignored.
absl::StatusOr<std::string> Gunzip(absl::string_view bytes, const std::string& name) {
  z_stream z{};
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) return absl::InternalError("cannot initialize zlib");
  std::unique_ptr<z_stream, int (*)(z_stream*)> end(&z, inflateEnd);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  z.avail_in = static_cast<uInt>(bytes.size());
  std::string out;
  char buf[1 << 16];
  while (true) {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof(buf);
    const int rc = inflate(&z, Z_NO_FLUSH);
    out.append(buf, sizeof(buf) - z.avail_out);
    if (rc == Z_STREAM_END) {
      if (z.avail_in < 2 || z.next_in[0] != 0x1f || z.next_in[1] != 0x8b) return out;
      inflateReset(&z);
    } else if (rc == Z_BUF_ERROR && z.avail_in == 0) {
      return absl::DataLossError(absl::StrCat(name, ": unexpected end of file (truncated gzip stream) after ",
                                              out.size(), " bytes"));
    } else if (rc != Z_OK) {
      return absl::DataLossError(absl::StrCat(name, ": invalid gzip data: ", z.msg != nullptr ? z.msg : "?"));
    }
  }
}

}  // namespace

absl::StatusOr<Dataset> ParseCriteo(absl::string_view bytes, const std::string& name, const CriteoLayout& layout) {
  RETURN_IF_ERROR(CheckLayout(layout));
  std::string inflated;
  if (IsGzip(bytes)) {
    ASSIGN_OR_RETURN(inflated, Gunzip(bytes, name));
    bytes = inflated;
  }
  Dataset d;
  CriteoParser parser(layout, name, &d);
  const char* end = bytes.data() + bytes.size();
  ASSIGN_OR_RETURN(const char* rest, parser.Lines(bytes.data(), end));
  if (rest < end) RETURN_IF_ERROR(parser.Line(rest, end));
  RETURN_IF_ERROR(Finish(parser, name, d));
  return d;
}

absl::StatusOr<Dataset> ReadCriteo(const std::string& path, const CriteoLayout& layout) {
  RETURN_IF_ERROR(CheckLayout(layout));
  const auto start = std::chrono::steady_clock::now();
  gzFile gz = gzopen(path.c_str(), "rb");
  if (gz == nullptr) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::unique_ptr<gzFile_s, int (*)(gzFile)> close(gz, gzclose);
  gzbuffer(gz, 1 << 20);
  std::error_code ec;
  const auto file_size = static_cast<double>(std::filesystem::file_size(path, ec));

  Dataset d;
  CriteoParser parser(layout, path, &d);
  std::vector<char> buf(kChunk);
  size_t have = 0;
  bool reserved = false;
  while (true) {
    const int got = gzread(gz, buf.data() + have, static_cast<unsigned>(kChunk - have));
    if (got < 0) {
      int errnum = 0;
      const char* msg = gzerror(gz, &errnum);
      return absl::DataLossError(absl::StrCat(path, ": read error after line ", parser.lines(), ": ",
                                              msg == nullptr ? "?" : msg));
    }
    if (got == 0) break;
    have += static_cast<size_t>(got);
    ASSIGN_OR_RETURN(const char* rest, parser.Lines(buf.data(), buf.data() + have));
    const size_t left = static_cast<size_t>(buf.data() + have - rest);
    if (left == kChunk) {
      return absl::DataLossError(absl::StrCat(path, ":", parser.lines() + 1, ": line longer than ", kChunk,
                                              " bytes (not a Criteo text file?)"));
    }
    std::memmove(buf.data(), rest, left);
    have = left;
    // Size the vectors once from the first chunk's lines per (compressed) byte, so that they need not double
    // (and briefly triple the memory) on the way: a few percent to spare.
    const z_off_t consumed = gzoffset(gz);
    if (!reserved && ec.value() == 0 && consumed > 0 && parser.lines() > 0) {
      reserved = true;
      const auto lines = static_cast<size_t>(1.03 * file_size / static_cast<double>(consumed) *
                                             static_cast<double>(parser.lines())) + 16;
      d.labels.reserve(lines);
      d.dense.reserve(lines * layout.num_dense);
      d.ids.reserve(lines * layout.num_sparse);
    }
  }
  if (have > 0) RETURN_IF_ERROR(parser.Line(buf.data(), buf.data() + have));
  RETURN_IF_ERROR(Finish(parser, path, d));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int64_t clicks = 0;
  for (int32_t label : d.labels) clicks += label;
  LOG(INFO) << "Read " << d.count() << " Criteo examples (" << layout.num_dense << " integer, "
            << layout.num_sparse << " categorical features; " << clicks << " clicks) from " << path << " in "
            << secs << " s (" << static_cast<int64_t>(static_cast<double>(d.count()) / std::max(secs, 1e-9))
            << " lines/s)";
  return d;
}

absl::StatusOr<CriteoLayout> ReadCriteoLayout(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / kCriteoLayoutFile).string();
  CriteoLayout layout;
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (absl::IsNotFound(text.status())) return layout;  // no layout file: Criteo's own 13 + 26
  if (!text.ok()) return text.status();
  for (absl::string_view item : absl::StrSplit(*text, absl::ByAnyChar(" \t\r\n"), absl::SkipEmpty())) {
    const std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    int* target = kv.first == "num_dense" ? &layout.num_dense : kv.first == "num_sparse" ? &layout.num_sparse
                                                                                          : nullptr;
    if (target == nullptr || !absl::SimpleAtoi(kv.second, target)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": cannot read \"", absl::CHexEscape(item),
                                                     "\"; expected e.g. \"num_dense=13 num_sparse=26\""));
    }
  }
  if (absl::Status s = CheckLayout(layout); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  }
  return layout;
}

absl::Status WriteCriteoLayout(const std::string& dir, const CriteoLayout& layout) {
  RETURN_IF_ERROR(CheckLayout(layout));
  const std::string path = (std::filesystem::path(dir) / kCriteoLayoutFile).string();
  return WriteFileAtomically(path,
                             absl::StrCat("num_dense=", layout.num_dense, " num_sparse=", layout.num_sparse, "\n"));
}

}  // namespace dtrain::data
