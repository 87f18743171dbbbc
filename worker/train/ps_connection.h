// The ps side of a worker's run (worker/train/trainer.cc): where the variables live, the config the chief registers,
// the in-process ps of local mode, this worker's client; connecting, connecting again after a rollback, and moving
// onto another set of ps tasks when the job's ps set changes (ps/core/ps_set_plan.h).
//
// Thread-safety: the training thread's; nothing here is shared.
#ifndef DTRAIN_WORKER_TRAIN_PS_CONNECTION_H_
#define DTRAIN_WORKER_TRAIN_PS_CONNECTION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ps/api/ps_interface.h"
#include "ps/client/placement.h"
#include "ps/client/push_journal.h"
#include "ps/client/worker_client.h"
#include "ps/core/parameter_server.h"
#include "worker/data/dataset.h"
#include "worker/towers/towers.h"
#include "worker/train/trainer.h"

namespace dtrain::worker {

// The ps side of a run: where the variables live, the config the chief registers, the in-process ps of local
// mode, and this worker's client.
struct Connection {
  ps::Placement placement;
  ps::TrainConfig config;
  std::unique_ptr<ps::ParameterServer> local_ps;
  std::vector<ps::PsInterface*> tasks;
  std::unique_ptr<ps::PushJournal> push_journal;  // before the client, which records into it
  std::unique_ptr<ps::WorkerClient> client;
  bool device_resident = false;  // the training state lives on the devices (local mode, GPU towers)
  // For a change of the job's ps tasks (MoveToPsSet): the variables placed, how, the tasks' addresses and the
  // version of the set they are (0: the spec's), and the clients made for tasks that joined.
  std::vector<ps::VariableInfo> variables;
  ps::PlacementOptions placement_options;
  std::vector<std::string> ps_hosts;
  int64_t ps_version = 0;
  std::vector<std::unique_ptr<ps::PsInterface>> joined_tasks;
};

// Places the model's variables on `tasks` (none: local mode, an in-process ps) and fills the config the chief
// registers; makes the client.
absl::Status SetUpConnection(const WorkerOptions& o, const std::vector<ps::PsInterface*>& tasks, Towers* towers,
                             Connection* c);
// Registers with the ps tasks; the chief's initial values (and the initial rows of tables from a file) initialize
// them (unless they restore a checkpoint).
absl::Status Connect(const WorkerOptions& o, Towers* towers, Connection* c);
// After connecting: the input resumes where a restored checkpoint (or this worker's newest commit) left it.
absl::Status ResumeInput(const WorkerOptions& o, Connection* c, data::BatchStream* stream);
// After a call failed with Aborted (`why`): connects again and resumes the input.
absl::Status ConnectAgain(const WorkerOptions& o, Connection* c, data::BatchStream* stream, const absl::Status& why);
// ps 0 announced a change of the job's ps tasks (`set`): moves onto them (see the definition).
absl::Status MoveToPsSet(const WorkerOptions& o, Connection* c, data::BatchStream* stream, const ps::PsSet& set);

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_TRAIN_PS_CONNECTION_H_
