// CTR Datasets: consistency, batches, TFRecord files (ctr_dataset.h).
#include "worker/data/ctr_dataset.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/data/example_proto.h"

namespace dtrain::data {
namespace {

absl::Status Inconsistent(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("inconsistent CTR Dataset: ", what));
}

}  // namespace

absl::Status CheckCtrDataset(const Dataset& d) {
  const int64_t n = d.count();
  if (d.num_dense < 0 || d.num_sparse < 0 || d.num_dense + d.num_sparse == 0) {
    return Inconsistent(absl::StrCat(d.num_dense, " dense and ", d.num_sparse, " sparse features"));
  }
  if (static_cast<int64_t>(d.dense.size()) != n * d.num_dense) {
    return Inconsistent(absl::StrCat(d.dense.size(), " dense values for ", n, " examples of ", d.num_dense));
  }
  const int64_t bags = n * d.num_sparse;
  if (d.id_offsets.empty()) {
    if (static_cast<int64_t>(d.ids.size()) != bags) {
      return Inconsistent(absl::StrCat(d.ids.size(), " ids and no offsets for ", n, " examples of ", d.num_sparse,
                                       " sparse features (one id each)"));
    }
  } else {
    if (static_cast<int64_t>(d.id_offsets.size()) != bags + 1) {
      return Inconsistent(absl::StrCat(d.id_offsets.size(), " id offsets for ", n, " examples of ", d.num_sparse,
                                       " sparse features (want ", bags + 1, ")"));
    }
    if (d.id_offsets.front() != 0 || d.id_offsets.back() != static_cast<int64_t>(d.ids.size())) {
      return Inconsistent(absl::StrCat("id offsets run from ", d.id_offsets.front(), " to ", d.id_offsets.back(),
                                       ", not from 0 to ", d.ids.size()));
    }
    for (int64_t i = 0; i < bags; ++i) {
      if (d.id_offsets[i + 1] < d.id_offsets[i]) return Inconsistent(absl::StrCat("id offset ", i + 1, " decreases"));
    }
  }
  for (int64_t e = 0; e < n; ++e) {
    if (d.labels[e] != 0 && d.labels[e] != 1) {
      return Inconsistent(absl::StrCat("label ", d.labels[e], " of example ", e, " is not 0 or 1"));
    }
  }
  return absl::OkStatus();
}

void StartCtrBatch(const Dataset& d, int batch, Batch* b) {
  b->batch = 0;
  b->height = b->width = b->channels = 0;
  b->images.clear();
  b->num_dense = d.num_dense;
  b->num_sparse = d.num_sparse;
  b->labels.clear();
  b->labels.reserve(batch);
  b->dense.clear();
  b->dense.reserve(static_cast<size_t>(batch) * d.num_dense);
  b->ids.clear();
  b->ids.reserve(static_cast<size_t>(batch) * d.num_sparse);
  b->id_offsets.assign(1, 0);
  b->id_offsets.reserve(static_cast<size_t>(batch) * d.num_sparse + 1);
}

void AppendCtrExample(const Dataset& d, int64_t e, Batch* b) {
  b->labels.push_back(static_cast<float>(d.labels[e]));
  const float* dense = d.dense.data() + e * d.num_dense;
  b->dense.insert(b->dense.end(), dense, dense + d.num_dense);
  for (int f = 0; f < d.num_sparse; ++f) {
    const absl::Span<const int64_t> bag = d.Bag(e, f);
    b->ids.insert(b->ids.end(), bag.begin(), bag.end());
    CHECK_LE(b->ids.size(), static_cast<size_t>(std::numeric_limits<int32_t>::max()))
        << "a batch of more than 2^31 ids";
    b->id_offsets.push_back(static_cast<int32_t>(b->ids.size()));
  }
  ++b->batch;
}

absl::StatusOr<Dataset> ReadCtrRecords(TfRecordReader& reader, const std::string& first, const std::string& path) {
  Dataset d;
  d.num_classes = 2;
  // The compact layout (dataset.h) until a bag of another size shows up; then the offsets so far are written.
  bool one_id_per_bag = true;
  CtrExample e;
  std::string record = first;
  for (int64_t index = 0;; ++index) {
    int64_t offset = 0;  // the first record starts the file
    if (index > 0) {
      offset = reader.offset();
      ASSIGN_OR_RETURN(bool got, reader.Read(&record));
      if (!got) break;
    }
    auto where = [&] { return absl::StrCat(path, ": record ", index, " at byte offset ", offset, ": "); };
    if (absl::Status s = DecodeCtrExample(record, &e); !s.ok()) {
      return absl::DataLossError(absl::StrCat(where(), s.message()));
    }
    const int num_dense = static_cast<int>(e.dense.size()), num_sparse = e.num_sparse();
    if (index == 0) {
      if (num_dense + num_sparse == 0) {
        return absl::InvalidArgumentError(absl::StrCat(where(), "a CTR example without dense or sparse features"));
      }
      d.num_dense = num_dense;
      d.num_sparse = num_sparse;
    } else if (num_dense != d.num_dense || num_sparse != d.num_sparse) {
      return absl::InvalidArgumentError(absl::StrCat(where(), num_dense, " dense and ", num_sparse,
                                                     " sparse features, earlier examples have ", d.num_dense,
                                                     " and ", d.num_sparse));
    }
    d.labels.push_back(static_cast<int32_t>(e.label));
    d.dense.insert(d.dense.end(), e.dense.begin(), e.dense.end());
    const auto base = static_cast<int64_t>(d.ids.size());
    d.ids.insert(d.ids.end(), e.ids.begin(), e.ids.end());
    bool ones = true;
    for (int f = 0; f < num_sparse; ++f) ones &= e.id_offsets[f + 1] - e.id_offsets[f] == 1;
    if (one_id_per_bag && !ones) {
      one_id_per_bag = false;
      for (int64_t i = 0; i <= base; ++i) d.id_offsets.push_back(i);
    }
    if (!one_id_per_bag) {
      for (int f = 0; f < num_sparse; ++f) d.id_offsets.push_back(base + e.id_offsets[f + 1]);
    }
  }
  LOG(INFO) << "Read " << d.count() << " CTR examples (" << d.num_dense << " dense, " << d.num_sparse
            << " sparse features) from " << path;
  return d;
}

absl::Status WriteCtrRecords(const Dataset& d, const std::string& path) {
  if (absl::Status s = CheckCtrDataset(d); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("WriteTfRecordExamples(", path, "): ", s.message()));
  }
  TfRecordWriter writer;
  RETURN_IF_ERROR(writer.Open(path));
  CtrExample e;
  for (int64_t i = 0; i < d.count(); ++i) {
    e.label = d.labels[i];
    e.dense.assign(d.dense.begin() + i * d.num_dense, d.dense.begin() + (i + 1) * d.num_dense);
    e.ids.clear();
    e.id_offsets.assign(1, 0);
    for (int f = 0; f < d.num_sparse; ++f) {
      const absl::Span<const int64_t> bag = d.Bag(i, f);
      e.ids.insert(e.ids.end(), bag.begin(), bag.end());
      e.id_offsets.push_back(static_cast<int64_t>(e.ids.size()));
    }
    if (d.num_sparse == 0) e.id_offsets.clear();
    RETURN_IF_ERROR(writer.Write(EncodeCtrExample(e)));
  }
  return writer.Close();
}

}  // namespace dtrain::data
