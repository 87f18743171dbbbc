// The command line of every dtrain binary: its Abseil flags parsed with errors a user can act on, and a
// --help that shows the binary's own flags in groups with their defaults.
//
// - An unknown flag names the closest ones ("unknown flag --lerning_rate; did you mean --learning_rate?") and
//   the binary exits 2 (kExitConfigRefused, common/exit_codes.h), as for a bad value ("--train_steps=abc:
//   ...").
// - --flagfile=FILE reads one flag a line ('#' starts a comment; blank lines are skipped; a flagfile may name
//   another), in place, so later flags override earlier ones as on the command line.
// - A flagfile shared by the processes of a cluster: flags that a peer binary takes and this one does not
//   (CommandLineSpec::peer_flags, e.g. dtrain_ps reading dtrain_worker's --mode) are ignored there, with one
//   note naming them; on the command line itself such a flag is refused, naming the binary that takes it.
// - --help (-h, --helpshort) prints the binary's own flags (those not defined by Abseil) grouped by what they
//   are about (FlagGroupOf: cluster, model, data, training, compute, checkpoints, output, security, other)
//   with their defaults and exits 0; --helpfull adds Abseil's own flags.
//
// Usage, in main() before anything else reads a flag:
//   dtrain::CommandLineSpec spec;
//   spec.program = "dtrain_ps";
//   spec.summary = "one parameter-server task of a cluster";
//   spec.peer_program = "dtrain_worker";
//   spec.peer_flags = dtrain::DtrainWorkerFlagNames();   // generated at build time (cmake/flag_names.cmake)
//   dtrain::ParsedCommandLine parsed = dtrain::ParseCommandLineOrExit(argc, argv, spec);
//
// Thread-safety: call once, from main(), before other threads read flags.
#ifndef DTRAIN_COMMON_COMMAND_LINE_H_
#define DTRAIN_COMMON_COMMAND_LINE_H_

#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {

struct CommandLineSpec {
  std::string program;  // "dtrain_worker": the name in messages and in --help
  std::string summary;  // one line under the name in --help
  // Lines printed after the flags in --help (exit codes, examples); may be empty.
  std::string epilogue;
  // Flags of a peer binary (sharing a --flagfile with this one) that this binary does not take.
  std::string peer_program;
  std::vector<std::string> peer_flags;
  // Takes positional arguments (none of dtrain's binaries does: one is refused with exit code 2).
  bool positional_args = false;
};

struct ParsedCommandLine {
  std::vector<std::string> positional;
  std::set<std::string> specified;      // flags given (on the command line or in a flagfile)
  std::vector<std::string> ignored;     // peer flags skipped in a flagfile, in order, without repeats
  std::string note;                     // one line about `ignored` (empty when none were)
  bool help = false, helpfull = false;  // --help / --helpfull was asked for
};

// Parses `args` (args[0] is the program) into the flags. InvalidArgument naming the flag, the value or the
// file that is wrong (an unknown flag with its closest matches). Flags are set as they are met: after an
// error some may have been set.
absl::StatusOr<ParsedCommandLine> ParseCommandLineArgs(const std::vector<std::string>& args,
                                                       const CommandLineSpec& spec);

// ParseCommandLineArgs over argv; on --help prints FormatHelp to stdout and exits 0; on an error prints
// "<program>: <message>" to stderr and exits 2; prints the note about ignored peer flags to stderr.
ParsedCommandLine ParseCommandLineOrExit(int argc, char** argv, const CommandLineSpec& spec);

// The help text: the summary, then every flag of the binary (with `all`, Abseil's own too) in its group, with
// its type, default and help.
std::string FormatHelp(const CommandLineSpec& spec, bool all = false);

// The group a flag is listed under, by a rule on its name (and the file that defines it), so that a flag
// added later lands in a sensible group without a list to update: "Cluster", "Model", "Data", "Training",
// "Optimizer and schedule", "Online and deltas", "Compute", "Checkpoints", "Output", "Security", or "Other".
std::string FlagGroupOf(absl::string_view name, absl::string_view file);

// Up to `max` flag names among `known` closest to `name` (edit distance, or one containing the other), best
// first; none when nothing is close.
std::vector<std::string> ClosestFlags(absl::string_view name, const std::vector<std::string>& known,
                                      int max = 3);

// The names of the binary's own flags (every flag not defined by Abseil itself), sorted.
std::vector<std::string> OwnFlagNames();

// The current values of the flags defined in files whose path ends with one of `files` (e.g.
// "worker/app/data_flags.cc"), and of the flags named in `names`, as "name=value" lines, sorted by name.
std::vector<std::string> FlagValues(const std::vector<std::string>& files,
                                    const std::vector<std::string>& names);

// Sets flags from "name=value" lines (as FlagValues wrote them, perhaps in another binary), skipping those in
// `keep` (e.g. the ones given on the command line) and those this binary does not have. InvalidArgument
// naming a line that is not name=value or whose value does not parse.
absl::Status SetFlagValues(const std::vector<std::string>& lines, const std::set<std::string>& keep);

// The flags of dtrain_worker (worker/app/main.cc, data_flags.cc, input_flags.cc, thread_flags.cc) and of
// dtrain_ps (ps/main.cc), each with the flags both define once (common/cluster_flags.cc, trace_flags.cc,
// metrics/metrics_flags.cc), listed at build time from their sources (cmake/flag_names.cmake): defined by the
// libraries dtrain_worker_flag_names and dtrain_ps_flag_names, for the binaries that share a --flagfile with them.
std::vector<std::string> DtrainWorkerFlagNames();
std::vector<std::string> DtrainPsFlagNames();

}  // namespace dtrain

#endif  // DTRAIN_COMMON_COMMAND_LINE_H_
