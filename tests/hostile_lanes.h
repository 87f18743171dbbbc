// The lane scenarios of dtrain_hostile_peer (tests/hostile_peer.h): what a peer sends on the ps's
// shared-memory and TCP data planes. Internal to the tool.
//
// Thread-safety: plain functions; each uses only its arguments.
#ifndef DTRAIN_TESTS_HOSTILE_LANES_H_
#define DTRAIN_TESTS_HOSTILE_LANES_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "ps/shm/shm_offer.h"
#include "ps/tcp/tcp_offer.h"
#include "tests/hostile_peer.h"

namespace dtrain::hostile {

// The abstract socket of ps task `task`'s shared-memory server in process `pid` (from /proc/net/unix; the
// server names it "dtrain-ps<task>-<pid>-<random>"). NotFound when there is none.
absl::StatusOr<std::string> FindShmSocket(int task, int pid);

// A stranger (no ticket) on the shm socket / the TCP lane port: connections that stay silent, send half a
// frame, a frame claiming an absurd length, a Hello with a made-up ticket, a segment before any Hello. Each
// must be closed by the ps within a few seconds (its hello timeout is 2 s) without an answer that lets it in.
void StrangerShmRound(const std::string& socket, Tally* tally);
void StrangerTcpRound(const std::string& host, int port, Tally* tally);

// A worker holding a session: each sub-attack on a fresh attachment from `offer` (which asks the ps for one):
// a Hello naming another worker, references past its segment and to segments never sent, row counts far past
// the ps's limits, pulls whose ids or rows lie outside. Every push and pull must be refused (or its lane
// closed); none may succeed.
void OwnShmRound(const std::function<absl::StatusOr<ps::shm::ShmOffer>()>& offer, uint64_t session,
                 int64_t max_push_rows, Tally* tally);
// The same on TCP lanes: frames whose counts (rows, ids, bulk bytes) are past the limits or absurd, claimed
// before any of their bytes is sent.
void OwnTcpRound(const std::function<absl::StatusOr<ps::tcp::TcpOffer>()>& offer, const std::string& host,
                 uint64_t session, int64_t max_push_rows, Tally* tally);

}  // namespace dtrain::hostile

#endif  // DTRAIN_TESTS_HOSTILE_LANES_H_
