#include "ps/checkpoint/delta_writer.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "ps/checkpoint/delta_chain.h"

namespace dtrain::ps {

absl::Status ValidateDeltaOptions(const DeltaOptions& o) {
  if (!(o.every_secs >= 0) || !std::isfinite(o.every_secs) || o.every_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--delta_every_secs=", o.every_secs, " and --delta_every_steps=",
                                                   o.every_steps, " must be >= 0"));
  }
  if ((o.every_secs > 0 || o.every_steps > 0) && o.dir.empty()) {
    return absl::InvalidArgumentError("--delta_every_secs needs --delta_dir (or --checkpoint_dir, its default)");
  }
  return absl::OkStatus();
}

DeltaWriter::DeltaWriter(const DeltaOptions& o, Env* env, int task, int num_ps)
    : options_(o), env_(env), task_(task), num_ps_(num_ps) {
  CHECK(o.enabled()) << "DeltaWriter without a directory or an interval";
  thread_ = std::thread([this] { Loop(); });
}

DeltaWriter::~DeltaWriter() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

bool DeltaWriter::busy() const {
  absl::MutexLock lock(&mu_);
  return queued_.has_value() || writing_;
}

void DeltaWriter::Submit(DeltaData delta) {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](std::optional<DeltaData>* q) { return !q->has_value(); }, &queued_));
  queued_ = std::move(delta);
}

DeltaData DeltaWriter::TakeSpare() {
  absl::MutexLock lock(&mu_);
  if (!spare_.has_value()) return DeltaData();
  DeltaData d = std::move(*spare_);
  spare_.reset();
  return d;
}

namespace {

// Empties every vector of `d` whose capacity is worth keeping (the changed rows and the removed ids).
void EmptyKeepingCapacity(DeltaData* d) {
  for (SparseTableState& t : d->state.tables) {
    t.ids.clear();
    t.values.clear();
    for (std::vector<float>& slot : t.slots) slot.clear();
  }
  for (std::vector<int64_t>& r : d->removed) r.clear();
  d->state.slices.clear();
  d->state.input_positions.clear();
}

}  // namespace

void DeltaWriter::Flush() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](DeltaWriter* w) ABSL_NO_THREAD_SAFETY_ANALYSIS { return !w->queued_.has_value() && !w->writing_; }, this));
}

void DeltaWriter::NoteSnapshot(int64_t step) {
  absl::MutexLock lock(&mu_);
  if (step <= snapshots_[0]) return;
  snapshots_[1] = snapshots_[0];
  snapshots_[0] = step;
  if (snapshots_[1] >= 0) prune_up_to_ = snapshots_[1];
}

void DeltaWriter::Loop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    mu_.Await(absl::Condition(
        +[](DeltaWriter* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return w->stop_ || w->queued_.has_value() || w->prune_up_to_ >= 0;
        },
        this));
    if (queued_.has_value()) {
      DeltaData d = std::move(*queued_);
      queued_.reset();
      writing_ = true;
      mu_.Unlock();
      const absl::Time start = absl::Now();
      const std::string path = DeltaPath(options_.dir, d.state.global_step, task_, num_ps_);
      absl::Status s = env_->CreateDirs(options_.dir);
      std::string& bytes = bytes_buffer_;
      bytes.clear();
      if (s.ok()) {
        SerializeDeltaInto(d, &bytes);
        s = WriteFileAtomically(env_, path, bytes);
      }
      EmptyKeepingCapacity(&d);
      const double secs = absl::ToDoubleSeconds(absl::Now() - start);
      if (s.ok()) {
        VLOG(1) << "ps task " << task_ << ": wrote " << path << " (" << bytes.size() << " bytes, " << secs << " s)";
      } else {
        LOG(ERROR) << "ps task " << task_ << ": cannot write delta " << path << ": " << s.message()
                   << " (serving and restarts lose this interval; the next snapshot closes the gap)";
      }
      mu_.Lock();
      writing_ = false;
      last_status_ = s;
      ++(s.ok() ? written_ : failed_);
      if (s.ok()) bytes_ += static_cast<int64_t>(bytes.size());
      seconds_ += secs;
      spare_ = std::move(d);
      continue;
    }
    if (prune_up_to_ >= 0) {
      const int64_t up_to = std::exchange(prune_up_to_, -1);
      mu_.Unlock();
      RemoveDeltasUpTo(env_, options_.dir, task_, num_ps_, up_to).IgnoreError();  // logged there
      mu_.Lock();
      continue;
    }
    if (stop_) return;
  }
}

int64_t DeltaWriter::written() const {
  absl::MutexLock lock(&mu_);
  return written_;
}
int64_t DeltaWriter::failed() const {
  absl::MutexLock lock(&mu_);
  return failed_;
}
int64_t DeltaWriter::bytes_written() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}
double DeltaWriter::write_seconds() const {
  absl::MutexLock lock(&mu_);
  return seconds_;
}
absl::Status DeltaWriter::last_status() const {
  absl::MutexLock lock(&mu_);
  return last_status_;
}

}  // namespace dtrain::ps
