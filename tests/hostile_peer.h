// dtrain_hostile_peer's scenarios (tests/hostile_peer_test.sh, issue 41's hostile-peer suite): a process of
// the ps's own user that speaks the ps's protocols (gRPC, the shared-memory lanes, the TCP lanes) and sends
// what a well-behaved worker never would. Each scenario is one round of calls; the tool repeats the rounds
// for as long as it is told and tallies every answer the ps gave.
//
// Two kinds of attacker:
//   - a stranger (no session): calls without or with a wrong token; with the token, registrations it cannot
//     claim, the honest workers' calls and offers with forged sessions, messages past gRPC's size limit,
//     lanes that never present a ticket. Run against a ps that trains honest workers: none of it may change
//     their run.
//   - a buggy or hostile worker (Options::own): it registers as the chief of a ps task started for it (its
//     own small config: a dense model and two sparse tables) and so holds a session and offers; then it sends
//     pushes and pulls with out-of-range references, huge counts and absurd frames over gRPC, shared memory
//     and TCP. None of its pushes is valid, so the task's values must stay exactly what it initialized
//     (checked at the end).
//
// An answer is a refusal (the ps said no, in one of the codes the scenario expects), an acceptance (the ps
// did what it must not: any other answer, OK included) or "gone" (the ps could not be reached: it is ending).
//
// Thread-safety: an Attacker is used by one thread.
#ifndef DTRAIN_TESTS_HOSTILE_PEER_H_
#define DTRAIN_TESTS_HOSTILE_PEER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ps/api/ps_types.h"

namespace dtrain::hostile {

struct Options {
  std::string ps_address;        // host:port of the ps task's gRPC service
  int ps_task = 0;               // its index (its shm socket is named after it)
  int ps_pid = 0;                // its process (0: the shm scenarios find no socket and say so)
  int num_workers = 1;           // the cluster spec's workers (the honest ids are 0 .. num_workers - 1)
  std::string token;             // the cluster's token (empty: the ps runs without one)
  int tcp_port = 0;              // the ps's TCP lane port (0: none)
  bool own = false;              // register as the chief worker 0 with the attacker's own config (see above)
  int64_t max_push_rows = 1000;  // the ps's --max_push_rows / --max_pull_rows (own mode crosses them by one)
  int64_t max_pull_rows = 1000;
};

// What one scenario sent and what the ps answered, over all its rounds.
struct Tally {
  std::string what;  // what it sends, for the report
  int64_t sent = 0;
  int64_t refused = 0, accepted = 0, gone = 0;
  std::map<std::string, int64_t> answers;       // "PERMISSION_DENIED", "closed by the ps", ... -> count
  std::string first_accepted;                   // the first answer that was an acceptance, and to what
  std::map<std::string, std::string> messages;  // answer -> the first message that came with it

  // One answer: `answer` names it; `refused` whether it is a refusal the scenario expects.
  void Count(const std::string& answer, bool refused, const std::string& to_what);
  void Gone(const std::string& answer);
  // "hostile NAME: sent=N refused=N accepted=N gone=N answers=A:n,B:n | what" (and the first acceptance),
  // then one indented line per answer with the first message that came with it.
  std::string Line(const std::string& name) const;
};

class Attacker {
 public:
  // Connects (lazily: the first call) to the ps. InvalidArgument for options that cannot work.
  static absl::StatusOr<std::unique_ptr<Attacker>> Create(const Options& options);
  ~Attacker();

  // The scenarios' names, in the order a round runs them: Stranger() without Options::own, Own() with it.
  static const std::vector<std::string>& StrangerScenarios();
  static const std::vector<std::string>& OwnScenarios();

  // Own mode: registers as chief and initializes the values. Must succeed before the own scenarios run.
  absl::Status Setup();
  // Runs one round of scenario `name` (one of the lists above), adding to `tally`.
  absl::Status Run(const std::string& name, Tally* tally);
  // Own mode, at the end: the values are still those Setup initialized, bit for bit (none of the hostile
  // pushes was applied); then reports this worker done so the ps task can end. FailedPrecondition naming the
  // first value that changed.
  absl::Status Finish();

  class Impl;

 private:
  explicit Attacker(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::hostile

#endif  // DTRAIN_TESTS_HOSTILE_PEER_H_
