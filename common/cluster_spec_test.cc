#include "common/cluster_spec.h"

#include <stdlib.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "common/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Writes `content` to a fresh file under the test temp dir and returns its path.
std::string WriteTempFile(const std::string& name, const std::string& content) {
  std::string path = ::testing::TempDir() + "/cluster_spec_test." + std::to_string(::getpid()) +
                     "." + name;
  absl::Status s = WriteFileAtomically(path, content);
  EXPECT_TRUE(s.ok()) << s;
  return path;
}

// Asserts InvalidArgument whose message contains every fragment, and is one line.
void ExpectInvalid(const absl::StatusOr<ClusterConfig>& result,
                   const std::vector<std::string>& fragments) {
  ASSERT_FALSE(result.ok()) << "expected an error, got " << result->DebugString();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
  const std::string message(result.status().message());
  for (const std::string& f : fragments) EXPECT_THAT(message, HasSubstr(f));
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

void ExpectSameCluster(const ClusterConfig& a, const ClusterConfig& b) {
  EXPECT_EQ(a.ps, b.ps);
  EXPECT_EQ(a.worker, b.worker);
  EXPECT_EQ(a.job_name, b.job_name);
  EXPECT_EQ(a.task_index, b.task_index);
  EXPECT_EQ(a.is_chief(), b.is_chief());
  EXPECT_EQ(a.address(), b.address());
}

constexpr char kPsHosts[] = "10.0.0.1:2222,10.0.0.2:2222";
constexpr char kWorkerHosts[] = "10.0.0.3:2222,10.0.0.4:2223";
constexpr char kClusterJson[] =
    R"({"ps": ["10.0.0.1:2222", "10.0.0.2:2222"], "worker": ["10.0.0.3:2222", "10.0.0.4:2223"]})";
constexpr char kTfConfigWorker1[] =
    R"({"cluster": {"ps": ["10.0.0.1:2222", "10.0.0.2:2222"],
                    "worker": ["10.0.0.3:2222", "10.0.0.4:2223"]},
        "task": {"type": "worker", "index": 1}})";

TEST(ClusterSpecTest, FlagsSource) {
  absl::StatusOr<ClusterConfig> c = ClusterFromFlags(kPsHosts, kWorkerHosts, "worker", 1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->ps, ElementsAre("10.0.0.1:2222", "10.0.0.2:2222"));
  EXPECT_THAT(c->worker, ElementsAre("10.0.0.3:2222", "10.0.0.4:2223"));
  EXPECT_EQ(c->job_name, "worker");
  EXPECT_EQ(c->task_index, 1);
  EXPECT_FALSE(c->is_chief());
  EXPECT_EQ(c->address(), "10.0.0.4:2223");
  EXPECT_EQ(c->num_ps(), 2);
  EXPECT_EQ(c->num_workers(), 2);
  EXPECT_FALSE(c->chief_folded);
  EXPECT_THAT(c->DebugString(), HasSubstr("worker:1 at 10.0.0.4:2223"));
}

TEST(ClusterSpecTest, ThreeSourcesGiveTheSameConfig) {
  const std::string path = WriteTempFile("same.json", kClusterJson);
  for (const auto& [job, index] : std::vector<std::pair<std::string, int>>{
           {"worker", 0}, {"worker", 1}, {"ps", 0}, {"ps", 1}}) {
    SCOPED_TRACE(job + ":" + std::to_string(index));
    ClusterFlags from_hosts{"", kPsHosts, kWorkerHosts, job, index};
    ClusterFlags from_file{path, "", "", job, index};
    const std::string tf_config = std::string(R"({"cluster": )") + kClusterJson +
                                  R"(, "task": {"type": ")" + job +
                                  R"(", "index": )" + std::to_string(index) + "}}";
    absl::StatusOr<ClusterConfig> a = ResolveCluster(from_hosts, "");
    absl::StatusOr<ClusterConfig> b = ResolveCluster(from_file, "");
    absl::StatusOr<ClusterConfig> c = ResolveCluster(ClusterFlags{}, tf_config);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_TRUE(c.ok()) << c.status();
    ExpectSameCluster(*a, *b);
    ExpectSameCluster(*a, *c);
    EXPECT_EQ(a->job_name, job);
    EXPECT_EQ(a->task_index, index);
    EXPECT_EQ(a->is_chief(), job == "worker" && index == 0);
    EXPECT_EQ(a->source, "--ps_hosts/--worker_hosts");
    EXPECT_EQ(b->source, "--cluster_spec=" + path);
    EXPECT_EQ(c->source, "TF_CONFIG");
  }
  ::unlink(path.c_str());
}

TEST(ClusterSpecTest, ResolvePriorityFileThenHostsThenTfConfig) {
  const std::string path = WriteTempFile("priority.json", R"({"ps": ["f:1"], "worker": ["f:2"]})");
  // A file wins over TF_CONFIG.
  absl::StatusOr<ClusterConfig> c = ResolveCluster({path, "", "", "ps", 0}, kTfConfigWorker1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->ps, ElementsAre("f:1"));
  // Hosts win over TF_CONFIG.
  c = ResolveCluster({"", "h:1", "h:2", "worker", 0}, kTfConfigWorker1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->worker, ElementsAre("h:2"));
  // Both explicit sources at once is a mistake.
  ExpectInvalid(ResolveCluster({path, "h:1", "h:2", "worker", 0}, ""), {"not both"});
  // TF_CONFIG's task can be overridden by explicit flags.
  c = ResolveCluster({"", "", "", "ps", 1}, kTfConfigWorker1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->job_name, "ps");
  EXPECT_EQ(c->address(), "10.0.0.2:2222");
  ::unlink(path.c_str());
}

TEST(ClusterSpecTest, ResolveRequiresSomething) {
  ExpectInvalid(ResolveCluster(ClusterFlags{}, ""), {"no cluster given", "TF_CONFIG"});
  ExpectInvalid(ResolveCluster(ClusterFlags{}, "  \n"), {"no cluster given"});
  ExpectInvalid(ResolveCluster({"", kPsHosts, kWorkerHosts, "", 0}, ""), {"--job_name is required"});
  ExpectInvalid(ResolveCluster({"", kPsHosts, kWorkerHosts, "worker", -1}, ""),
                {"--task_index is required"});
}

TEST(ClusterSpecTest, LocalJob) {
  for (const absl::StatusOr<ClusterConfig>& c :
       {ResolveCluster({"", "", "", "local", -1}, ""), ResolveCluster({"", "", "", "local", 0}, ""),
        ResolveCluster({"", "", "", "local", -1}, kTfConfigWorker1),
        ClusterFromFlags("", "", "local", 0)}) {
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(c->is_local());
    EXPECT_TRUE(c->is_chief());
    EXPECT_EQ(c->num_ps(), 0);
    EXPECT_EQ(c->address(), "");
    EXPECT_THAT(c->DebugString(), HasSubstr("local"));
  }
  ExpectInvalid(ResolveCluster({"", kPsHosts, kWorkerHosts, "local", 0}, ""),
                {"local", "without a cluster"});
  ExpectInvalid(ResolveCluster({"", "", "", "local", 2}, ""), {"--task_index=2"});
  ExpectInvalid(ClusterFromFlags(kPsHosts, "", "local", 0), {"'local'"});
}

TEST(ClusterSpecTest, TfConfigChiefIsFoldedIntoWorkerZero) {
  const std::string cluster = R"("cluster": {"chief": ["c:1"], "worker": ["w:1", "w:2"], "ps": ["p:1"]})";
  auto tf = [&](const std::string& type, int index) {
    return ClusterFromTfConfig("{" + cluster + R"(, "task": {"type": ")" + type +
                               R"(", "index": )" + std::to_string(index) + "}}");
  };
  absl::StatusOr<ClusterConfig> chief = tf("chief", 0);
  ASSERT_TRUE(chief.ok()) << chief.status();
  EXPECT_THAT(chief->worker, ElementsAre("c:1", "w:1", "w:2"));
  EXPECT_THAT(chief->ps, ElementsAre("p:1"));
  EXPECT_EQ(chief->job_name, "worker");
  EXPECT_EQ(chief->task_index, 0);
  EXPECT_TRUE(chief->is_chief());
  EXPECT_TRUE(chief->chief_folded);
  EXPECT_EQ(chief->original_job_name, "chief");
  EXPECT_EQ(chief->original_task_index, 0);
  EXPECT_EQ(chief->address(), "c:1");
  EXPECT_THAT(chief->DebugString(), HasSubstr("chief:0"));

  for (int tf_index = 0; tf_index < 2; ++tf_index) {
    absl::StatusOr<ClusterConfig> w = tf("worker", tf_index);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(w->job_name, "worker");
    EXPECT_EQ(w->task_index, tf_index + 1);
    EXPECT_FALSE(w->is_chief());
    EXPECT_EQ(w->original_task_index, tf_index);
    EXPECT_EQ(w->address(), "w:" + std::to_string(tf_index + 1));
  }
  absl::StatusOr<ClusterConfig> ps = tf("ps", 0);
  ASSERT_TRUE(ps.ok()) << ps.status();
  EXPECT_EQ(ps->address(), "p:1");
  EXPECT_EQ(ps->num_workers(), 3);

  // A TF worker past the list joins a running elastic job (as worker index + 1: the chief is worker 0).
  absl::StatusOr<ClusterConfig> joining = tf("worker", 2);
  ASSERT_TRUE(joining.ok()) << joining.status();
  EXPECT_TRUE(joining->joining);
  EXPECT_EQ(joining->task_index, 3);
  EXPECT_EQ(joining->address(), "");
  ExpectInvalid(tf("chief", 1), {"task_index 1 out of range: job 'chief' has 1 task"});
  // A chief alone is a valid worker job.
  absl::StatusOr<ClusterConfig> only_chief = ClusterFromTfConfig(
      R"({"cluster": {"chief": ["c:1"], "ps": ["p:1"]}, "task": {"type": "chief", "index": 0}})");
  ASSERT_TRUE(only_chief.ok()) << only_chief.status();
  EXPECT_THAT(only_chief->worker, ElementsAre("c:1"));
  ExpectInvalid(
      ClusterFromTfConfig(R"({"cluster": {"chief": ["c:1", "c:2"], "ps": ["p:1"]},
                              "task": {"type": "chief", "index": 0}})"),
      {"'chief'", "exactly 1 task, has 2"});
}

TEST(ClusterSpecTest, ClusterSpecFileWithChief) {
  absl::StatusOr<ClusterConfig> c =
      ClusterFromJson(R"({"chief": ["c:1"], "worker": ["w:1"], "ps": ["p:1"]})", "worker", 0);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->worker, ElementsAre("c:1", "w:1"));
  EXPECT_EQ(c->task_index, 1);
}

TEST(ClusterSpecTest, TfConfigEvaluatorIgnoredAndPsTask) {
  absl::StatusOr<ClusterConfig> c = ClusterFromTfConfig(
      R"({"cluster": {"worker": ["w:1"], "ps": ["p:1", "p:2"], "evaluator": ["e:1"]},
          "task": {"type": "ps", "index": 0}, "environment": "cloud"})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->job_name, "ps");
  EXPECT_EQ(c->task_index, 0);
  EXPECT_EQ(c->address(), "p:1");
  EXPECT_THAT(c->worker, ElementsAre("w:1"));
  EXPECT_FALSE(c->is_chief());
  ExpectInvalid(ClusterFromTfConfig(R"({"cluster": {"worker": ["w:1"], "ps": ["p:1"],
                                                    "evaluator": ["e:1"]},
                                        "task": {"type": "evaluator", "index": 0}})"),
                {"evaluator"});
  // The evaluator's address still counts for duplicates.
  ExpectInvalid(ClusterFromTfConfig(R"({"cluster": {"worker": ["w:1"], "ps": ["p:1"],
                                                    "evaluator": ["w:1"]},
                                        "task": {"type": "ps", "index": 0}})"),
                {"duplicate address 'w:1'"});
}

TEST(ClusterSpecTest, TfConfigIndexDefaultsToZero) {
  absl::StatusOr<ClusterConfig> c =
      ClusterFromTfConfig(R"({"cluster": {"worker": ["w:1"], "ps": ["p:1"]}, "task": {"type": "worker"}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->task_index, 0);
  EXPECT_TRUE(c->is_chief());
}

TEST(ClusterSpecTest, Ipv6Addresses) {
  absl::StatusOr<ClusterConfig> c = ClusterFromFlags("[::1]:2222", "[::1]:2223,[fe80::1%eth0]:1", "worker", 0);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->address(), "[::1]:2223");
  c = ClusterFromTfConfig(R"({"cluster": {"ps": ["[2001:db8::1]:2222"], "worker": ["[2001:db8::2]:2222"]},
                              "task": {"type": "ps", "index": 0}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->address(), "[2001:db8::1]:2222");
  ExpectInvalid(ClusterFromFlags("[::1]:2222", "[::1]:2222", "worker", 0), {"duplicate address"});
  ExpectInvalid(ClusterFromFlags("::1:2222", "[::1]:2223", "worker", 0), {"'::1:2222'", "brackets"});
}

TEST(SplitHostPortTest, Valid) {
  auto hp = SplitHostPort("example.com:2222");
  ASSERT_TRUE(hp.ok()) << hp.status();
  EXPECT_EQ(hp->first, "example.com");
  EXPECT_EQ(hp->second, 2222);
  hp = SplitHostPort("[::1]:65535");
  ASSERT_TRUE(hp.ok()) << hp.status();
  EXPECT_EQ(hp->first, "::1");
  EXPECT_EQ(hp->second, 65535);
  hp = SplitHostPort("localhost:0");  // port 0 is fine for binding
  ASSERT_TRUE(hp.ok()) << hp.status();
  EXPECT_EQ(hp->second, 0);
}

TEST(SplitHostPortTest, Invalid) {
  struct Case {
    const char* address;
    const char* fragment;
  };
  for (const Case& c : std::vector<Case>{
           {"127.0.0.1", "'127.0.0.1' has no port"},
           {"127.0.0.1:", "'127.0.0.1:' has no port"},
           {":2222", "empty host"},
           {"[]:2222", "empty host"},
           {"h:abc", "invalid port 'abc'"},
           {"h:65536", "invalid port '65536'"},
           {"h:-1", "invalid port '-1'"},
           {"h:+1", "invalid port '+1'"},
           {"h:1.5", "invalid port '1.5'"},
           {"h:123456", "invalid port '123456'"},
           {"[::1]", "'[::1]' has no port"},
           {"[::1:2222", "no closing ']'"},
           {"[::1]2222", "after ']'"},
           {"fe80::1:2222", "brackets"},
           {"grpc://h:1", "without a scheme"},
           {"ho st:1", "invalid character ' '"},
           {"", "empty address"},
       }) {
    auto hp = SplitHostPort(c.address);
    ASSERT_FALSE(hp.ok()) << c.address;
    EXPECT_EQ(hp.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(hp.status().message()), HasSubstr(c.fragment)) << c.address;
  }
}

TEST(ClusterSpecTest, BadJson) {
  ExpectInvalid(ClusterFromTfConfig(R"({"cluster": {"ps": ["p:1"],})"),
                {"TF_CONFIG is not valid JSON", "line 1, column"});
  ExpectInvalid(ClusterFromJson("{\n  \"ps\": [\"p:1\"\n", "ps", 0, "--cluster_spec=x.json"),
                {"--cluster_spec=x.json is not valid JSON", "line 3"});
  ExpectInvalid(ClusterFromTfConfig(""), {"not valid JSON"});
}

TEST(ClusterSpecTest, WrongJsonTypes) {
  ExpectInvalid(ClusterFromTfConfig("[1, 2]"), {"TF_CONFIG must be a JSON object, got array"});
  ExpectInvalid(ClusterFromTfConfig(R"({"task": {"type": "ps", "index": 0}})"), {"no \"cluster\""});
  ExpectInvalid(ClusterFromTfConfig(R"({"cluster": ["p:1"], "task": {"type": "ps"}})"),
                {"must be a JSON object", "got array"});
  ExpectInvalid(ClusterFromTfConfig(R"({"cluster": {"ps": "p:1"}, "task": {"type": "ps"}})"),
                {"job 'ps' must be a list", "got string"});
  ExpectInvalid(ClusterFromTfConfig(R"({"cluster": {"ps": [2222]}, "task": {"type": "ps"}})"),
                {"job 'ps' task 0 must be a \"host:port\" string, got number"});
  ExpectInvalid(ClusterFromTfConfig(R"({"cluster": {"ps": ["p:1"], "worker": ["w:1"]},
                                        "task": {"type": "ps", "index": "0"}})"),
                {"task.index must be an integer", "\"0\""});
  ExpectInvalid(ClusterFromTfConfig(R"({"cluster": {"ps": ["p:1"], "worker": ["w:1"]},
                                        "task": {"type": "ps", "index": 0.5}})"),
                {"task.index must be an integer"});
  ExpectInvalid(ClusterFromTfConfig(R"({"cluster": {"ps": ["p:1"], "worker": ["w:1"]},
                                        "task": {"type": 1, "index": 0}})"),
                {"task.type must be a string"});
  ExpectInvalid(ClusterFromTfConfig(R"({"cluster": {"ps": ["p:1"], "worker": ["w:1"]},
                                        "task": "ps"})"),
                {"\"task\" must be an object"});
  ExpectInvalid(ClusterFromTfConfig(R"({"cluster": {"ps": ["p:1"], "worker": ["w:1"]}})"),
                {"no task.type"});
  ExpectInvalid(ClusterFromJson("42", "ps", 0), {"got number"});
  ExpectInvalid(ClusterFromJson("{}", "ps", 0), {"lists no jobs"});
}

TEST(ClusterSpecTest, UnknownJobNames) {
  ExpectInvalid(ClusterFromTfConfig(R"({"cluster": {"ps": ["p:1"], "worker": ["w:1"],
                                                    "evaluater": ["e:1"]},
                                        "task": {"type": "ps", "index": 0}})"),
                {"unknown job 'evaluater' in TF_CONFIG"});
  ExpectInvalid(ClusterFromTfConfig(R"({"cluster": {"ps": ["p:1"], "worker": ["w:1"]},
                                        "task": {"type": "evaluater", "index": 0}})"),
                {"unknown job name 'evaluater'"});
  ExpectInvalid(ResolveCluster({"", kPsHosts, kWorkerHosts, "foo", 0}, ""), {"unknown job name 'foo'"});
  ExpectInvalid(ClusterFromFlags(kPsHosts, kWorkerHosts, "chief", 0), {"job 'chief' is not in the cluster"});
}

TEST(ClusterSpecTest, TaskIndexChecks) {
  // A worker past the spec's list joins a running job (the ps tasks' --max_workers decide whether it may); a ps
  // task past the list is an error.
  absl::StatusOr<ClusterConfig> joining = ClusterFromFlags(kPsHosts, kWorkerHosts, "worker", 3);
  ASSERT_TRUE(joining.ok()) << joining.status();
  EXPECT_TRUE(joining->joining);
  EXPECT_EQ(joining->num_workers(), 2);
  EXPECT_NE(joining->DebugString().find("joining: past the spec's 2 workers"), std::string::npos);
  EXPECT_FALSE(ClusterFromFlags(kPsHosts, kWorkerHosts, "worker", 1)->joining);
  ExpectInvalid(ClusterFromFlags(kPsHosts, kWorkerHosts, "ps", 2),
                {"task_index 2 out of range: job 'ps' has 2 tasks"});
  ExpectInvalid(ClusterFromFlags(kPsHosts, kWorkerHosts, "worker", -2), {"task_index -2 is negative"});
  ExpectInvalid(ClusterFromTfConfig(R"({"cluster": {"ps": ["p:1"], "worker": ["w:1"]},
                                        "task": {"type": "worker", "index": -1}})"),
                {"task_index -1 is negative"});
  ExpectInvalid(ClusterFromTfConfig(R"({"cluster": {"ps": ["p:1"], "worker": ["w:1"]},
                                        "task": {"type": "worker", "index": 99999999999}})"),
                {"task.index 99999999999 out of range"});
}

TEST(ClusterSpecTest, DuplicateAddresses) {
  ExpectInvalid(ClusterFromFlags("h:1,h:2", "h:3,h:1", "worker", 0),
                {"duplicate address 'h:1'", "job 'ps' task 0", "job 'worker' task 1"});
  ExpectInvalid(ClusterFromFlags("h:1", "h:3,h:3", "worker", 0),
                {"duplicate address 'h:3'", "job 'worker' task 0 and job 'worker' task 1"});
  ExpectInvalid(ClusterFromFlags("Host:1", "host:1", "worker", 0), {"duplicate address"});
  ExpectInvalid(ClusterFromTfConfig(R"({"cluster": {"chief": ["w:1"], "ps": ["p:1"], "worker": ["w:1"]},
                                        "task": {"type": "chief", "index": 0}})"),
                {"duplicate address 'w:1'"});
}

TEST(ClusterSpecTest, BadAddressesInClusters) {
  ExpectInvalid(ClusterFromFlags("127.0.0.1", "w:1", "worker", 0),
                {"job 'ps' task 0", "'127.0.0.1' has no port"});
  ExpectInvalid(ClusterFromFlags("p:0", "w:1", "worker", 0), {"'p:0' has port 0"});
  ExpectInvalid(ClusterFromFlags("p:70000", "w:1", "worker", 0), {"invalid port '70000'"});
  ExpectInvalid(ClusterFromTfConfig(R"({"cluster": {"ps": [":1"], "worker": ["w:1"]},
                                        "task": {"type": "worker", "index": 0}})"),
                {"TF_CONFIG", "empty host"});
  ExpectInvalid(ClusterFromFlags("p:1,,p:2", "w:1", "worker", 0),
                {"--ps_hosts='p:1,,p:2' has an empty entry at position 2"});
  ExpectInvalid(ClusterFromFlags("p:1,", "w:1", "worker", 0), {"empty entry at position 2"});
  // Whitespace around entries is tolerated.
  absl::StatusOr<ClusterConfig> c = ClusterFromFlags(" p:1 , p:2", "w:1 ", "worker", 0);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->ps, ElementsAre("p:1", "p:2"));
}

TEST(ClusterSpecTest, MissingJobs) {
  ExpectInvalid(ClusterFromFlags("", kWorkerHosts, "worker", 0), {"no ps tasks"});
  ExpectInvalid(ClusterFromFlags(kPsHosts, "", "ps", 0), {"no worker tasks"});
  ExpectInvalid(ClusterFromFlags(kPsHosts, "", "worker", 0), {"job 'worker' is not in the cluster"});
  ExpectInvalid(ClusterFromTfConfig(R"({"cluster": {"ps": [], "worker": ["w:1"]},
                                        "task": {"type": "worker", "index": 0}})"),
                {"job 'ps' in TF_CONFIG has an empty task list"});
  ExpectInvalid(ClusterFromTfConfig(R"({"cluster": {}, "task": {"type": "worker", "index": 0}})"),
                {"lists no jobs"});
  ExpectInvalid(ClusterFromJson(R"({"ps": ["p:1"], "worker": []})", "ps", 0), {"empty task list"});
}

TEST(ClusterSpecTest, MissingClusterSpecFile) {
  absl::StatusOr<ClusterConfig> c =
      ResolveCluster({"/nonexistent/cluster.json", "", "", "worker", 0}, "");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("/nonexistent/cluster.json"));
}

// Found by cluster_spec_fuzzer: an address holding a newline made a two-line message. Input is quoted with
// C escapes in every message.
TEST(ClusterSpecTest, HostileTextStaysOnOneLineInMessages) {
  absl::StatusOr<std::pair<std::string, int>> hp = SplitHostPort("[fe80::\n[fe80::1%eth0]:1%eth0]:8080");
  ASSERT_FALSE(hp.ok());
  EXPECT_EQ(hp.status().message(), "'[fe80::\\n[fe80::1%eth0]:1%eth0]:8080' has an invalid character '\\n' in its host");
  EXPECT_EQ(hp.status().message().find('\n'), absl::string_view::npos);
  for (const absl::StatusOr<ClusterConfig>& c :
       {ClusterFromJson("{\"ps\": [\"a:1\"], \"wor\\nker\": [\"b:2\"]}", "ps", 0),
        ClusterFromFlags("a:1", "b:\n2", "worker", 0), ClusterFromFlags("a:1", "b:2", "wor\nker", 0),
        ClusterFromTfConfig("{\"cluster\": {\"ps\": [\"a:1\"], \"worker\": [\"b:2\"]}}", "p\ns", 0)}) {
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.status().message().find('\n'), absl::string_view::npos) << c.status();
    EXPECT_NE(c.status().message().find("\\n"), absl::string_view::npos) << c.status();
  }
}

// Found by cluster_spec_fuzzer: a number beyond double's range made nlohmann throw out_of_range, which was not
// caught, and the process aborted.
TEST(ClusterSpecTest, HugeJsonNumberIsAnErrorNotACrash) {
  absl::StatusOr<ClusterConfig> c = ClusterFromTfConfig(
      "{\"cluster\": {\"ps\": [\"a:1\"], \"worker\": [\"b:2\"]}, \"task\": {\"type\": \"ps\", "
      "\"index\": 299E9999999}}");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.status().message(), "TF_CONFIG is not valid JSON: number overflow parsing '299E9999999'");
  c = ClusterFromJson("{\"ps\": [1e400]}", "ps", 0);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
}

// Found by feeding cluster_spec_fuzzer a deeply nested task.index: printing it for the message recursed once
// per level and overflowed the stack.
TEST(ClusterSpecTest, DeeplyNestedValueIsAnErrorNotAStackOverflow) {
  const int depth = 200000;
  const std::string tf_config =
      "{\"cluster\": {\"ps\": [\"a:1\"], \"worker\": [\"b:2\"]}, \"task\": {\"type\": \"ps\", \"index\": " +
      std::string(depth, '[') + std::string(depth, ']') + "}}";
  absl::StatusOr<ClusterConfig> c = ClusterFromTfConfig(tf_config);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "TF_CONFIG task.index must be an integer, got array");
  c = ClusterFromTfConfig(
      "{\"cluster\": {\"ps\": [\"a:1\"], \"worker\": [\"b:2\"]}, \"task\": {\"type\": \"ps\", \"index\": 1.5}}");
  EXPECT_EQ(c.status().message(), "TF_CONFIG task.index must be an integer, got 1.5");
}

}  // namespace
}  // namespace dtrain
