// Parameter-server semantics with real processes on 127.0.0.1: backup workers (a slow worker does not slow the
// steps, and every step has exactly R contributions), start-up in any order, and checkpoint/resume.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/env.h"
#include "ps/checkpoint/checkpoint_dir.h"
#include "ps/checkpoint/checkpoint_set.h"
#include "tests/subprocess.h"

namespace dtrain::testing {
namespace {

std::string LogPath(const std::string& name) { return absl::StrCat(::testing::TempDir(), "/", name, ".log"); }

struct WorkerRow {
  int id = 0;
  long applied = 0, stale = 0, backup = 0;
};

// Parses the chief's "ps 0 statistics" table.
std::vector<WorkerRow> ParseStats(const std::string& out, long* global_step) {
  std::vector<WorkerRow> rows;
  std::smatch m;
  if (!std::regex_search(out, m, std::regex("ps 0 statistics: global step ([0-9]+)"))) return rows;
  *global_step = std::stol(m[1]);
  std::istringstream in(out.substr(m.position(0)));
  std::string line;
  std::regex row("^\\s+([0-9]+)\\s+([0-9]+)\\s+([0-9]+)\\s+([0-9]+)\\s+([0-9]+)\\s+[0-9.]+\\s*$");
  while (std::getline(in, line)) {
    std::smatch r;
    if (std::regex_match(line, r, row)) {
      rows.push_back(WorkerRow{std::stoi(r[1]), std::stol(r[2]), std::stol(r[3]), std::stol(r[4])});
    }
  }
  return rows;
}

double ParseTrainSeconds(const std::string& out) {
  std::smatch m;
  if (std::regex_search(out, m, std::regex("local steps, [0-9]+ examples in ([0-9.]+) sec"))) return std::stod(m[1]);
  return -1;
}

class LocalCluster {
 public:
  LocalCluster(int num_ps, int num_workers) {
    std::vector<int> ports = FreePorts(num_ps + num_workers);
    std::vector<std::string> ps, worker;
    for (int i = 0; i < num_ps; ++i) ps.push_back(absl::StrCat("127.0.0.1:", ports[i]));
    for (int i = 0; i < num_workers; ++i) worker.push_back(absl::StrCat("127.0.0.1:", ports[num_ps + i]));
    flags_ = {absl::StrCat("--ps_hosts=", absl::StrJoin(ps, ",")),
              absl::StrCat("--worker_hosts=", absl::StrJoin(worker, ","))};
  }
  std::unique_ptr<Subprocess> StartPs(int i, const std::string& tag, std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {BinPath("dtrain_ps"), "--job_name=ps", absl::StrCat("--task_index=", i)};
    argv.insert(argv.end(), flags_.begin(), flags_.end());
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<Subprocess>(argv, LogPath(absl::StrCat(tag, "_ps", i)));
  }
  std::unique_ptr<Subprocess> StartWorker(int i, const std::string& tag, std::vector<std::string> extra) {
    std::vector<std::string> argv = {BinPath("dtrain_worker"), "--job_name=worker", absl::StrCat("--task_index=", i)};
    argv.insert(argv.end(), flags_.begin(), flags_.end());
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<Subprocess>(argv, LogPath(absl::StrCat(tag, "_worker", i)));
  }

 private:
  std::vector<std::string> flags_;
};

// 3 workers, R = 2: each step applies exactly two contributions; a worker slowed to 100 ms per step does not
// hold the others back (its gradients arrive late and are dropped as backups/stale).
TEST(ClusterSemantics, BackupWorkersKeepStepsFastAndExactlyR) {
  LocalCluster c(1, 3);
  auto ps = c.StartPs(0, "backup");
  const std::vector<std::string> args = {"--mode=sync", "--model=mlp", "--train_steps=150",
                                         "--replicas_to_aggregate=2", "--total_num_replicas=3", "--log_every=50"};
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int i = 0; i < 3; ++i) {
    std::vector<std::string> a = args;
    if (i == 2) a.push_back("--debug_step_delay_ms=100");
    workers.push_back(c.StartWorker(i, "backup", a));
  }
  for (auto& w : workers) EXPECT_EQ(w->Wait(absl::Minutes(4)), 0) << w->Output();
  EXPECT_EQ(ps->Wait(absl::Seconds(30)), 0) << ps->Output();
  const std::string out = workers[0]->Output();
  long global_step = 0;
  std::vector<WorkerRow> rows = ParseStats(out, &global_step);
  ASSERT_EQ(rows.size(), 3u) << out;
  EXPECT_GE(global_step, 150);
  long applied = 0;
  for (const WorkerRow& r : rows) applied += r.applied;
  EXPECT_EQ(applied, 2 * global_step) << out;  // exactly R contributions per step
  EXPECT_GT(rows[2].stale + rows[2].backup, 0) << out;
  EXPECT_LT(rows[2].applied, rows[0].applied) << out;
  // 150 steps of the slow worker alone would take 15 s.
  const double secs = ParseTrainSeconds(out);
  EXPECT_GT(secs, 0);
  EXPECT_LT(secs, 12.0) << out;
}

// Workers start first and wait (with backoff, logging what they wait for); the ps comes up 4 s later.
TEST(ClusterSemantics, PsStartedLongAfterTheWorkers) {
  LocalCluster c(2, 2);
  const std::vector<std::string> args = {"--mode=sync", "--model=mlp", "--train_steps=100", "--log_every=50"};
  auto w0 = c.StartWorker(0, "late", args);
  auto w1 = c.StartWorker(1, "late", args);
  absl::SleepFor(absl::Seconds(4));
  auto ps1 = c.StartPs(1, "late");
  absl::SleepFor(absl::Seconds(1));
  auto ps0 = c.StartPs(0, "late");
  EXPECT_EQ(w0->Wait(absl::Minutes(3)), 0) << w0->Output();
  EXPECT_EQ(w1->Wait(absl::Minutes(1)), 0) << w1->Output();
  EXPECT_EQ(ps0->Wait(absl::Seconds(30)), 0) << ps0->Output();
  EXPECT_EQ(ps1->Wait(absl::Seconds(30)), 0) << ps1->Output();
  EXPECT_NE(w1->Output().find("waiting for ps task"), std::string::npos) << w1->Output();
  EXPECT_NE(w0->Output().find("test accuracy"), std::string::npos) << w0->Output();
}

// A worker built for another model is refused with a clear message naming the mismatch, leaves the cluster,
// and the rest of the cluster trains to the end and exits by itself.
// Async, so the run can go on without the refused worker: it finishes degraded (3), naming it; the refused
// worker exits 2. (In sync mode with R = all workers a refusal ends the run instead: tests/run_outcome_test.)
TEST(ClusterSemantics, MismatchedWorkerIsRefusedAndTheClusterFinishes) {
  LocalCluster c(1, 2);
  auto ps = c.StartPs(0, "mismatch");
  auto chief = c.StartWorker(0, "mismatch", {"--mode=async", "--model=mlp", "--train_steps=100", "--log_every=50"});
  absl::SleepFor(absl::Seconds(1));
  auto stranger = c.StartWorker(1, "mismatch", {"--mode=async", "--model=cnn", "--train_steps=100"});
  EXPECT_EQ(stranger->Wait(absl::Minutes(2)), 2) << stranger->Output();
  EXPECT_NE(stranger->Output().find("model_signature mismatch"), std::string::npos) << stranger->Output();
  EXPECT_EQ(chief->Wait(absl::Minutes(2)), 3) << chief->Output();
  EXPECT_EQ(ps->Wait(absl::Seconds(30)), 3) << ps->Output();
  EXPECT_NE(chief->Output().find("test accuracy"), std::string::npos) << chief->Output();
  EXPECT_NE(chief->Output().find("run degraded: training reached step 100 of 100 without worker 1 (refused"),
            std::string::npos)
      << chief->Output();
}

// A cluster with --checkpoint_dir saves as it goes; stopped after 60 steps and started again with the same
// flags it resumes at step 60 by itself and finishes; dtrain_eval reads the result, and a corrupted newest
// checkpoint is skipped for the previous one.
TEST(ClusterSemantics, CheckpointResumeAcrossRestartsAndEval) {
  const std::string dir = ::testing::TempDir() + "/semantics_ckpt";
  std::filesystem::remove_all(dir);
  auto run = [&](int steps, const std::string& tag, const std::string& in = "") {
    const std::vector<std::string> ckpt = {"--checkpoint_dir=" + (in.empty() ? dir : in), "--save_checkpoint_steps=30"};
    LocalCluster c(2, 2);
    auto ps0 = c.StartPs(0, tag, ckpt);
    auto ps1 = c.StartPs(1, tag, ckpt);
    std::vector<std::unique_ptr<Subprocess>> workers;
    for (int i = 0; i < 2; ++i) {
      std::vector<std::string> a = {"--mode=sync", "--model=mlp", absl::StrCat("--train_steps=", steps),
                                    "--log_every=30", "--threads=1"};
      a.insert(a.end(), ckpt.begin(), ckpt.end());
      workers.push_back(c.StartWorker(i, tag, a));
    }
    for (auto& w : workers) EXPECT_EQ(w->Wait(absl::Minutes(3)), 0) << w->Output();
    EXPECT_EQ(ps0->Wait(absl::Seconds(30)), 0) << ps0->Output();
    EXPECT_EQ(ps1->Wait(absl::Seconds(30)), 0) << ps1->Output();
    return workers[0]->Output();
  };
  const std::string first = run(60, "ckpt_a");
  EXPECT_EQ(first.find("resuming"), std::string::npos) << first;
  EXPECT_TRUE(std::filesystem::exists(dir + "/model.ckpt-60.ps0-of-2"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/model.ckpt-60.ps1-of-2"));
  const std::string second = run(90, "ckpt_b");
  EXPECT_NE(second.find("resuming at global step 60"), std::string::npos) << second;
  long global_step = 0;
  ParseStats(second, &global_step);
  EXPECT_EQ(global_step, 90) << second;

  // Stopped at 60 and resumed equals never stopped: the same parameters at step 90 (each worker's input
  // resumed where the checkpoint left it).
  const std::string straight = ::testing::TempDir() + "/semantics_ckpt_straight";
  std::filesystem::remove_all(straight);
  run(90, "ckpt_straight", straight);
  absl::StatusOr<std::vector<ps::CheckpointData>> resumed =
      ps::ReadCheckpointSet(Env::Default(), ps::CheckpointPrefix(dir, 90));
  absl::StatusOr<std::vector<ps::CheckpointData>> uninterrupted =
      ps::ReadCheckpointSet(Env::Default(), ps::CheckpointPrefix(straight, 90));
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ASSERT_TRUE(uninterrupted.ok()) << uninterrupted.status();
  ASSERT_EQ(resumed->size(), uninterrupted->size());
  for (size_t t = 0; t < resumed->size(); ++t) {
    ASSERT_EQ((*resumed)[t].slices.size(), (*uninterrupted)[t].slices.size());
    for (size_t i = 0; i < (*resumed)[t].slices.size(); ++i) {
      EXPECT_EQ((*resumed)[t].slices[i].values, (*uninterrupted)[t].slices[i].values)
          << "ps task " << t << ", " << ps::DescribeSlice((*resumed)[t].slices[i].spec);
    }
  }
  EXPECT_EQ((*resumed)[0].input_positions.size(), 2u);
  std::filesystem::remove_all(straight);

  // dtrain_eval on the directory picks the newest complete checkpoint.
  Subprocess eval({BinPath("dtrain_eval"), "--checkpoint=" + dir, "--model=mlp"}, LogPath("ckpt_eval"));
  EXPECT_EQ(eval.Wait(absl::Minutes(2)), 0) << eval.Output();
  EXPECT_NE(eval.Output().find("model.ckpt-90: test accuracy = "), std::string::npos) << eval.Output();

  // Flip a byte in the middle of the newest file of ps 1: that step is skipped, the previous one is used.
  const std::string victim = dir + "/model.ckpt-90.ps1-of-2";
  ASSERT_TRUE(std::filesystem::exists(victim));
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(0, std::ios::end);
    const std::streamoff size = f.tellg();
    f.seekp(size / 2);
    char c = 0;
    f.seekg(size / 2);
    f.get(c);
    f.seekp(size / 2);
    f.put(static_cast<char>(c ^ 0x5a));
  }
  Subprocess eval2({BinPath("dtrain_eval"), "--checkpoint=" + dir, "--model=mlp"}, LogPath("ckpt_eval2"));
  EXPECT_EQ(eval2.Wait(absl::Minutes(2)), 0) << eval2.Output();
  EXPECT_NE(eval2.Output().find("model.ckpt-60: test accuracy = "), std::string::npos) << eval2.Output();
}

}  // namespace
}  // namespace dtrain::testing
