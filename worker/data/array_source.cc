#include "worker/data/array_source.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/data/example_source.h"

namespace dtrain::data {
namespace {

std::string Join(const std::string& dir, const std::string& name) {
  if (dir.empty() || dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Examples of an array (x without its first axis) as floats, HWC.
class ArraySource : public ExampleSource {
 public:
  ArraySource(const NpyArray& x, std::shared_ptr<const void> keep, int h, int w, int c, bool nchw, std::string name)
      : x_(x), keep_(std::move(keep)), h_(h), w_(w), c_(c), nchw_(nchw), name_(std::move(name)) {
    per_example_ = static_cast<int64_t>(h) * w * c;
  }

  int64_t size() const override { return x_.shape.empty() ? 0 : x_.shape[0]; }
  bool bytes() const override { return x_.type == NpyType::kU8; }
  bool can_fail() const override { return false; }
  std::string Name(int64_t i) const override { return absl::StrCat(name_, "[", i, "]"); }

  absl::Status Read(int64_t i, bool augment, std::mt19937_64* rng, float* out) const override {
    const int64_t first = i * per_example_;
    if (!nchw_) {
      Convert(first, per_example_, out);
      return absl::OkStatus();
    }
    // [C, H, W] stored, [H, W, C] wanted: one channel plane at a time.
    thread_local std::vector<float> plane;
    plane.resize(static_cast<size_t>(h_) * w_);
    for (int c = 0; c < c_; ++c) {
      Convert(first + static_cast<int64_t>(c) * h_ * w_, static_cast<int64_t>(h_) * w_, plane.data());
      for (int64_t p = 0; p < static_cast<int64_t>(h_) * w_; ++p) out[p * c_ + c] = plane[p];
    }
    return absl::OkStatus();
  }

 private:
  // Elements [first, first + n) of x as floats.
  void Convert(int64_t first, int64_t n, float* out) const {
    const char* p = x_.data + first * x_.element_size();
    switch (x_.type) {
      case NpyType::kU8: {
        const auto* b = reinterpret_cast<const uint8_t*>(p);
        for (int64_t k = 0; k < n; ++k) out[k] = b[k] * (1.0f / 255.0f);
        return;
      }
      case NpyType::kF32:
        std::memcpy(out, p, static_cast<size_t>(n) * 4);
        return;
      case NpyType::kF16:
        for (int64_t k = 0; k < n; ++k) {
          uint16_t h;
          std::memcpy(&h, p + 2 * k, 2);
          out[k] = HalfToFloat(h);
        }
        return;
      default:
        for (int64_t k = 0; k < n; ++k) out[k] = static_cast<float>(NpyValue(x_, first + k));
    }
  }

  const NpyArray x_;
  const std::shared_ptr<const void> keep_;
  const int h_, w_, c_;
  const bool nchw_;
  const std::string name_;
  int64_t per_example_ = 0;
};

// The examples' H x W x C for x's shape beyond N, and whether it is stored channels-first.
absl::Status Geometry(const std::vector<int64_t>& shape, ArrayLayout layout, const std::string& name, int* h, int* w,
                      int* c, bool* nchw) {
  *nchw = false;
  std::vector<int64_t> d(shape.begin() + 1, shape.end());
  int64_t product = 1;
  for (int64_t v : d) product *= v;
  auto fits = [](int64_t v) { return v > 0 && v <= (int64_t{1} << 30); };
  if (!fits(product)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": examples of shape (", absl::StrJoin(d, ", "),
                                                   ") are empty or too large"));
  }
  int64_t H = 1, W = 1, C = product;
  if (d.size() == 2) {
    H = d[0], W = d[1], C = 1;
  } else if (d.size() == 3) {
    auto small = [](int64_t v) { return v == 1 || v == 3 || v == 4; };
    bool channels_first = layout == ArrayLayout::kNchw;
    if (layout == ArrayLayout::kAuto) channels_first = !small(d[2]) && small(d[0]);
    if (channels_first) {
      C = d[0], H = d[1], W = d[2];
      *nchw = true;
    } else {
      H = d[0], W = d[1], C = d[2];
    }
  }
  *h = static_cast<int>(H), *w = static_cast<int>(W), *c = static_cast<int>(C);
  return absl::OkStatus();
}

// y as labels.
absl::StatusOr<std::vector<int32_t>> Labels(const NpyArray& y, int64_t n, const std::string& name) {
  if (!(y.shape.size() == 1 || (y.shape.size() == 2 && y.shape[1] == 1)) || y.shape[0] != n) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": labels of shape (", absl::StrJoin(y.shape, ", "),
                                                   ") for ", n, " examples; expected (", n, ") or (", n, ", 1)"));
  }
  std::vector<int32_t> labels(n);
  for (int64_t i = 0; i < n; ++i) {
    const double v = NpyValue(y, i);
    if (!(v >= 0 && v < (1 << 30) && v == std::floor(v))) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": label ", i, " is ", v, ", not a class index (an integer >= 0)"));
    }
    labels[i] = static_cast<int32_t>(v);
  }
  return labels;
}

// Train and test share one class count: the largest label of either + 1.
void SetClassCount(DatasetPair* p) {
  int32_t top = 0;
  for (const Dataset* d : {&p->train, &p->test}) {
    for (int32_t l : d->labels) top = std::max(top, l);
  }
  p->train.num_classes = p->test.num_classes = std::max<int32_t>(top + 1, p->train.class_names.size());
}

// The held-out part of `train` as the test set.
absl::Status SplitOff(double fraction, const std::string& what, DatasetPair* p) {
  if (!(fraction > 0 && fraction < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " has no test part: add one, or hold out part of the training examples with a validation split "
        "(--validation_split=0.1)"));
  }
  std::vector<int64_t> kept, held;
  SplitEvenly(p->train.count(), fraction, &kept, &held);
  if (kept.empty() || held.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("a validation split of ", fraction, " of ", p->train.count(),
                                                   " examples in ", what, " leaves one part empty"));
  }
  const Dataset all = p->train;
  auto subset = [&all](const std::vector<int64_t>& idx) {
    Dataset d = all;
    d.labels.clear();
    for (int64_t i : idx) d.labels.push_back(all.labels[i]);
    d.source = SubsetSource(all.source, idx);
    return d;
  };
  p->train = subset(kept);
  p->test = subset(held);
  return absl::OkStatus();
}

absl::Status CheckNoSplit(double fraction, const std::string& test) {
  if (fraction > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a validation split of ", fraction, " was asked for but ", test, " exists: use one or the other"));
  }
  return absl::OkStatus();
}

// ---- NumPy ----

// One file's arrays: its mapping, the inflated members, and the .npy bytes by name.
struct NpzFile {
  std::shared_ptr<const MappedFile> file;
  std::shared_ptr<std::vector<std::unique_ptr<std::string>>> inflated;
  NpzMembers members;
};

absl::StatusOr<NpzFile> OpenNpz(const std::string& path) {
  NpzFile f;
  ASSIGN_OR_RETURN(f.file, MappedFile::Open(path));
  f.inflated = std::make_shared<std::vector<std::unique_ptr<std::string>>>();
  ASSIGN_OR_RETURN(f.members, ParseNpz(f.file->bytes(), path, f.inflated.get()));
  return f;
}

struct Keep {
  std::vector<std::shared_ptr<const void>> parts;
};

absl::StatusOr<Dataset> FromNpz(const NpzFile& f, const std::string& path, const std::string& x_name,
                                const std::string& y_name, ArrayLayout layout) {
  std::vector<std::string> names;
  for (const auto& [n, bytes] : f.members) names.push_back(n);
  for (const std::string& n : {x_name, y_name}) {
    if (f.members.count(n) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, " has no array '", n, "' (it has ", absl::StrJoin(names, ", "),
                                                     "; name the arrays with --npz_arrays=X,Y)"));
    }
  }
  ASSIGN_OR_RETURN(NpyArray x, ParseNpy(f.members.at(x_name), absl::StrCat(path, ":", x_name)));
  ASSIGN_OR_RETURN(NpyArray y, ParseNpy(f.members.at(y_name), absl::StrCat(path, ":", y_name)));
  auto keep = std::make_shared<Keep>();
  keep->parts = {f.file, f.inflated};
  return ArrayDataset(x, y, keep, layout, absl::StrCat(path, ":", x_name));
}

absl::StatusOr<Dataset> FromNpyFiles(const std::string& x_path, const std::string& y_path, ArrayLayout layout) {
  ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> xf, MappedFile::Open(x_path));
  ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> yf, MappedFile::Open(y_path));
  ASSIGN_OR_RETURN(NpyArray x, ParseNpy(xf->bytes(), x_path));
  ASSIGN_OR_RETURN(NpyArray y, ParseNpy(yf->bytes(), y_path));
  return ArrayDataset(x, y, xf, layout, x_path);
}

// The one .npz in dir other than train.npz / test.npz, if there is exactly one.
std::string OtherNpz(const std::string& dir) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (absl::EndsWith(name, ".npz") && name != "train.npz" && name != "test.npz" && e.is_regular_file(ec)) {
      found.push_back(e.path().string());
    }
  }
  return found.size() == 1 ? found[0] : "";
}

// ---- CSV ----

// The fields of one line, with RFC 4180 quotes.
std::vector<std::string> SplitCsvLine(absl::string_view line) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        fields.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        fields.back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      fields.emplace_back();
    } else {
      fields.back() += c;
    }
  }
  for (std::string& f : fields) f = std::string(absl::StripAsciiWhitespace(f));
  return fields;
}

bool IsNumber(const std::string& s) {
  float v;
  return absl::SimpleAtof(s, &v);
}

absl::StatusOr<std::string> ReadMaybeGz(const std::string& path) {
  gzFile gz = gzopen(path.c_str(), "rb");
  if (gz == nullptr) {
    return IsRegularFile(path) ? absl::PermissionDeniedError(absl::StrCat("cannot open ", path))
                               : absl::NotFoundError(absl::StrCat("cannot open ", path));
  }
  std::string text;
  char buf[1 << 16];
  while (true) {
    const int n = gzread(gz, buf, sizeof(buf));
    if (n < 0) {
      int errnum;
      const std::string message = gzerror(gz, &errnum);
      gzclose(gz);
      return absl::DataLossError(absl::StrCat(path, ": ", message));
    }
    if (n == 0) break;
    text.append(buf, n);
  }
  gzclose(gz);
  return text;
}

std::string FindMaybeGz(const std::string& dir, const std::string& name) {
  for (const std::string& p : {Join(dir, name), Join(dir, name + ".gz")}) {
    if (IsRegularFile(p)) return p;
  }
  return "";
}

}  // namespace

absl::StatusOr<Dataset> ArrayDataset(const NpyArray& x, const NpyArray& y, std::shared_ptr<const void> keep,
                                     ArrayLayout layout, const std::string& name) {
  if (x.shape.empty() || x.shape[0] == 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": no examples (shape (", absl::StrJoin(x.shape, ", "), "))"));
  }
  Dataset d;
  bool nchw;
  RETURN_IF_ERROR(Geometry(x.shape, layout, name, &d.height, &d.width, &d.channels, &nchw));
  ASSIGN_OR_RETURN(d.labels, Labels(y, x.shape[0], name));
  d.source = std::make_shared<ArraySource>(x, std::move(keep), d.height, d.width, d.channels, nchw, name);
  int32_t top = 0;
  for (int32_t l : d.labels) top = std::max(top, l);
  d.num_classes = top + 1;
  return d;
}

bool LooksLikeNpy(const std::string& dir) {
  return IsRegularFile(Join(dir, "train.npz")) ||
         (IsRegularFile(Join(dir, "x_train.npy")) && IsRegularFile(Join(dir, "y_train.npy"))) || !OtherNpz(dir).empty();
}

absl::StatusOr<DatasetPair> ReadNpyDataset(const std::string& dir, const LoadOptions& o) {
  DatasetPair p;
  p.format = "npy";
  std::string what, test_what;
  bool have_test = false;
  if (IsRegularFile(Join(dir, "train.npz"))) {
    what = Join(dir, "train.npz");
    ASSIGN_OR_RETURN(NpzFile f, OpenNpz(what));
    ASSIGN_OR_RETURN(p.train, FromNpz(f, what, o.x_name, o.y_name, o.layout));
    test_what = Join(dir, "test.npz");
    if (IsRegularFile(test_what)) {
      ASSIGN_OR_RETURN(NpzFile t, OpenNpz(test_what));
      ASSIGN_OR_RETURN(p.test, FromNpz(t, test_what, o.x_name, o.y_name, o.layout));
      have_test = true;
    }
  } else if (IsRegularFile(Join(dir, "x_train.npy")) && IsRegularFile(Join(dir, "y_train.npy"))) {
    what = Join(dir, "x_train.npy");
    ASSIGN_OR_RETURN(p.train, FromNpyFiles(what, Join(dir, "y_train.npy"), o.layout));
    test_what = Join(dir, "x_test.npy");
    if (IsRegularFile(test_what) && IsRegularFile(Join(dir, "y_test.npy"))) {
      ASSIGN_OR_RETURN(p.test, FromNpyFiles(test_what, Join(dir, "y_test.npy"), o.layout));
      have_test = true;
    }
  } else if (std::string npz = OtherNpz(dir); !npz.empty()) {
    what = test_what = npz;
    ASSIGN_OR_RETURN(NpzFile f, OpenNpz(npz));
    ASSIGN_OR_RETURN(p.train, FromNpz(f, npz, "x_train", "y_train", o.layout));
    if (f.members.count("x_test") && f.members.count("y_test")) {
      ASSIGN_OR_RETURN(p.test, FromNpz(f, npz, "x_test", "y_test", o.layout));
      have_test = true;
    }
  } else {
    return absl::NotFoundError(absl::StrCat("no NumPy data set in ", dir, "; looked for train.npz [+ test.npz], ",
                                            "x_train.npy + y_train.npy [+ x_test.npy + y_test.npy], or one .npz "
                                            "holding x_train, y_train [, x_test, y_test]"));
  }
  if (have_test) {
    RETURN_IF_ERROR(CheckNoSplit(o.validation_split, test_what));
  } else {
    RETURN_IF_ERROR(SplitOff(o.validation_split, what, &p));
  }
  SetClassCount(&p);
  LOG(INFO) << "NumPy arrays " << what << ": " << p.train.count() << " training and " << p.test.count()
            << " test examples of " << p.train.height << "x" << p.train.width << "x" << p.train.channels << ", "
            << p.train.num_classes << " classes";
  return p;
}

absl::StatusOr<Dataset> ParseCsv(absl::string_view text, const std::string& name, const std::string& label_column,
                                 std::vector<std::string>* classes) {
  std::vector<std::vector<std::string>> rows;
  std::vector<int64_t> line_numbers;
  int64_t line_number = 0;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == absl::string_view::npos) end = text.size();
    absl::string_view line = text.substr(at, end - at);
    at = end + 1;
    ++line_number;
    absl::ConsumeSuffix(&line, "\r");
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    rows.push_back(SplitCsvLine(line));
    line_numbers.push_back(line_number);
  }
  if (rows.empty()) return absl::InvalidArgumentError(absl::StrCat(name, ": no rows"));
  const int columns = static_cast<int>(rows[0].size());
  int label = -1;
  bool header = false;
  int index;
  if (absl::SimpleAtoi(label_column, &index)) {
    label = index < 0 ? columns + index : index;
    if (label < 0 || label >= columns) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": label column ", label_column, " is not among its ",
                                                     columns, " columns"));
    }
    for (int c = 0; c < columns; ++c) header = header || (c != label && !IsNumber(rows[0][c]));
  } else {
    header = true;
    for (int c = 0; c < columns; ++c) {
      if (rows[0][c] == label_column) label = c;
    }
    if (label < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": no column named '", label_column, "' in the first line (", absl::StrJoin(rows[0], ","),
          "); name the label column with --label_column=NAME, or give its 0-based index"));
    }
  }
  const size_t first = header ? 1 : 0;
  const int64_t n = static_cast<int64_t>(rows.size() - first);
  if (n == 0) return absl::InvalidArgumentError(absl::StrCat(name, ": a header and no rows"));
  const int features = columns - 1;
  if (features == 0) return absl::InvalidArgumentError(absl::StrCat(name, ": no feature columns besides the label"));
  auto values = std::make_shared<std::vector<float>>(static_cast<size_t>(n) * features);
  std::vector<std::string> label_text(n);
  auto column_name = [&](int c) { return header ? absl::StrCat(" (", rows[0][c], ")") : std::string(); };
  for (int64_t r = 0; r < n; ++r) {
    const std::vector<std::string>& row = rows[first + r];
    const int64_t line = line_numbers[first + r];
    if (static_cast<int>(row.size()) != columns) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": line ", line, " has ", row.size(), " fields, the first line ", columns));
    }
    float* out = values->data() + r * features;
    for (int c = 0, f = 0; c < columns; ++c) {
      if (c == label) {
        label_text[r] = row[c];
        continue;
      }
      if (row[c].empty() || !absl::SimpleAtof(row[c], &out[f]) || !std::isfinite(out[f])) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, ": line ", line, ", column ", c, column_name(c), ": ",
            row[c].empty() ? std::string("empty value") : absl::StrCat("'", row[c], "' is not a number"),
            " (features must be numbers; fill in or drop missing values first)"));
      }
      ++f;
    }
  }
  Dataset d;
  d.height = d.width = 1;
  d.channels = features;
  d.labels.resize(n);
  const bool named = classes != nullptr && !classes->empty();
  bool integers = !named;
  for (int64_t r = 0; r < n && integers; ++r) {
    integers = absl::SimpleAtoi(label_text[r], &d.labels[r]) && d.labels[r] >= 0;
  }
  if (!integers) {
    std::vector<std::string> names;
    if (named) {
      names = *classes;
    } else {
      names = label_text;
      std::sort(names.begin(), names.end());
      names.erase(std::unique(names.begin(), names.end()), names.end());
    }
    for (int64_t r = 0; r < n; ++r) {
      auto it = std::lower_bound(names.begin(), names.end(), label_text[r]);
      if (it == names.end() || *it != label_text[r]) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": line ", line_numbers[first + r], ": label '",
                                                       label_text[r], "' is not a class of the training file (",
                                                       absl::StrJoin(names, ", "), ")"));
      }
      d.labels[r] = static_cast<int32_t>(it - names.begin());
    }
    d.class_names = names;
    if (classes != nullptr) *classes = names;
  }
  NpyArray x;
  x.type = NpyType::kF32;
  x.shape = {n, features};
  x.data = reinterpret_cast<const char*>(values->data());
  d.source = std::make_shared<ArraySource>(x, values, 1, 1, features, false, name);
  int32_t top = 0;
  for (int32_t l : d.labels) top = std::max(top, l);
  d.num_classes = std::max<int>(top + 1, d.class_names.size());
  return d;
}

bool LooksLikeCsv(const std::string& dir) { return !FindMaybeGz(dir, "train.csv").empty(); }

absl::StatusOr<DatasetPair> ReadCsvDataset(const std::string& dir, const LoadOptions& o) {
  const std::string train = FindMaybeGz(dir, "train.csv");
  if (train.empty()) return absl::NotFoundError(absl::StrCat("no CSV data set in ", dir, "; looked for train.csv[.gz]"));
  std::string test = FindMaybeGz(dir, "test.csv");
  if (test.empty()) test = FindMaybeGz(dir, "val.csv");
  DatasetPair p;
  p.format = "csv";
  std::vector<std::string> classes;
  ASSIGN_OR_RETURN(std::string text, ReadMaybeGz(train));
  ASSIGN_OR_RETURN(p.train, ParseCsv(text, train, o.label_column, &classes));
  if (!test.empty()) {
    RETURN_IF_ERROR(CheckNoSplit(o.validation_split, test));
    ASSIGN_OR_RETURN(text, ReadMaybeGz(test));
    std::vector<std::string> test_classes = classes;
    ASSIGN_OR_RETURN(p.test, ParseCsv(text, test, o.label_column, &test_classes));
    if (classes.empty() && !p.test.class_names.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(test, ": labels are names (", p.test.class_names[0], ", ...) but ",
                                                     train, "'s are integers"));
    }
    if (p.test.channels != p.train.channels) {
      return absl::InvalidArgumentError(absl::StrCat(test, " has ", p.test.channels, " feature columns, ", train,
                                                     " has ", p.train.channels));
    }
  } else {
    RETURN_IF_ERROR(SplitOff(o.validation_split, train, &p));
  }
  SetClassCount(&p);
  LOG(INFO) << "CSV " << train << ": " << p.train.count() << " training and " << p.test.count() << " test rows of "
            << p.train.channels << " features, " << p.train.num_classes << " classes";
  return p;
}

}  // namespace dtrain::data
