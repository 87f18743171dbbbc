#include "worker/models/onnx/onnx_external_data.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "worker/models/onnx/onnx_constants.h"
#include "worker/models/onnx/onnx_file.h"

namespace dtrain::models::onnx {
namespace {

using ::onnx::TensorProto;

// Bytes per element of a type raw_data can hold; 0 for STRING, UNDEFINED and unknown types.
int64_t ElementSize(int data_type) {
  switch (data_type) {
    case TensorProto::UINT8: case TensorProto::INT8: case TensorProto::BOOL:
      return 1;
    case TensorProto::UINT16: case TensorProto::INT16: case TensorProto::FLOAT16: case TensorProto::BFLOAT16:
      return 2;
    case TensorProto::FLOAT: case TensorProto::INT32: case TensorProto::UINT32:
      return 4;
    case TensorProto::INT64: case TensorProto::UINT64: case TensorProto::DOUBLE: case TensorProto::COMPLEX64:
      return 8;
    case TensorProto::COMPLEX128:
      return 16;
    default:
      return 0;
  }
}

bool HasInlineData(const TensorProto& t) {
  return t.has_raw_data() || t.float_data_size() > 0 || t.int32_data_size() > 0 || t.string_data_size() > 0 ||
         t.int64_data_size() > 0 || t.double_data_size() > 0 || t.uint64_data_size() > 0;
}

// One data file, opened once for all the tensors in it.
struct DataFile {
  std::string path;  // as opened: the model's directory + location
  int fd = -1;
  int64_t size = 0;
  std::string sha1;  // hex, computed when a tensor names a checksum
  ~DataFile() {
    if (fd >= 0) ::close(fd);
  }
};

class Loader {
 public:
  explicit Loader(const std::string& file) : file_(file), dir_(ParentDir(file)) {}

  // `t`'s external bytes into its raw_data; `what` names it ("initializer 'fc.weight'").
  absl::Status Load(TensorProto* t, const std::string& what);

 private:
  absl::Status Error(const std::string& what, absl::string_view problem) const {
    return absl::InvalidArgumentError(absl::StrCat(file_, ": ", what, ": ", problem));
  }
  absl::StatusOr<DataFile*> Open(const std::string& location, const std::string& what);
  absl::StatusOr<std::string> Sha1(DataFile* f, const std::string& what);

  const std::string file_;
  const std::string dir_;
  std::string real_dir_;  // realpath(dir_), once a file is opened
  std::map<std::string, std::unique_ptr<DataFile>> files_;  // by location
};

absl::StatusOr<DataFile*> Loader::Open(const std::string& location, const std::string& what) {
  auto it = files_.find(location);
  if (it != files_.end()) return it->second.get();
  const std::string where = absl::StrCat("its external data file '", location, "'");
  if (location.empty()) return Error(what, "its external data has an empty location");
  if (location.find('\0') != std::string::npos) return Error(what, absl::StrCat(where, " has a NUL in its name"));
  if (location[0] == '/') {
    return Error(what, absl::StrCat(where, " is an absolute path (supported: a path relative to the model's "
                                           "directory, as ONNX's checker requires)"));
  }
  for (absl::string_view part : absl::StrSplit(location, '/')) {
    if (part == "..") {
      return Error(what, absl::StrCat(where, " has a '..' part (supported: a file in the model's directory or "
                                             "below it, as ONNX's checker requires)"));
    }
  }
  auto f = std::make_unique<DataFile>();
  f->path = dir_ == "/" ? absl::StrCat("/", location) : absl::StrCat(dir_, "/", location);
  if (real_dir_.empty()) {
    char* real = ::realpath(dir_.c_str(), nullptr);
    if (real == nullptr) {
      return ErrnoToStatus(errno, absl::StrCat(file_, ": cannot resolve the model's directory '", dir_, "'"));
    }
    real_dir_ = real;
    ::free(real);
  }
  char* real = ::realpath(f->path.c_str(), nullptr);
  if (real == nullptr) {
    const int e = errno;
    if (e == ENOENT) {
      return absl::NotFoundError(absl::StrCat(file_, ": ", what, ": ", where, " does not exist (looked for '", f->path,
                                              "'; keep the data file beside the .onnx file as it was saved)"));
    }
    return ErrnoToStatus(e, absl::StrCat(file_, ": ", what, ": cannot resolve ", where, " ('", f->path, "')"));
  }
  const std::string resolved = real;
  ::free(real);
  const std::string inside = real_dir_ == "/" ? real_dir_ : absl::StrCat(real_dir_, "/");
  if (resolved.compare(0, inside.size(), inside) != 0) {
    // A symbolic link out of the directory: an archive that ships one could make the import read (and an export
    // write back out) any file the user can read.
    return Error(what, absl::StrCat(where, " resolves to '", resolved, "', outside the model's directory '",
                                    real_dir_, "' (a symbolic link pointing out; copy the file in instead)"));
  }
  f->fd = ::open(f->path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f->fd < 0) return ErrnoToStatus(errno, absl::StrCat(file_, ": ", what, ": cannot open ", where));
  struct stat st;
  if (::fstat(f->fd, &st) != 0) return ErrnoToStatus(errno, absl::StrCat(file_, ": ", what, ": cannot stat ", where));
  if (!S_ISREG(st.st_mode)) return Error(what, absl::StrCat(where, " is not a regular file"));
  f->size = st.st_size;
  DataFile* out = f.get();
  files_[location] = std::move(f);
  return out;
}

absl::StatusOr<std::string> Loader::Sha1(DataFile* f, const std::string& what) {
  if (!f->sha1.empty()) return f->sha1;
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (ctx == nullptr || EVP_DigestInit_ex(ctx.get(), EVP_sha1(), nullptr) != 1) {
    return absl::InternalError("OpenSSL: cannot start a SHA-1 digest");
  }
  std::string buffer(1 << 20, '\0');
  for (int64_t at = 0; at < f->size;) {
    const ssize_t n = ::pread(f->fd, buffer.data(), buffer.size(), at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, absl::StrCat(file_, ": ", what, ": cannot read '", f->path, "'"));
    if (n == 0) return absl::DataLossError(absl::StrCat(file_, ": ", what, ": '", f->path, "' shrank while read"));
    EVP_DigestUpdate(ctx.get(), buffer.data(), static_cast<size_t>(n));
    at += n;
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &length);
  static const char kHex[] = "0123456789abcdef";
  for (unsigned int i = 0; i < length; ++i) {
    f->sha1.push_back(kHex[digest[i] >> 4]);
    f->sha1.push_back(kHex[digest[i] & 15]);
  }
  return f->sha1;
}

absl::Status Loader::Load(TensorProto* t, const std::string& what) {
  std::map<std::string, std::string> keys;
  for (const ::onnx::StringStringEntryProto& e : t->external_data()) {
    if (e.key() != "location" && e.key() != "offset" && e.key() != "length" && e.key() != "checksum") {
      return Error(what, absl::StrCat("unknown external data key '", e.key(), "' (supported: location, offset, "
                                      "length, checksum)"));
    }
    if (!keys.emplace(e.key(), e.value()).second) {
      return Error(what, absl::StrCat("external data key '", e.key(), "' appears twice"));
    }
  }
  if (keys.count("location") == 0) return Error(what, "its external data has no location");
  if (HasInlineData(*t)) {
    return Error(what, "it holds data inside the .onnx file as well as in external data (ONNX allows one)");
  }
  const int64_t element = ElementSize(t->data_type());
  if (element == 0) {
    return Error(what, absl::StrCat("its type ", DataTypeName(t->data_type()), " cannot be external data "
                                    "(supported: numeric and BOOL tensors)"));
  }
  // dims x element size, refusing what no file could hold.
  int64_t want = element;
  for (int64_t d : t->dims()) {
    if (d < 0) return Error(what, absl::StrCat("it has a negative dimension (", absl::StrJoin(t->dims(), "x"), ")"));
    if (d != 0 && want > INT64_MAX / d) {
      return Error(what, absl::StrCat("its dims ", absl::StrJoin(t->dims(), "x"), " overflow 64 bits"));
    }
    want *= d;
  }
  const std::string& location = keys["location"];
  ASSIGN_OR_RETURN(DataFile * f, Open(location, what));
  const std::string in = absl::StrCat("its external data in '", location, "' (", f->size, " bytes)");
  int64_t offset = 0, length = -1;
  for (const char* key : {"offset", "length"}) {
    auto it = keys.find(key);
    if (it == keys.end()) continue;
    int64_t v;
    if (!absl::SimpleAtoi(it->second, &v) || v < 0) {
      return Error(what, absl::StrCat("external data ", key, " '", it->second, "' is not a non-negative integer"));
    }
    (it->first == "offset" ? offset : length) = v;
  }
  if (offset > f->size) return Error(what, absl::StrCat(in, ": offset ", offset, " is past the end of the file"));
  if (length < 0) length = f->size - offset;  // ONNX: to the end of the file
  if (length > f->size - offset) {
    return Error(what, absl::StrCat(in, ": offset ", offset, " + length ", length, " runs past the end of the file"));
  }
  if (length != want) {
    return Error(what, absl::StrCat(in, ": length ", length, " bytes, but its dims ", absl::StrJoin(t->dims(), "x"),
                                    " of ", DataTypeName(t->data_type()), " take ", want, " bytes"));
  }
  auto checksum = keys.find("checksum");
  if (checksum != keys.end()) {
    ASSIGN_OR_RETURN(std::string sha1, Sha1(f, what));
    if (absl::AsciiStrToLower(checksum->second) != sha1) {
      return Error(what, absl::StrCat(in, ": checksum '", checksum->second, "' is not the file's SHA-1 (", sha1,
                                      "): the file changed since the model was saved"));
    }
  }
  std::string* raw = t->mutable_raw_data();
  raw->resize(static_cast<size_t>(length));
  for (int64_t done = 0; done < length;) {
    const size_t chunk = static_cast<size_t>(std::min<int64_t>(length - done, int64_t{1} << 30));
    const ssize_t n = ::pread(f->fd, raw->data() + done, chunk, offset + done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, absl::StrCat(file_, ": ", what, ": cannot read ", in));
    if (n == 0) return absl::DataLossError(absl::StrCat(file_, ": ", what, ": ", in, ": the file shrank while read"));
    done += n;
  }
  t->clear_external_data();
  t->clear_data_location();
  return absl::OkStatus();
}

}  // namespace

absl::Status ModelFileTooLarge(const std::string& file, int64_t size) {
  return absl::InvalidArgumentError(absl::StrCat(
      file, ": ", size, " bytes, over protobuf's limit of ", kMaxProtobufBytes, " bytes (2 GB) on one message: no "
      "ONNX reader can parse a model file this large; save its weights as external data beside it "
      "(torch.onnx.export does so by itself for a model over 2 GB; or onnx.save_model(model, path, "
      "save_as_external_data=True, all_tensors_to_one_file=True, location='NAME.onnx.data'))"));
}

absl::Status LoadExternalData(const std::string& file, ::onnx::ModelProto* model, bool* loaded) {
  *loaded = false;
  Loader loader(file);
  auto load = [&](TensorProto* t, const std::string& what) -> absl::Status {
    if (t->data_location() != TensorProto::EXTERNAL) {
      if (t->external_data_size() > 0) {
        return absl::InvalidArgumentError(absl::StrCat(file, ": ", what, ": it has external data entries but its "
                                                       "data_location is not EXTERNAL"));
      }
      return absl::OkStatus();
    }
    *loaded = true;
    return loader.Load(t, what);
  };
  ::onnx::GraphProto* g = model->mutable_graph();
  for (TensorProto& t : *g->mutable_initializer()) {
    RETURN_IF_ERROR(load(&t, absl::StrCat("initializer '", t.name(), "'")));
  }
  for (int i = 0; i < g->node_size(); ++i) {
    ::onnx::NodeProto* n = g->mutable_node(i);
    const std::string node = absl::StrCat("node '", NodeName(*n, i), "' (", n->op_type(), ")");
    for (::onnx::AttributeProto& a : *n->mutable_attribute()) {
      if (a.has_t()) RETURN_IF_ERROR(load(a.mutable_t(), absl::StrCat(node, ": attribute ", a.name())));
      for (int k = 0; k < a.tensors_size(); ++k) {
        RETURN_IF_ERROR(load(a.mutable_tensors(k), absl::StrCat(node, ": attribute ", a.name(), "[", k, "]")));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status WriteExternalData(const std::vector<ExternalTensor>& tensors, const std::string& location,
                               WritableFile* out) {
  static const std::string kZeros(kExternalDataAlignment, '\0');
  int64_t at = 0;
  for (const ExternalTensor& e : tensors) {
    const int64_t pad = (kExternalDataAlignment - at % kExternalDataAlignment) % kExternalDataAlignment;
    if (pad > 0) RETURN_IF_ERROR(out->Append(absl::string_view(kZeros).substr(0, static_cast<size_t>(pad))));
    at += pad;
    RETURN_IF_ERROR(out->Append(e.bytes));
    TensorProto* t = e.tensor;
    t->clear_raw_data();
    t->clear_float_data();
    t->clear_int32_data();
    t->clear_string_data();
    t->clear_int64_data();
    t->clear_double_data();
    t->clear_uint64_data();
    t->clear_external_data();
    t->set_data_location(TensorProto::EXTERNAL);
    for (const auto& [key, value] : {std::pair<const char*, std::string>("location", location),
                                     {"offset", absl::StrCat(at)},
                                     {"length", absl::StrCat(e.bytes.size())}}) {
      auto* entry = t->add_external_data();
      entry->set_key(key);
      entry->set_value(value);
    }
    at += static_cast<int64_t>(e.bytes.size());
  }
  return absl::OkStatus();
}

}  // namespace dtrain::models::onnx
