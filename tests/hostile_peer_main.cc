// dtrain_hostile_peer: attacks a running ps task for a given time (tests/hostile_peer.h says what it sends)
// and prints one line per scenario: what it sent and what the ps answered. A test tool
// (tests/hostile_peer_test.sh).
//
//   dtrain_hostile_peer --ps_hosts=127.0.0.1:P --worker_hosts=A,B --auth_token_file=token --ps_pid=PID
//       --tcp_port=T --scenarios=all --secs=20 [--stop_file=F]
//   dtrain_hostile_peer ... --own --scenarios=all   (as the chief of a ps task started for it, 1 worker)
//
// Exit codes: 0 every answer was a refusal (or the ps was gone); 1 the ps accepted something it must refuse
// (the lines say what), or own mode found its values changed; 2 a bad flag.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "ps/rpc/grpc_security.h"
#include "tests/hostile_peer.h"

ABSL_FLAG(std::string, ps_hosts, "", "The cluster's ps tasks (host:port, comma-separated)");
ABSL_FLAG(std::string, worker_hosts, "", "The cluster's workers (their number is what matters)");
ABSL_FLAG(int, ps_task, 0, "Which ps task to attack");
ABSL_FLAG(int, ps_pid, 0,
          "Its process id (to find its shared-memory socket; 0: the shm scenario reports none)");
ABSL_FLAG(std::string, auth_token_file, "", "The cluster's token (the ps's --auth_token_file)");
ABSL_FLAG(int, tcp_port, 0, "The ps task's TCP lane port (its --tcp_port; 0: skip the TCP scenarios)");
ABSL_FLAG(std::string, scenarios, "all", "Comma-separated scenario names, or all");
ABSL_FLAG(double, secs, 10, "Repeat the rounds this long (at least one round)");
ABSL_FLAG(std::string, stop_file, "", "Stop early when this file exists");
ABSL_FLAG(bool, own, false,
          "Register as the chief worker 0 with the tool's own config (a ps task of its own)");
ABSL_FLAG(int64_t, max_push_rows, 1000, "The ps's --max_push_rows (own mode sends one row more)");
ABSL_FLAG(int64_t, max_pull_rows, 1000, "The ps's --max_pull_rows (own mode asks for one id more)");

namespace {

bool Exists(const std::string& path) { return !path.empty() && std::fopen(path.c_str(), "r") != nullptr; }

int Fail(const std::string& what) {
  std::fprintf(stderr, "dtrain_hostile_peer: %s\n", what.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using dtrain::hostile::Attacker;
  dtrain::hostile::Options o;
  const std::vector<std::string> ps = absl::StrSplit(absl::GetFlag(FLAGS_ps_hosts), ',', absl::SkipEmpty());
  const std::vector<std::string> workers =
      absl::StrSplit(absl::GetFlag(FLAGS_worker_hosts), ',', absl::SkipEmpty());
  o.ps_task = absl::GetFlag(FLAGS_ps_task);
  if (o.ps_task < 0 || o.ps_task >= static_cast<int>(ps.size())) {
    return Fail("--ps_task=" + std::to_string(o.ps_task) + " is not one of --ps_hosts' " +
                std::to_string(ps.size()) + " tasks");
  }
  o.ps_address = ps[o.ps_task];
  o.num_workers = static_cast<int>(workers.size());
  o.ps_pid = absl::GetFlag(FLAGS_ps_pid);
  o.tcp_port = absl::GetFlag(FLAGS_tcp_port);
  o.own = absl::GetFlag(FLAGS_own);
  o.max_push_rows = absl::GetFlag(FLAGS_max_push_rows);
  o.max_pull_rows = absl::GetFlag(FLAGS_max_pull_rows);
  if (!absl::GetFlag(FLAGS_auth_token_file).empty()) {
    absl::StatusOr<dtrain::ps::SecurityOptions> sec =
        dtrain::ps::LoadSecurityOptions(absl::GetFlag(FLAGS_auth_token_file), "", "", "", "");
    if (!sec.ok()) return Fail(std::string(sec.status().message()));
    o.token = sec->auth_token;
  }
  const std::vector<std::string>& known = o.own ? Attacker::OwnScenarios() : Attacker::StrangerScenarios();
  std::vector<std::string> names;
  if (absl::GetFlag(FLAGS_scenarios) == "all") {
    names = known;
    if (o.token.empty()) names.erase(std::find(names.begin(), names.end(), "wrong_token"));
    if (o.tcp_port <= 0) {
      for (const char* n : {"tcp_stranger", "tcp_bad_frames"}) {
        auto it = std::find(names.begin(), names.end(), n);
        if (it != names.end()) names.erase(it);
      }
    }
  } else {
    names = absl::StrSplit(absl::GetFlag(FLAGS_scenarios), ',', absl::SkipEmpty());
    for (const std::string& n : names) {
      if (std::find(known.begin(), known.end(), n) == known.end()) {
        return Fail("--scenarios: '" + n + "' is not a scenario of this mode" + (o.own ? " (--own)" : ""));
      }
    }
  }
  absl::StatusOr<std::unique_ptr<Attacker>> attacker = Attacker::Create(o);
  if (!attacker.ok()) return Fail(std::string(attacker.status().message()));
  if (o.own) {
    if (absl::Status s = (*attacker)->Setup(); !s.ok()) {
      std::fprintf(stderr, "dtrain_hostile_peer: could not register its own config: %s\n",
                   s.ToString().c_str());
      return 1;
    }
  }
  std::vector<dtrain::hostile::Tally> tallies(names.size());
  const absl::Time end = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_secs));
  // Rounds the ps answered (something refused or accepted); a round that sent something and got no answer
  // after one that did means the ps has ended: the attack stops.
  int rounds = 0;
  for (;;) {
    int64_t answered = 0, sent = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      const int64_t before = tallies[i].refused + tallies[i].accepted, sent_before = tallies[i].sent;
      if (absl::Status s = (*attacker)->Run(names[i], &tallies[i]); !s.ok()) {
        return Fail(names[i] + ": " + std::string(s.message()));
      }
      answered += tallies[i].refused + tallies[i].accepted - before;
      sent += tallies[i].sent - sent_before;
    }
    if (answered > 0) ++rounds;
    const bool ended = sent > 0 && answered == 0 && rounds > 0;
    if (ended || absl::Now() >= end || Exists(absl::GetFlag(FLAGS_stop_file))) break;
    if (sent == 0)
      absl::SleepFor(absl::Milliseconds(10));  // every scenario waits its turn: nothing to spin on
  }
  int64_t accepted = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    std::printf("%s\n", tallies[i].Line(names[i]).c_str());
    accepted += tallies[i].accepted;
  }
  std::printf("hostile rounds=%d accepted=%lld\n", rounds, static_cast<long long>(accepted));
  int rc = accepted == 0 ? 0 : 1;
  if (o.own) {
    const absl::Status s = (*attacker)->Finish();
    std::printf("hostile own values: %s\n",
                s.ok() ? "unchanged (bit for bit), reported done" : s.ToString().c_str());
    if (!s.ok()) rc = 1;
  }
  std::fflush(stdout);
  return rc;
}
