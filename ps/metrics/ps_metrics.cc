#include "ps/metrics/ps_metrics.h"

#include <initializer_list>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/metrics/scrape_families.h"

namespace dtrain::ps {

using metrics::AddFamily;
using metrics::AddSample;
using prometheus::MetricType;

namespace {

void Counter(std::vector<prometheus::MetricFamily>* out, const char* name, const char* help, double value) {
  AddSample(&AddFamily(out, name, help, MetricType::Counter), {}, value);
}
void Gauge(std::vector<prometheus::MetricFamily>* out, const char* name, const char* help, double value) {
  AddSample(&AddFamily(out, name, help, MetricType::Gauge), {}, value);
}

// A sample of a family with one label: the label's value and the figure.
struct LabeledSample {
  template <typename Figure>
  LabeledSample(const char* value, Figure figure) : value(value), figure(static_cast<double>(figure)) {}
  const char* value;
  double figure;
};
// A family whose samples differ by one label, `label`, in the order given.
void LabeledFamily(std::vector<prometheus::MetricFamily>* out, const char* name, const char* help, MetricType type,
                   const char* label, std::initializer_list<LabeledSample> samples) {
  prometheus::MetricFamily& family = AddFamily(out, name, help, type);
  for (const LabeledSample& s : samples) AddSample(&family, {{label, s.value}}, s.figure);
}

void AddAccounting(const PushAccounting& a, std::vector<prometheus::MetricFamily>* out) {
  Counter(out, "dtrain_ps_pushes_received_total",
          "Pushes this task received (every StartPush, any transport).", a.received);
  Counter(out, "dtrain_ps_pushes_accepted_total",
          "Pushes taken for a step (sync) or applied at once (async).", a.accepted);
  Counter(out, "dtrain_ps_pushes_applied_total", "Accepted gradients that went into the parameters.",
          a.applied);
  LabeledFamily(out, "dtrain_ps_pushes_dropped_total",
                "Pushes not applied, by reason: stale (a step decided long ago or past the staleness bound), backup "
                "(the step was decided without it), duplicate (a retry), rejected_nonfinite, skipped_nonfinite, "
                "refused (another error), abandoned (the upload broke off), discarded (a rollback).",
                MetricType::Counter, "reason",
                {{"stale", a.dropped_stale},
                 {"backup", a.dropped_backup},
                 {"duplicate", a.duplicates},
                 {"rejected_nonfinite", a.rejected_nonfinite},
                 {"skipped_nonfinite", a.skipped_nonfinite},
                 {"refused", a.refused},
                 {"abandoned", a.abandoned},
                 {"discarded", a.discarded}});
  Gauge(out, "dtrain_ps_pushes_in_flight", "Uploads open now.", a.in_flight);
  Gauge(out, "dtrain_ps_pushes_pending", "Accepted sync gradients waiting for their step's decision.",
        a.pending);
}

void AddStats(const TrainingStats& s, std::vector<prometheus::MetricFamily>* out) {
  Gauge(out, "dtrain_ps_global_step", "This task's step (the global step on ps task 0).", s.global_step);
  int live = 0, done = 0, lost = 0;
  for (const WorkerStats& w : s.workers) {
    if (w.lost) {
      ++lost;
    } else if (w.done) {
      ++done;
    } else {
      ++live;
    }
  }
  LabeledFamily(out, "dtrain_ps_workers",
                "Workers known to this task by state: live (registered, holding a lease: heard from within "
                "--worker_timeout_secs), done (left), lost (their lease ran out, not back since).",
                MetricType::Gauge, "state", {{"live", live}, {"done", done}, {"lost", lost}});
  prometheus::MetricFamily applied =
      metrics::Family("dtrain_ps_worker_pushes_applied_total", "Pushes of each worker applied on this task.",
                      MetricType::Counter);
  prometheus::MetricFamily dropped = metrics::Family(
      "dtrain_ps_worker_pushes_dropped_total",
      "Pushes of each worker dropped on this task: stale, backup, duplicate.", MetricType::Counter);
  prometheus::MetricFamily wait = metrics::Family(
      "dtrain_ps_worker_sync_wait_seconds_total",
      "Seconds each worker's pulls were blocked on this task waiting for their step (sync: for the other "
      "workers' pushes and the update).",
      MetricType::Counter);
  prometheus::MetricFamily times_lost =
      metrics::Family("dtrain_ps_worker_leases_expired_total",
                      "How often each worker's lease ran out (declared lost).", MetricType::Counter);
  for (const WorkerStats& w : s.workers) {
    const metrics::LabelPairs l = {{"worker", absl::StrCat(w.worker_id)}};
    AddSample(&applied, l, w.applied);
    AddSample(&dropped, {l[0], {"reason", "stale"}}, w.dropped_stale);
    AddSample(&dropped, {l[0], {"reason", "backup"}}, w.dropped_backup);
    AddSample(&dropped, {l[0], {"reason", "duplicate"}}, w.duplicates);
    AddSample(&wait, l, w.wait_seconds);
    AddSample(&times_lost, l, w.times_lost);
  }
  for (prometheus::MetricFamily* f : {&applied, &dropped, &wait, &times_lost}) out->push_back(std::move(*f));
  LabeledFamily(out, "dtrain_ps_payload_bytes_total",
                "Tensor payload bytes (values at their wire size, plus ids) "
                "received in pushes (in) and sent in pulls (out), "
                "over every transport.",
                MetricType::Counter, "direction", {{"in", s.bytes_received}, {"out", s.bytes_sent}});
  Gauge(out, "dtrain_ps_max_staleness", "Async: the largest staleness of an applied push so far.",
        s.max_staleness_seen);
  Gauge(out, "dtrain_ps_checkpoint_step", "Step of this task's newest checkpoint on disk (-1: none).",
        s.checkpoint_step);
  if (!s.tables.empty()) {
    prometheus::MetricFamily rows = metrics::Family(
        "dtrain_ps_sparse_rows", "Rows of each embedding table held by this task.", MetricType::Gauge);
    prometheus::MetricFamily created = metrics::Family(
        "dtrain_ps_sparse_rows_created_total", "Rows created (since start or restore).", MetricType::Counter);
    prometheus::MetricFamily removed =
        metrics::Family("dtrain_ps_sparse_rows_removed_total",
                        "Rows removed: evicted (past max_rows) or expired (row TTL).", MetricType::Counter);
    prometheus::MetricFamily lookups =
        metrics::Family("dtrain_ps_sparse_lookups_total", "Ids pulled from each table.", MetricType::Counter);
    prometheus::MetricFamily mem =
        metrics::Family("dtrain_ps_sparse_bytes", "Memory each table's shard takes.", MetricType::Gauge);
    for (const SparseTableStats& t : s.tables) {
      const metrics::LabelPairs l = {{"table", t.name}};
      AddSample(&rows, l, t.rows);
      AddSample(&created, l, t.created);
      AddSample(&removed, {l[0], {"reason", "evicted"}}, t.evicted);
      AddSample(&removed, {l[0], {"reason", "expired"}}, t.expired);
      AddSample(&lookups, l, t.lookups);
      AddSample(&mem, l, t.bytes);
    }
    for (prometheus::MetricFamily* f : {&rows, &created, &removed, &lookups, &mem})
      out->push_back(std::move(*f));
  }
}

}  // namespace

std::vector<prometheus::MetricFamily> CollectPsFamilies(const PsMetricsSources& src) {
  std::vector<prometheus::MetricFamily> out;
  Gauge(&out, "dtrain_ps_configured", "1 once a chief's configuration is adopted (registered or restored).",
        src.ps->configured() ? 1 : 0);
  if (absl::StatusOr<TrainingStats> stats = src.ps->GetStats(); stats.ok()) AddStats(*stats, &out);
  AddAccounting(src.ps->accounting(), &out);
  prometheus::MetricFamily lanes =
      metrics::Family("dtrain_ps_transport_lanes",
                      "Data-plane connections open now, by transport (gRPC carries the "
                      "rest).",
                      MetricType::Gauge);
  prometheus::MetricFamily attached =
      metrics::Family("dtrain_ps_transport_attachments",
                      "Workers attached to a data plane now, by transport.", MetricType::Gauge);
  prometheus::MetricFamily cut =
      metrics::Family("dtrain_ps_transport_uploads_cut_off_total",
                      "Uploads open when their lane closed or fell silent.", MetricType::Counter);
  prometheus::MetricFamily bytes = metrics::Family(
      "dtrain_ps_transport_bytes_total",
      "Tensor bytes received (pushes) and sent (pulls), by transport and direction: gRPC's tensor streams' "
      "messages, shared memory's values read and written in the workers' memory, the TCP lanes' bytes.",
      MetricType::Counter);
  const auto add_bytes = [&bytes](const char* transport, int64_t in, int64_t out_bytes) {
    AddSample(&bytes, {{"transport", transport}, {"direction", "in"}}, in);
    AddSample(&bytes, {{"transport", transport}, {"direction", "out"}}, out_bytes);
  };
  if (src.grpc_bytes) {
    const std::pair<int64_t, int64_t> b = src.grpc_bytes();
    add_bytes("grpc", b.first, b.second);
  }
  if (src.shm) {
    const shm::ShmServerCounters c = src.shm();
    AddSample(&lanes, {{"transport", "shm"}}, c.active_lanes);
    AddSample(&attached, {{"transport", "shm"}}, c.active_attachments);
    AddSample(&cut, {{"transport", "shm"}}, c.uploads_cut_off);
    add_bytes("shm", c.bytes_received, c.bytes_sent);
  }
  if (src.tcp) {
    const tcp::TcpServerCounters c = src.tcp();
    AddSample(&lanes, {{"transport", "tcp"}}, c.active_lanes);
    AddSample(&attached, {{"transport", "tcp"}}, c.active_attachments);
    AddSample(&cut, {{"transport", "tcp"}}, c.uploads_cut_off);
    add_bytes("tcp", c.bytes_received, c.bytes_sent);
  }
  for (prometheus::MetricFamily* f : {&lanes, &attached, &cut, &bytes}) {
    if (!f->metric.empty()) out.push_back(std::move(*f));
  }
  const std::string suffix = absl::StrCat(".ps", src.task, "-of-", src.num_ps);
  const double checkpoint_age = metrics::NewestFileAgeSeconds(src.checkpoint_dir, [&](const std::string& n) {
    return absl::StartsWith(n, "model.ckpt-") && absl::EndsWith(n, suffix);
  });
  if (checkpoint_age >= 0) {
    Gauge(&out, "dtrain_ps_checkpoint_age_seconds",
          "Seconds since this task's newest checkpoint file was written.", checkpoint_age);
  }
  const double delta_age = metrics::NewestFileAgeSeconds(src.delta_dir, [&](const std::string& n) {
    return absl::StartsWith(n, "model.delta-") && absl::EndsWith(n, suffix);
  });
  if (delta_age >= 0) {
    Gauge(&out, "dtrain_ps_delta_age_seconds", "Seconds since this task's newest delta file was written.",
          delta_age);
  }
  for (prometheus::MetricFamily& f : metrics::ProcessFamilies()) out.push_back(std::move(f));
  return out;
}

std::shared_ptr<prometheus::Collectable> NewPsCollector(PsMetricsSources sources) {
  return std::make_shared<metrics::CallbackCollectable>(
      [sources = std::move(sources)] { return CollectPsFamilies(sources); });
}

}  // namespace dtrain::ps
