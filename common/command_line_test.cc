#include "common/command_line.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"

ABSL_FLAG(std::string, test_model, "mlp", "The model to train");
ABSL_FLAG(int64_t, test_train_steps, 2000, "Train until the global step reaches this");
ABSL_FLAG(bool, test_shuffle, true, "Shuffle every epoch");
ABSL_FLAG(double, test_learning_rate, 0.01, "Learning rate");
ABSL_FLAG(double, test_warmup_start_factor, 1.0 / 3, "The warmup starts at this fraction of the rate");
ABSL_FLAG(std::string, test_checkpoint_dir, "", "Checkpoints here");

namespace dtrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

class CommandLineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_.program = "dtrain_test";
    spec_.summary = "a test binary";
    spec_.peer_program = "dtrain_peer";
    spec_.peer_flags = {"mode", "replicas_to_aggregate"};
  }
  std::string WriteFile(const std::string& name, const std::string& text) {
    const std::string path = ::testing::TempDir() + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  absl::StatusOr<ParsedCommandLine> Parse(std::vector<std::string> args) {
    args.insert(args.begin(), "dtrain_test");
    return ParseCommandLineArgs(args, spec_);
  }
  CommandLineSpec spec_;
  absl::FlagSaver flags_;  // what a test (or a parse) sets goes back to the defaults after it
};

TEST_F(CommandLineTest, SetsFlagsInEveryForm) {
  absl::StatusOr<ParsedCommandLine> p =
      Parse({"--test_model=cnn", "--test_train_steps", "300", "-test_learning_rate=0.5", "--notest_shuffle"});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(absl::GetFlag(FLAGS_test_model), "cnn");
  EXPECT_EQ(absl::GetFlag(FLAGS_test_train_steps), 300);
  EXPECT_EQ(absl::GetFlag(FLAGS_test_learning_rate), 0.5);
  EXPECT_FALSE(absl::GetFlag(FLAGS_test_shuffle));
  EXPECT_EQ(p->specified.count("test_model"), 1u);
  EXPECT_EQ(p->specified.count("test_shuffle"), 1u);
  EXPECT_EQ(p->specified.count("test_checkpoint_dir"), 0u);
  ASSERT_TRUE(Parse({"--test_shuffle"}).ok());
  EXPECT_TRUE(absl::GetFlag(FLAGS_test_shuffle));
}

TEST_F(CommandLineTest, UnknownFlagNamesTheClosest) {
  absl::StatusOr<ParsedCommandLine> p = Parse({"--test_lerning_rate=0.1"});
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("unknown flag --test_lerning_rate"));
  EXPECT_THAT(p.status().message(), HasSubstr("did you mean --test_learning_rate"));
  p = Parse({"--zzzzzzzzzzzz=1"});
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("dtrain_test --help lists its flags"));
}

TEST_F(CommandLineTest, BadValueAndMissingValueAreRefused) {
  absl::StatusOr<ParsedCommandLine> p = Parse({"--test_train_steps=abc"});
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("--test_train_steps=abc"));
  p = Parse({"--test_model"});
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("--test_model needs a value"));
  p = Parse({"stray"});
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("unexpected argument 'stray'"));
}

TEST_F(CommandLineTest, SharedFlagfileIgnoresPeerFlagsWithOneNote) {
  const std::string inner = WriteFile("inner.flags", "--test_train_steps=77\n--replicas_to_aggregate=2\n");
  const std::string path = WriteFile("shared.flags",
                                     "# the cluster's flags\n\n--test_model=cnn\n  --mode=async\n"
                                     "--flagfile=" +
                                         inner + "\n--mode=sync\n");
  absl::StatusOr<ParsedCommandLine> p = Parse({"--flagfile=" + path, "--test_train_steps=5"});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(absl::GetFlag(FLAGS_test_model), "cnn");
  EXPECT_EQ(absl::GetFlag(FLAGS_test_train_steps), 5);  // the command line after the file wins
  EXPECT_THAT(p->ignored, ElementsAre("mode", "replicas_to_aggregate"));
  EXPECT_THAT(p->note, HasSubstr("ignoring 2 flags of dtrain_peer from the shared --flagfile: --mode, "
                                 "--replicas_to_aggregate"));
  // On the command line itself a peer's flag is a mistake, said so.
  p = Parse({"--mode=sync"});
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("--mode is a flag of dtrain_peer, not of dtrain_test"));
  // A misspelt peer flag: refused, the peer's flag suggested as the peer's.
  p = Parse({"--moed=sync"});
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(),
              HasSubstr("unknown flag --moed; did you mean --mode? (a flag of dtrain_peer, not of dtrain_test)"));
  // A typo in the shared file is not a peer flag: refused, naming the file.
  const std::string typo = WriteFile("typo.flags", "--test_modle=cnn\n");
  p = Parse({"--flagfile=" + typo});
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("in --flagfile=" + typo));
  EXPECT_THAT(p.status().message(), HasSubstr("did you mean --test_model"));
  p = Parse({"--flagfile=/nonexistent/x.flags"});
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("cannot read"));
  const std::string loop = WriteFile("loop.flags", "--flagfile=" + ::testing::TempDir() + "/loop.flags\n");
  EXPECT_FALSE(Parse({"--flagfile=" + loop}).ok());
}

TEST_F(CommandLineTest, HelpListsOwnFlagsInGroupsWithDefaults) {
  absl::StatusOr<ParsedCommandLine> p = Parse({"--help"});
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->help);
  const std::string help = FormatHelp(spec_);
  EXPECT_THAT(help, HasSubstr("dtrain_test: a test binary"));
  EXPECT_THAT(help, HasSubstr("  --test_train_steps (int, default 2000)\n      Train until the global step"));
  EXPECT_THAT(help, HasSubstr("  --test_model (string, default \"mlp\")"));
  EXPECT_THAT(help, HasSubstr("  --test_shuffle (bool, default true)"));
  EXPECT_THAT(help, HasSubstr("  --test_warmup_start_factor (number, default 0.333333)"));
  EXPECT_THAT(help, HasSubstr("  --test_learning_rate (number, default 0.01)"));
  EXPECT_THAT(help, HasSubstr("\nCheckpoints:\n  --test_checkpoint_dir"));
  EXPECT_THAT(help, Not(HasSubstr("--flagfile (")));  // Abseil's own (where linked) only with --helpfull
  EXPECT_THAT(FormatHelp(spec_, /*all=*/true), HasSubstr("  --test_model (string, default \"mlp\")"));
}

TEST(FlagGroupTest, ByRuleSoNewFlagsLandSomewhereSensible) {
  EXPECT_EQ(FlagGroupOf("ps_hosts", "ps/main.cc"), "Cluster");
  EXPECT_EQ(FlagGroupOf("transport", "worker/app/main.cc"), "Cluster");
  EXPECT_EQ(FlagGroupOf("channels_per_ps", "ps/main.cc"), "Cluster");
  EXPECT_EQ(FlagGroupOf("worker_timeout_secs", "ps/main.cc"), "Cluster");
  EXPECT_EQ(FlagGroupOf("checkpoint_dir", "ps/main.cc"), "Checkpoints");
  EXPECT_EQ(FlagGroupOf("save_checkpoint_steps", "ps/main.cc"), "Checkpoints");
  EXPECT_EQ(FlagGroupOf("tls_server_name", "worker/app/main.cc"), "Security");
  EXPECT_EQ(FlagGroupOf("model", "worker/app/main.cc"), "Model");
  EXPECT_EQ(FlagGroupOf("dlrm_top", "worker/app/data_flags.cc"), "Model");
  EXPECT_EQ(FlagGroupOf("data_dir", "worker/app/main.cc"), "Data");
  EXPECT_EQ(FlagGroupOf("input_mean", "worker/app/input_flags.cc"), "Data");
  EXPECT_EQ(FlagGroupOf("replicas_to_aggregate", "worker/app/main.cc"), "Training");
  EXPECT_EQ(FlagGroupOf("elastic_batch", "worker/app/main.cc"), "Training");
  // The optimizer, its schedule, and the online flags have groups of their own (not "Other").
  EXPECT_EQ(FlagGroupOf("learning_rate", "worker/app/main.cc"), "Optimizer and schedule");
  EXPECT_EQ(FlagGroupOf("beta1", "worker/app/optimizer_flags.cc"), "Optimizer and schedule");
  EXPECT_EQ(FlagGroupOf("lr_schedule", "worker/app/main.cc"), "Optimizer and schedule");
  EXPECT_EQ(FlagGroupOf("warmup_start_factor", "worker/app/main.cc"), "Optimizer and schedule");
  EXPECT_EQ(FlagGroupOf("sparse_optimizer", "worker/app/main.cc"), "Optimizer and schedule");
  EXPECT_EQ(FlagGroupOf("warmup_steps", "worker/app/bench_main.cc"), "Training");  // a benchmark's, before timing
  EXPECT_EQ(FlagGroupOf("follow", "worker/app/main.cc"), "Online and deltas");
  EXPECT_EQ(FlagGroupOf("delta_every_secs", "ps/main.cc"), "Online and deltas");
  EXPECT_EQ(FlagGroupOf("bad_records", "worker/app/main.cc"), "Online and deltas");
  EXPECT_EQ(FlagGroupOf("max_push_rows", "ps/main.cc"), "Cluster");
  EXPECT_EQ(FlagGroupOf("row_dtype", "worker/app/main.cc"), "Model");
  EXPECT_EQ(FlagGroupOf("push_journal_dir", "worker/app/main.cc"), "Checkpoints");
  EXPECT_EQ(FlagGroupOf("towers", "worker/app/main.cc"), "Compute");
  EXPECT_EQ(FlagGroupOf("logdir", "worker/app/main.cc"), "Output");
  EXPECT_EQ(FlagGroupOf("trace_steps", "worker/app/main.cc"), "Output");  // not a training length (*_steps)
  EXPECT_EQ(FlagGroupOf("trace_steps", "ps/main.cc"), "Output");
  EXPECT_EQ(FlagGroupOf("trace_dir", "ps/main.cc"), "Output");
  EXPECT_EQ(FlagGroupOf("frobnicate", "x.cc"), "Other");
}

TEST(ClosestFlagsTest, EditDistanceAndContainment) {
  const std::vector<std::string> known = {"learning_rate", "sparse_learning_rate", "train_steps",
                                          "batch_size"};
  EXPECT_THAT(ClosestFlags("learning_rte", known), ElementsAre("learning_rate"));
  EXPECT_THAT(ClosestFlags("train_step", known), ElementsAre("train_steps"));
  EXPECT_TRUE(ClosestFlags("zzz", known).empty());
  // A short name inside a long one is no match; a long one inside is, after the close spellings.
  EXPECT_THAT(ClosestFlags("output_dri", {"out", "output_dir"}), ElementsAre("output_dir"));
  EXPECT_THAT(ClosestFlags("learning_rate", known), ElementsAre("learning_rate", "sparse_learning_rate"));
}

TEST_F(CommandLineTest, FlagValuesRoundTripKeepingWhatWasGiven) {
  absl::SetFlag(&FLAGS_test_model, "dlrm");
  absl::SetFlag(&FLAGS_test_train_steps, 9);
  const std::vector<std::string> lines = FlagValues({"no/such/file.cc"}, {"test_model", "test_train_steps"});
  EXPECT_THAT(lines, ElementsAre("test_model=dlrm", "test_train_steps=9"));
  absl::SetFlag(&FLAGS_test_model, "mlp");
  absl::SetFlag(&FLAGS_test_train_steps, 1);
  ASSERT_TRUE(SetFlagValues(lines, {"test_train_steps"}).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_test_model), "dlrm");
  EXPECT_EQ(absl::GetFlag(FLAGS_test_train_steps), 1);
  EXPECT_TRUE(SetFlagValues({"no_such_flag=1"}, {}).ok());  // another binary's flag: skipped
  EXPECT_FALSE(SetFlagValues({"no equals sign"}, {}).ok());
  EXPECT_FALSE(SetFlagValues({"test_train_steps=x"}, {}).ok());
}

}  // namespace
}  // namespace dtrain
