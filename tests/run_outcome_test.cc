// How a run ends, with real processes on 127.0.0.1 (issue 25; docs/faults_and_endings.md):
// - the exit code of every process for each ending: complete (0 everywhere, one summary line from the ps and
//   the chief), degraded (3; --allow_degraded 0), a configuration refused (2 on every process), a peer that
//   failed (4; a worker waiting for a chief that failed hears it at once);
// - SIGTERM to a sync worker mid-run costs the others no lease stall (the global step goes on within seconds,
//   with --worker_timeout_secs=20), and the worker exits 143 having left;
// - SIGTERM to the chief mid-run: it evaluates and exports, the ps tasks write their final checkpoint at its
//   step and tell the other workers, every process exits by itself; dtrain_eval then reads that checkpoint
//   with --checkpoint=DIR alone (the model flags are in it, their paths absolute: it runs from any directory, and
//   names every recorded path that is gone in one error);
// - SIGTERM to the ps mid-run: its final checkpoint, the workers told at once (4), the ps exits 143;
// - --help of every binary shows its own flags in groups; an unknown flag names the closest and exits 2; a
//   flagfile shared by the ps and the workers works for both;
// - the ps exits within a second of the last worker (no fixed linger), and every worker's one "phases" line
//   (start, train, evaluate) adds up to no more than its process's wall-clock, in a cluster and in local mode.
// The image runs train on a small MNIST-shaped data set the test writes (learnable: each label lights its own
// pixels), so they need no downloaded data and stay cheap.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "ps/rpc/grpc_ps_client.h"
#include "tests/subprocess.h"
#include "worker/data/data_test_util.h"
#include "worker/models/onnx/onnx_test_util.h"

namespace dtrain::testing {
namespace {

std::string Scratch(const std::string& name) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/run_outcome_", name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

constexpr int kTrainExamples = 3000, kTestExamples = 500;

// MNIST IDX files (28x28, 10 classes) in a directory of their own, written once per test binary: random
// pixels, a little brighter in a 56-pixel band whose place is the label, so that a model learns it partly
// within a few steps (the test accuracy then depends on the parameters, not a sure 1.0).
const std::string& ImageData() {
  static const std::string* const dir = [] {
    auto* d = new std::string(Scratch("images"));
    namespace tu = data::test_util;
    auto write = [&](const std::string& prefix, int n, uint64_t seed) {
      data::Dataset ds = tu::MakeDataset(n, 28, 28, 1, seed);
      for (int i = 0; i < n; ++i) {
        uint8_t* image = ds.pixels.data() + static_cast<size_t>(i) * 784;
        for (int p = 0; p < 56; ++p) {
          uint8_t& v = image[ds.labels[i] * 56 + p];
          v = static_cast<uint8_t>(std::min(255, v + 24));
        }
      }
      tu::WriteGzFile(*d + "/" + prefix + "-images-idx3-ubyte.gz", tu::IdxImages(ds));
      tu::WriteGzFile(*d + "/" + prefix + "-labels-idx1-ubyte.gz", tu::IdxLabels(ds.labels));
    };
    write("train", kTrainExamples, 1);
    write("t10k", kTestExamples, 2);
    return d;
  }();
  return *dir;
}

class Cluster {
 public:
  Cluster(int num_ps, int num_workers, std::string tag) : tag_(std::move(tag)), dir_(Scratch(tag_)) {
    const std::vector<int> ports = FreePorts(num_ps + num_workers);
    for (int i = 0; i < num_ps; ++i) ps_.push_back(absl::StrCat("127.0.0.1:", ports[i]));
    for (int i = 0; i < num_workers; ++i) workers_.push_back(absl::StrCat("127.0.0.1:", ports[num_ps + i]));
  }
  const std::string& dir() const { return dir_; }
  std::vector<std::string> ClusterFlags() const {
    return {"--ps_hosts=" + absl::StrJoin(ps_, ","), "--worker_hosts=" + absl::StrJoin(workers_, ",")};
  }
  std::unique_ptr<Subprocess> StartPs(int i, std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {BinPath("dtrain_ps"), "--job_name=ps", absl::StrCat("--task_index=", i)};
    Append(ClusterFlags(), &argv);
    Append(extra, &argv);
    return std::make_unique<Subprocess>(argv, absl::StrCat(dir_, "/ps", i, ".log"));
  }
  std::unique_ptr<Subprocess> StartWorker(int i, std::vector<std::string> extra) {
    std::vector<std::string> argv = {
        BinPath("dtrain_worker"), "--job_name=worker",      absl::StrCat("--task_index=", i), "--threads=1",
        "--log_every=1000",       "--startup_wait_secs=60", "--data_dir=" + ImageData()};
    Append(ClusterFlags(), &argv);
    Append(extra, &argv);
    return std::make_unique<Subprocess>(argv, absl::StrCat(dir_, "/worker", i, ".log"));
  }
  std::unique_ptr<ps::PsInterface> Monitor() const {
    ps::GrpcClientOptions o;
    o.retry_window = absl::Milliseconds(200);
    o.rpc_timeout = absl::Seconds(2);
    absl::StatusOr<std::unique_ptr<ps::PsInterface>> c = ps::NewGrpcPsClient(ps_[0], o);
    return c.ok() ? std::move(*c) : nullptr;
  }

 private:
  static void Append(const std::vector<std::string>& from, std::vector<std::string>* to) {
    to->insert(to->end(), from.begin(), from.end());
  }
  std::string tag_, dir_;
  std::vector<std::string> ps_, workers_;
};

int64_t GlobalStep(ps::PsInterface& monitor) {
  absl::StatusOr<ps::TrainingStats> s = monitor.GetStats();
  return s.ok() ? s->global_step : -1;
}

bool WaitForStep(ps::PsInterface& monitor, int64_t step, absl::Time deadline) {
  while (absl::Now() < deadline) {
    if (GlobalStep(monitor) >= step) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

bool Has(const std::string& out, const std::string& what) { return out.find(what) != std::string::npos; }

// ---- the four endings -------------------------------------------------------------------------------------

TEST(RunOutcome, CompleteExitsZeroEverywhereWithOneSummaryLine) {
  Cluster c(1, 2, "complete");
  auto ps = c.StartPs(0);
  // --checkpoint_dir is the ps tasks' flag: a cluster worker given it says that it does not use it.
  auto chief = c.StartWorker(0, {"--mode=sync", "--train_steps=30", "--checkpoint_dir=" + c.dir() + "/ckpt"});
  auto worker = c.StartWorker(1, {"--mode=sync", "--train_steps=30"});
  EXPECT_EQ(chief->Wait(absl::Minutes(2)), 0) << chief->Output();
  EXPECT_TRUE(Has(chief->Output(), "--checkpoint_dir=" + c.dir() + "/ckpt is for the ps tasks"))
      << chief->Output();
  EXPECT_EQ(worker->Wait(absl::Minutes(1)), 0) << worker->Output();
  EXPECT_EQ(ps->Wait(absl::Seconds(30)), 0) << ps->Output();
  const std::string line = "run complete: training reached step 30 of 30; all 2 workers completed";
  EXPECT_TRUE(Has(ps->Output(), line)) << ps->Output();
  EXPECT_TRUE(Has(chief->Output(), line)) << chief->Output();
  EXPECT_FALSE(Has(worker->Output(), "run complete")) << "only the chief prints a complete run's line";
}

// Worker 2 fails on its own (no data): the others train to the end without it. Every process but the failed
// one exits 3; the ps given --allow_degraded exits 0. The summary line says which worker left, when and why.
TEST(RunOutcome, DegradedExitsThreeUnlessAllowed) {
  Cluster c(1, 3, "degraded");
  auto ps = c.StartPs(0, {"--allow_degraded"});
  auto chief = c.StartWorker(0, {"--mode=sync", "--train_steps=30"});
  auto worker = c.StartWorker(1, {"--mode=sync", "--train_steps=30"});
  auto failing = c.StartWorker(2, {"--mode=sync", "--train_steps=30", "--data_dir=" + c.dir() + "/no_data"});
  EXPECT_EQ(failing->Wait(absl::Minutes(1)), 1) << failing->Output();
  EXPECT_EQ(chief->Wait(absl::Minutes(2)), 3) << chief->Output();
  EXPECT_EQ(worker->Wait(absl::Minutes(1)), 3) << worker->Output();
  EXPECT_EQ(ps->Wait(absl::Seconds(30)), 0) << ps->Output();
  const std::regex line(
      "run degraded: training reached step 30 of 30 without worker 2 \\(failed at step 0: [^\\n]*"
      "no_data");
  EXPECT_TRUE(std::regex_search(ps->Output(), line)) << ps->Output();
  EXPECT_TRUE(std::regex_search(chief->Output(), line)) << chief->Output();
  EXPECT_TRUE(std::regex_search(worker->Output(), line)) << worker->Output();
}

// Worker 1's cluster spec lists 3 workers where the others list 2: the ps refuses its configuration; in sync
// mode with every worker aggregated the run cannot complete, so every process exits 2, soon.
TEST(RunOutcome, RefusedConfigurationExitsTwoOnEveryProcess) {
  Cluster c(1, 2, "refused");
  const absl::Time start = absl::Now();
  auto ps = c.StartPs(0);
  auto chief = c.StartWorker(0, {"--mode=sync", "--train_steps=2000"});
  std::vector<std::string> wrong = {"--mode=sync", "--train_steps=2000"};
  const std::vector<std::string> flags = c.ClusterFlags();
  wrong.push_back(flags[1] + ",127.0.0.1:1");  // a third worker the others do not know: overrides the flag
  auto worker = c.StartWorker(1, wrong);
  EXPECT_EQ(worker->Wait(absl::Minutes(1)), 2) << worker->Output();
  EXPECT_EQ(chief->Wait(absl::Minutes(1)), 2) << chief->Output();
  EXPECT_EQ(ps->Wait(absl::Seconds(30)), 2) << ps->Output();
  EXPECT_LT(absl::Now() - start, absl::Seconds(45)) << "no process may wait out a timeout";
  EXPECT_TRUE(Has(worker->Output(), "num_workers")) << worker->Output();
  EXPECT_TRUE(Has(ps->Output(), "run ended early at step 0 of 2000: configuration refused: worker 1"))
      << ps->Output();
  EXPECT_TRUE(Has(chief->Output(), "configuration refused: worker 1")) << chief->Output();
}

// The chief fails before it registers (no data): worker 1, waiting for it, hears so from the ps at once (not
// after --startup_wait_secs), and it and the ps exit 4 naming the chief; the chief exits 1.
TEST(RunOutcome, PeerFailedExitsFourAndWaitingWorkersHearAtOnce) {
  Cluster c(1, 2, "peer_failed");
  auto ps = c.StartPs(0);
  auto worker = c.StartWorker(1, {"--mode=sync", "--train_steps=2000", "--startup_wait_secs=300"});
  absl::SleepFor(absl::Seconds(1));  // worker 1 waits for the chief
  auto chief = c.StartWorker(0, {"--mode=sync", "--train_steps=2000", "--data_dir=" + c.dir() + "/no_data"});
  EXPECT_EQ(chief->Wait(absl::Minutes(1)), 1) << chief->Output();
  const absl::Time chief_gone = absl::Now();
  EXPECT_EQ(worker->Wait(absl::Seconds(30)), 4) << worker->Output();
  EXPECT_LT(absl::Now() - chief_gone, absl::Seconds(10)) << worker->Output();
  EXPECT_EQ(ps->Wait(absl::Seconds(30)), 4) << ps->Output();
  EXPECT_TRUE(Has(worker->Output(), "the chief (worker 0) failed at step 0")) << worker->Output();
  EXPECT_TRUE(Has(ps->Output(), "run ended early at step 0: the chief (worker 0) failed")) << ps->Output();
}

// ---- signals ----------------------------------------------------------------------------------------------

// SIGTERM to a sync worker mid-run: it finishes its step and leaves, so the others' next steps need it no
// more at once: no stall of --worker_timeout_secs (20 s). It exits 143; the others end degraded (3).
TEST(RunOutcome, SigtermToAWorkerCostsNoLeaseStall) {
  Cluster c(1, 3, "sigterm_worker");
  auto ps = c.StartPs(0, {"--worker_timeout_secs=20"});
  std::vector<std::unique_ptr<Subprocess>> w;
  // Steps enough that the run is surely still going at the signal however fast the machine (CI's did 169 steps
  // by then with 200 to go; at ~70 steps/s here the two that stay finish the rest in about 7 s).
  constexpr int64_t kSteps = 600;
  for (int i = 0; i < 3; ++i) {
    w.push_back(c.StartWorker(i, {"--mode=sync", absl::StrCat("--train_steps=", kSteps)}));
  }
  auto monitor = c.Monitor();
  ASSERT_NE(monitor, nullptr);
  ASSERT_TRUE(WaitForStep(*monitor, 30, absl::Now() + absl::Minutes(1))) << ps->Output();
  const absl::Time before = absl::Now();
  const int64_t at_before = GlobalStep(*monitor);
  absl::SleepFor(absl::Milliseconds(300));
  const double pace = (GlobalStep(*monitor) - at_before) / absl::ToDoubleSeconds(absl::Now() - before);
  ASSERT_EQ(kill(w[2]->pid(), SIGTERM), 0);
  const absl::Time sent = absl::Now();
  const int64_t at_signal = GlobalStep(*monitor);
  ASSERT_LT(at_signal, kSteps - 60) << "the run must still be going";
  const bool went_on = WaitForStep(*monitor, at_signal + 30, sent + absl::Seconds(8));
  monitor.reset();  // its channel would hold the ps's shutdown for gRPC's grace period
  const double secs = absl::ToDoubleSeconds(absl::Now() - sent);
  EXPECT_TRUE(went_on) << "the global step stalled after SIGTERM to worker 2\n" << ps->Output();
  std::printf(
      "SIGTERM to sync worker 2 at step %lld: 30 more global steps in %.2f s (%.1f steps/s before; a lease "
      "is 20 s)\n",
      static_cast<long long>(at_signal), secs, pace);
  EXPECT_EQ(w[2]->Wait(absl::Seconds(20)), 143) << w[2]->Output();
  EXPECT_TRUE(Has(w[2]->Output(), "stopped by SIGTERM at step")) << w[2]->Output();
  EXPECT_EQ(w[0]->Wait(absl::Minutes(2)), 3) << w[0]->Output();
  EXPECT_EQ(w[1]->Wait(absl::Minutes(1)), 3) << w[1]->Output();
  EXPECT_EQ(ps->Wait(absl::Seconds(30)), 3) << ps->Output();
  const std::regex degraded(absl::StrCat("run degraded: training reached step ", kSteps, " of ", kSteps,
                                         " without worker 2 \\(stopped at step [0-9]+: SIGTERM at step"));
  EXPECT_TRUE(std::regex_search(ps->Output(), degraded)) << ps->Output();
  EXPECT_FALSE(Has(ps->Output(), "worker 2 lost")) << "it left; it was not lost";
}

// A linear model exported "from PyTorch" (Flatten + Gemm), so that the chief can --export_onnx.
std::string WriteLinearOnnx(const std::string& dir) {
  using models::onnx::testing::IntAttr;
  models::onnx::testing::OnnxBuilder b;
  b.Input("x", {-1, 1, 28, 28});
  b.Node("Flatten", {"x"}, {"flat"}, {IntAttr("axis", 1)});
  b.Initializer("fc.weight", {10, 784}, std::vector<float>(7840, 0.0f));
  b.Initializer("fc.bias", {10}, std::vector<float>(10, 0.0f));
  b.Node("Gemm", {"flat", "fc.weight", "fc.bias"}, {"logits"}, {IntAttr("transB", 1)});
  b.Output("logits", {-1, 10});
  const std::string path = dir + "/linear.onnx";
  std::ofstream(path, std::ios::binary) << b.Bytes();
  return path;
}

// SIGTERM to the chief mid-run: it evaluates, exports, leaves; the ps writes its final checkpoint at that
// step and tells worker 1, and every process exits by itself (chief 143, the others 4). dtrain_eval then
// evaluates the checkpoint with nothing but the model file: the data flags are in the checkpoint.
TEST(RunOutcome, SigtermToTheChiefStillCheckpointsEvaluatesAndExports) {
  Cluster c(1, 2, "sigterm_chief");
  const std::string model = WriteLinearOnnx(c.dir());
  const std::string ckpt = c.dir() + "/ckpt", exported = c.dir() + "/trained.onnx";
  std::filesystem::create_directories(ckpt);
  auto ps = c.StartPs(0, {"--checkpoint_dir=" + ckpt});
  const std::vector<std::string> train = {"--mode=sync", "--train_steps=100000", "--model=" + model,
                                          "--learning_rate=0.01"};
  std::vector<std::string> chief_flags = train;
  chief_flags.push_back("--export_onnx=" + exported);
  auto chief = c.StartWorker(0, chief_flags);
  auto worker = c.StartWorker(1, train);
  auto monitor = c.Monitor();
  ASSERT_NE(monitor, nullptr);
  ASSERT_TRUE(WaitForStep(*monitor, 40, absl::Now() + absl::Minutes(1))) << ps->Output();
  monitor.reset();  // its channel would hold the ps's shutdown for gRPC's grace period
  ASSERT_EQ(kill(chief->pid(), SIGTERM), 0);
  EXPECT_EQ(chief->Wait(absl::Minutes(1)), 143) << chief->Output();
  EXPECT_EQ(worker->Wait(absl::Seconds(30)), 4) << worker->Output();
  EXPECT_EQ(ps->Wait(absl::Seconds(30)), 4) << ps->Output();
  const std::string out = chief->Output();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m,
                                std::regex(absl::StrCat("step ([0-9]+): test accuracy = ([0-9.]+) \\(",
                                                        kTestExamples, " examples\\)"))))
      << out;
  const std::string step = m[1];
  EXPECT_TRUE(Has(out, "exported the trained model to " + exported)) << out;
  EXPECT_TRUE(std::filesystem::exists(exported));
  EXPECT_TRUE(Has(out, "run stopped at step " + step + " of 100000: the chief was stopped (SIGTERM)")) << out;
  EXPECT_TRUE(Has(ps->Output(), "final checkpoint of step " + step + " saved")) << ps->Output();
  EXPECT_TRUE(
      Has(ps->Output(), "run ended early at step " + step + " of 100000: the chief (worker 0) was stopped"))
      << ps->Output();
  EXPECT_TRUE(Has(worker->Output(), "the chief (worker 0) was stopped")) << worker->Output();
  EXPECT_TRUE(std::filesystem::exists(absl::StrCat(ckpt, "/model.ckpt-", step, ".ps0-of-1"))) << ps->Output();
  // The checkpoint holds the model and data flags: --checkpoint=DIR (the model's file exists) is enough, and
  // gives the chief's accuracy at that step.
  Subprocess eval({BinPath("dtrain_eval"), "--checkpoint=" + ckpt}, c.dir() + "/eval.log");
  EXPECT_EQ(eval.Wait(absl::Minutes(1)), 0) << eval.Output();
  EXPECT_TRUE(Has(eval.Output(), "dtrain_eval: from the checkpoint: ")) << eval.Output();
  EXPECT_TRUE(Has(eval.Output(), "--data_dir=" + std::filesystem::path(ImageData()).lexically_normal().string()))
      << eval.Output();
  EXPECT_TRUE(
      Has(eval.Output(), absl::StrCat("checkpoint model.ckpt-", step, ": test accuracy = ", m[2].str())))
      << eval.Output() << "\nchief: " << out;
}

// A checkpoint records its paths absolute: a run started in one directory with relative --model and --data_dir is
// evaluated from another with --checkpoint alone. When the recorded paths are gone, one error names them all as
// the checkpoint's, with the flags that replace them (exit 2), and those flags make it work again.
TEST(RunOutcome, EvalFromAnotherDirectoryFindsTheCheckpointsPaths) {
  const std::string dir = std::filesystem::canonical(Scratch("eval_elsewhere")).string();
  const std::string run = dir + "/run", elsewhere = dir + "/elsewhere", moved = dir + "/moved";
  std::filesystem::create_directories(elsewhere);
  std::filesystem::create_directories(run);
  std::filesystem::copy(ImageData(), run + "/data");
  WriteLinearOnnx(run);
  auto in = [](const std::string& cwd, const std::string& command) {
    return std::vector<std::string>{"/bin/sh", "-c", absl::StrCat("cd '", cwd, "' && exec ", command)};
  };
  Subprocess train(in(run, BinPath("dtrain_worker") + " --job_name=local --model=linear.onnx --data_dir=data "
                               "--train_steps=10 --log_every=1000 --learning_rate=0.01 --checkpoint_dir=ckpt"),
                   dir + "/train.log");
  ASSERT_EQ(train.Wait(absl::Minutes(1)), 0) << train.Output();
  std::smatch m;
  const std::string trained = train.Output();
  ASSERT_TRUE(std::regex_search(trained, m, std::regex("step 10: test accuracy = ([0-9.]+)"))) << trained;

  Subprocess eval(in(elsewhere, BinPath("dtrain_eval") + " --checkpoint=" + run + "/ckpt"), dir + "/eval.log");
  EXPECT_EQ(eval.Wait(absl::Minutes(1)), 0) << eval.Output();
  EXPECT_TRUE(Has(eval.Output(), "--data_dir=" + run + "/data")) << eval.Output();
  EXPECT_TRUE(Has(eval.Output(), "--model=" + run + "/linear.onnx")) << eval.Output();
  EXPECT_TRUE(Has(eval.Output(), "checkpoint model.ckpt-10: test accuracy = " + m[1].str())) << eval.Output();

  std::filesystem::rename(run, moved);
  Subprocess gone(in(elsewhere, BinPath("dtrain_eval") + " --checkpoint=" + moved + "/ckpt"), dir + "/gone.log");
  EXPECT_EQ(gone.Wait(absl::Minutes(1)), 2) << gone.Output();
  EXPECT_TRUE(Has(gone.Output(), absl::StrCat("dtrain_eval: the checkpoint's recorded paths are not there (from ",
                                              elsewhere, "): --data_dir=", run, "/data, --model=", run,
                                              "/linear.onnx; give --data_dir and --model to use another")))
      << gone.Output();
  Subprocess given(in(elsewhere, BinPath("dtrain_eval") + " --checkpoint=" + moved +
                                     "/ckpt --model=../moved/linear.onnx --data_dir=../moved/data"),
                   dir + "/given.log");
  EXPECT_EQ(given.Wait(absl::Minutes(1)), 0) << given.Output();
  EXPECT_TRUE(Has(given.Output(), "checkpoint model.ckpt-10: test accuracy = " + m[1].str())) << given.Output();
}

// SIGTERM to the ps mid-run: it saves its final checkpoint at the step it holds and tells the workers, who
// leave at once (4, naming it); it exits 143 once they left.
TEST(RunOutcome, SigtermToThePsCheckpointsAndTellsTheWorkers) {
  Cluster c(1, 2, "sigterm_ps");
  const std::string ckpt = c.dir() + "/ckpt";
  // The chief, not signalled, does not leave: the ps waits --chief_grace_secs for it, then ends the run.
  auto ps = c.StartPs(0, {"--checkpoint_dir=" + ckpt, "--chief_grace_secs=1"});
  auto chief = c.StartWorker(0, {"--mode=sync", "--train_steps=100000"});
  auto worker = c.StartWorker(1, {"--mode=sync", "--train_steps=100000"});
  auto monitor = c.Monitor();
  ASSERT_NE(monitor, nullptr);
  ASSERT_TRUE(WaitForStep(*monitor, 20, absl::Now() + absl::Minutes(1))) << ps->Output();
  monitor.reset();
  ASSERT_EQ(kill(ps->pid(), SIGTERM), 0);
  const absl::Time sent = absl::Now();
  EXPECT_EQ(chief->Wait(absl::Seconds(30)), 4) << chief->Output();
  EXPECT_EQ(worker->Wait(absl::Seconds(30)), 4) << worker->Output();
  EXPECT_LT(absl::Now() - sent, absl::Seconds(10)) << "the workers must hear it, not wait out a timeout";
  EXPECT_EQ(ps->Wait(absl::Seconds(30)), 143) << ps->Output();
  std::smatch m;
  const std::string out = ps->Output();
  ASSERT_TRUE(std::regex_search(out, m, std::regex("final checkpoint of step ([0-9]+) saved"))) << out;
  EXPECT_TRUE(std::filesystem::exists(absl::StrCat(ckpt, "/model.ckpt-", m[1].str(), ".ps0-of-1"))) << out;
  EXPECT_TRUE(
      Has(out, "run ended early at step " + m[1].str() + " of 100000: ps task 0 was stopped by SIGTERM"))
      << out;
  EXPECT_TRUE(Has(chief->Output(), "ps task 0 was stopped by SIGTERM")) << chief->Output();
  EXPECT_TRUE(Has(worker->Output(), "ps task 0 was stopped by SIGTERM")) << worker->Output();
  EXPECT_FALSE(Has(chief->Output() + worker->Output(), "type.dtrain")) << "a line for people, not payloads";
  EXPECT_TRUE(Has(out, "(--chief_grace_secs) for the chief to finish its step and leave")) << out;
}

// SIGTERM to every process at once, as when a Kubernetes Job is deleted or Slurm signals a job before its time
// limit: the ps waits for the chief, which finishes its step, evaluates and leaves; the final checkpoint is of
// the step the chief evaluated; the other worker leaves too. Every process exits 143.
TEST(RunOutcome, SigtermToEveryProcessAtOnceStillEvaluatesAndCheckpoints) {
  Cluster c(1, 2, "sigterm_all");
  const std::string ckpt = c.dir() + "/ckpt";
  auto ps = c.StartPs(0, {"--checkpoint_dir=" + ckpt});
  auto chief = c.StartWorker(0, {"--mode=sync", "--train_steps=100000"});
  auto worker = c.StartWorker(1, {"--mode=sync", "--train_steps=100000"});
  auto monitor = c.Monitor();
  ASSERT_NE(monitor, nullptr);
  ASSERT_TRUE(WaitForStep(*monitor, 20, absl::Now() + absl::Minutes(1))) << ps->Output();
  monitor.reset();
  for (Subprocess* p : {ps.get(), chief.get(), worker.get()}) ASSERT_EQ(kill(p->pid(), SIGTERM), 0);
  EXPECT_EQ(chief->Wait(absl::Seconds(30)), 143) << chief->Output();
  EXPECT_EQ(worker->Wait(absl::Seconds(30)), 143) << worker->Output();
  EXPECT_EQ(ps->Wait(absl::Seconds(30)), 143) << ps->Output();
  std::smatch m;
  const std::string out = chief->Output();
  ASSERT_TRUE(std::regex_search(out, m, std::regex("step ([0-9]+): test accuracy = [0-9.]+ \\(500 examples\\)")))
      << out;
  EXPECT_TRUE(Has(out, "run stopped at step " + m[1].str() + " of 100000: the chief was stopped (SIGTERM)")) << out;
  EXPECT_TRUE(Has(ps->Output(), "final checkpoint of step " + m[1].str() + " saved")) << ps->Output();
  EXPECT_TRUE(std::filesystem::exists(absl::StrCat(ckpt, "/model.ckpt-", m[1].str(), ".ps0-of-1")))
      << ps->Output();
}

// A built-in model with its own shape flags and data: dlrm on synthetic click-through-rate data, trained with
// --embedding_dim, --table_rows and --data_dir that differ from the defaults; dtrain_eval --checkpoint=DIR
// alone takes them from the checkpoint. Needs no data set.
TEST(RunOutcome, EvalOfABuiltInModelNeedsOnlyTheCheckpoint) {
  const std::string dir = Scratch("eval_alone");
  Subprocess data({BinPath("dtrain_convert"), "--synthetic_ctr", "--examples=2000", "--test_examples=500",
                   "--num_dense=4", "--num_sparse=3", "--vocab=500", "--out=" + dir + "/ctr"},
                  dir + "/data.log");
  ASSERT_EQ(data.Wait(absl::Minutes(1)), 0) << data.Output();
  Subprocess train(
      {BinPath("dtrain_worker"), "--job_name=local", "--model=dlrm", "--data_dir=" + dir + "/ctr",
       "--embedding_dim=8", "--dlrm_bottom=16", "--dlrm_top=16", "--table_rows=500", "--batch_size=64",
       "--train_steps=20", "--log_every=20", "--checkpoint_dir=" + dir + "/ckpt"},
      dir + "/train.log");
  ASSERT_EQ(train.Wait(absl::Minutes(2)), 0) << train.Output();
  const std::string trained = train.Output();
  EXPECT_TRUE(Has(trained, "run complete: training reached step 20 of 20")) << trained;
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(trained, m, std::regex("step 20: test log loss = ([0-9.]+), AUC = ([0-9.]+)")))
      << trained;
  Subprocess eval({BinPath("dtrain_eval"), "--checkpoint=" + dir + "/ckpt"}, dir + "/eval.log");
  EXPECT_EQ(eval.Wait(absl::Minutes(1)), 0) << eval.Output();
  EXPECT_TRUE(Has(eval.Output(), "--model=dlrm")) << eval.Output();
  EXPECT_TRUE(Has(eval.Output(), "--embedding_dim=8")) << eval.Output();
  EXPECT_TRUE(Has(eval.Output(), absl::StrCat("checkpoint model.ckpt-20: test log loss = ", m[1].str(),
                                              ", AUC = ", m[2].str())))
      << eval.Output() << "\ntraining: " << trained;
  // A flag given on the command line wins over the checkpoint's: another shape is refused, naming the flag.
  Subprocess other({BinPath("dtrain_eval"), "--checkpoint=" + dir + "/ckpt", "--embedding_dim=4"},
                   dir + "/other.log");
  EXPECT_NE(other.Wait(absl::Minutes(1)), 0) << other.Output();
  EXPECT_FALSE(Has(other.Output(), "--embedding_dim=8")) << other.Output();
}

// ---- the command line -------------------------------------------------------------------------------------

TEST(RunOutcome, HelpShowsEachBinarysOwnFlagsAndUnknownFlagsExitTwo) {
  struct Binary {
    std::string name, own_flag, group;
  };
  const std::vector<Binary> binaries = {
      {"dtrain_worker", "--train_steps (int, default 2000)", "\nTraining:\n"},
      {"dtrain_ps", "--worker_timeout_secs (number, default 20)", "\nCluster:\n"},
      {"dtrain_eval", "--checkpoint (string, default \"\")", "\nCheckpoints:\n"},
      {"dtrain_bench", "--window_steps (int", "\nTraining:\n"},
      {"dtrain_bench_ps", "--ids_per_step (int", "\nTraining:\n"},
      {"dtrain_convert", "--output_dir (string", "\nData:\n"},
  };
  for (const Binary& b : binaries) {
    const std::string dir = Scratch("help_" + b.name);
    Subprocess help({BinPath(b.name), "--help"}, dir + "/help.log");
    EXPECT_EQ(help.Wait(absl::Seconds(30)), 0) << help.Output();
    const std::string out = help.Output();
    EXPECT_TRUE(Has(out, "Usage: " + b.name)) << out;
    EXPECT_TRUE(Has(out, b.own_flag)) << b.name << ":\n" << out;
    EXPECT_TRUE(Has(out, b.group)) << b.name << ":\n" << out;
    EXPECT_FALSE(Has(out, "No flags matched")) << out;
    EXPECT_FALSE(Has(out, "--flagfile (")) << "Abseil's own flags only with --helpfull: " << out;
    Subprocess typo({BinPath(b.name), "--lerning_rate_x=1"}, dir + "/typo.log");
    EXPECT_EQ(typo.Wait(absl::Seconds(30)), 2) << typo.Output();
    EXPECT_TRUE(Has(typo.Output(), "unknown flag --lerning_rate_x")) << typo.Output();
  }
  const std::string dir = Scratch("help_close");
  Subprocess worker({BinPath("dtrain_worker"), "--job_name=local", "--trian_steps=5"}, dir + "/worker.log");
  EXPECT_EQ(worker.Wait(absl::Seconds(30)), 2);
  EXPECT_TRUE(Has(worker.Output(), "unknown flag --trian_steps; did you mean --train_steps?"))
      << worker.Output();
  Subprocess ps({BinPath("dtrain_ps"), "--mode=sync"}, dir + "/ps.log");
  EXPECT_EQ(ps.Wait(absl::Seconds(30)), 2);
  EXPECT_TRUE(Has(ps.Output(), "--mode is a flag of dtrain_worker, not of dtrain_ps")) << ps.Output();
}

// One flagfile for every process, as TensorFlow users keep one command line: the ps ignores the worker's
// flags in it with one note (and the workers the ps's), and the run completes.
TEST(RunOutcome, OneFlagfileServesThePsAndTheWorkers) {
  Cluster c(1, 1, "flagfile");
  const std::string flagfile = c.dir() + "/cluster.flags";
  {
    std::ofstream f(flagfile);
    f << "# the cluster's flags, for every process\n";
    for (const std::string& flag : c.ClusterFlags()) f << flag << "\n";
    f << "--mode=sync\n--model=mlp\n--train_steps=10\n--worker_timeout_secs=10\n--max_model_bytes="
         "100000000\n";
  }
  auto ps = c.StartPs(0, {"--flagfile=" + flagfile});
  Subprocess worker({BinPath("dtrain_worker"), "--flagfile=" + flagfile, "--job_name=worker",
                     "--task_index=0", "--data_dir=" + ImageData()},
                    c.dir() + "/worker.log");
  EXPECT_EQ(worker.Wait(absl::Minutes(1)), 0) << worker.Output();
  EXPECT_EQ(ps->Wait(absl::Seconds(30)), 0) << ps->Output();
  EXPECT_TRUE(Has(ps->Output(),
                  "dtrain_ps: ignoring 3 flags of dtrain_worker from the shared --flagfile: --mode, "
                  "--model, --train_steps"))
      << ps->Output();
  EXPECT_TRUE(Has(worker.Output(),
                  "dtrain_worker: ignoring 2 flags of dtrain_ps from the shared --flagfile: "
                  "--worker_timeout_secs, --max_model_bytes"))
      << worker.Output();
}

// ---- where the wall-clock goes ----------------------------------------------------------------------------

// A worker's "worker K: phases: start S s, train T s, evaluate E s" lines.
struct Phases {
  double start = -1, train = -1, evaluate = -1;
};
std::vector<Phases> PhasesLines(const std::string& out, int worker) {
  std::vector<Phases> lines;
  const std::regex line(absl::StrCat("worker ", worker,
                                     ": phases: start ([0-9]+\\.[0-9]{3}) s, train ([0-9]+\\.[0-9]{3}) s, "
                                     "evaluate ([0-9]+\\.[0-9]{3}) s\n"));
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator(); ++it) {
    lines.push_back({std::stod((*it)[1]), std::stod((*it)[2]), std::stod((*it)[3])});
  }
  return lines;
}

// One phases line, each part within the process's wall-clock (measured here from before its start to its exit;
// the start is the kernel's, to its clock tick), a chief's evaluation not empty, another worker's 0.
void ExpectSanePhases(const std::string& out, int worker, double wall_secs) {
  const std::vector<Phases> lines = PhasesLines(out, worker);
  ASSERT_EQ(lines.size(), 1u) << out;
  const Phases& p = lines[0];
  const double tick = 1.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
  EXPECT_GT(p.start, 0) << out;
  EXPECT_GT(p.train, 0) << out;
  EXPECT_LE(p.start, wall_secs + tick) << out;
  EXPECT_LE(p.start + p.train + p.evaluate, wall_secs + tick) << out;
  if (worker == 0) {
    EXPECT_GT(p.evaluate, 0) << out;
  } else {
    EXPECT_EQ(p.evaluate, 0) << out;
  }
  std::printf("worker %d: start %.3f s, train %.3f s, evaluate %.3f s of a %.3f s process\n", worker, p.start,
              p.train, p.evaluate, wall_secs);
}

// When `pid` (a child not reaped yet) has exited, without reaping it; InfiniteFuture while it runs.
absl::Time ExitedAt(int pid, absl::Time now) {
  siginfo_t info{};
  if (waitid(P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid) return now;
  return absl::InfiniteFuture();
}

// Once the last worker is gone nobody needs the ps: it exits within a second (it used to linger 2 s more),
// having told every worker how the run ended (each prints the outcome line it got from ps 0, and exits 0).
TEST(RunOutcome, PsExitsPromptlyAfterTheLastWorkerAndThePhasesAddUp) {
  Cluster c(1, 2, "prompt_exit");
  auto ps = c.StartPs(0);
  const absl::Time started = absl::Now();
  std::vector<std::unique_ptr<Subprocess>> w;
  for (int i = 0; i < 2; ++i) w.push_back(c.StartWorker(i, {"--mode=sync", "--train_steps=30"}));
  // Every process's exit, seen within 5 ms.
  std::vector<absl::Time> exited(3, absl::InfiniteFuture());
  const std::vector<int> pids = {w[0]->pid(), w[1]->pid(), ps->pid()};
  const absl::Time deadline = absl::Now() + absl::Minutes(2);
  while (absl::Now() < deadline &&
         std::any_of(exited.begin(), exited.end(), [](absl::Time t) { return t == absl::InfiniteFuture(); })) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (exited[i] == absl::InfiniteFuture()) exited[i] = ExitedAt(pids[i], absl::Now());
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(w[0]->Wait(absl::Seconds(1)), 0) << w[0]->Output();
  EXPECT_EQ(w[1]->Wait(absl::Seconds(1)), 0) << w[1]->Output();
  EXPECT_EQ(ps->Wait(absl::Seconds(1)), 0) << ps->Output();
  const absl::Time last_worker = std::max(exited[0], exited[1]);
  ASSERT_LT(last_worker, absl::InfiniteFuture());
  ASSERT_LT(exited[2], absl::InfiniteFuture());
  const double after = absl::ToDoubleSeconds(exited[2] - last_worker);
  std::printf("the ps exited %.3f s after the last worker\n", after);
  EXPECT_LT(after, 1.0) << ps->Output();
  const std::string line = "run complete: training reached step 30 of 30; all 2 workers completed";
  EXPECT_TRUE(Has(w[0]->Output(), line)) << w[0]->Output();
  EXPECT_FALSE(Has(w[1]->Output(), "could not ask ps task 0")) << w[1]->Output();
  for (int i = 0; i < 2; ++i) ExpectSanePhases(w[i]->Output(), i, absl::ToDoubleSeconds(exited[i] - started));
}

TEST(RunOutcome, LocalModePrintsItsPhasesToo) {
  const std::string dir = Scratch("local_phases");
  const absl::Time started = absl::Now();
  Subprocess local({BinPath("dtrain_worker"), "--job_name=local", "--train_steps=20", "--log_every=1000",
                    "--data_dir=" + ImageData()},
                   dir + "/local.log");
  EXPECT_EQ(local.Wait(absl::Minutes(1)), 0) << local.Output();
  ExpectSanePhases(local.Output(), 0, absl::ToDoubleSeconds(absl::Now() - started));
  // --threads=auto by default: one line says what it chose and why.
  EXPECT_TRUE(std::regex_search(local.Output(), std::regex("threads: [0-9]+ \\(--threads=auto: [0-9]+ CPUs? in "
                                                           "the affinity mask, ")))
      << local.Output();
}

}  // namespace
}  // namespace dtrain::testing
