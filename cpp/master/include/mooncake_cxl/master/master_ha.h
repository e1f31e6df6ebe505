// HaElector: one master instance's part in the election of the pool's
// master through etcd (--enable_ha). etcd decides who leads; the pool holds
// everything a new leader needs, so nothing else is kept in etcd.
//
// Contract:
//  * Campaign blocks until this instance holds the leader key
//    "mooncake-cxl/<cluster_id>/leader", created under a lease of `ttl_s`
//    seconds only if absent, and returns the etcd revision of that write:
//    the term, which only grows. While another instance holds the key it
//    polls every kPollMs; when the holder's record names a process of this
//    machine that is gone, it revokes the holder's lease (a dead leader
//    needs no TTL to pass).
//  * After Campaign, a thread keeps the lease alive every ttl/3 and
//    maintains lease_deadline(): the MonoNs() before which the lease is
//    surely valid (sent time of the last answered keep-alive + its TTL).
//    Past it, or when etcd says the lease is gone, the process exits with
//    kDeposedExitCode (one log line): a leader without its lease never
//    writes again. The master's fence (master_fence.h) checks the same
//    deadline before each structural write batch.
//  * Announce rewrites the key's value (the leader's RPC and metrics
//    addresses, JSON) once the master serves, only while the key is still
//    ours; clients look the leader up there.
//  * Resign (a clean stop) revokes the lease so that a standby takes over
//    at once.
#pragma once

#include <atomic>
#include <functional>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mooncake_cxl/common/error_code.h"
#include "mooncake_cxl/control/etcd_client.h"

namespace mcxl {

// Exit code of a master that lost its lease or found a newer term in the pool.
constexpr int kDeposedExitCode = 4;

struct HaOptions {
  std::vector<std::string> endpoints;  // etcd, "host:port"
  std::string cluster_id = "mooncake";
  int64_t ttl_s = 2;
  // The pool's master heartbeat word as this standby sees it (empty: no pool
  // mapped). A serving leader whose heartbeat stays unchanged for the TTL is
  // taken for stopped: its lease is revoked, without waiting for etcd to
  // expire it (etcd checks expiry every 500 ms). Safe because the fence, not
  // the lease, keeps a deposed leader from writing.
  std::function<uint64_t()> leader_heartbeat;
};

class HaElector {
 public:
  static constexpr int kPollMs = 20;
  explicit HaElector(HaOptions options);
  ~HaElector();

  static std::string LeaderKey(const std::string& cluster_id);
  // The leader record: JSON {"rpc", "metrics", "pid", "machine"}.
  static std::string LeaderRecord(const std::string& rpc, const std::string& metrics);

  // True with *term once elected; false when `stop` was set first.
  bool Campaign(const std::atomic<bool>& stop, int64_t* term);
  Status Announce(const std::string& rpc, const std::string& metrics);
  void Resign();

  const std::atomic<uint64_t>* lease_deadline() const { return &deadline_mono_ns_; }
  int64_t lease() const { return lease_; }

 private:
  void KeepAliveLoop();
  // The holder's record names a process of this machine that is gone.
  bool HolderDeadHere(const std::string& record) const;
  // The holder announced itself serving and its heartbeat in the pool has not
  // moved for the TTL, as timed by this process's clock (no clock is shared).
  bool HolderStalled(const std::string& record, int64_t lease);
  int64_t watched_lease_ = 0;
  uint64_t watched_heartbeat_ = 0, watched_since_ns_ = 0;

  HaOptions options_;
  std::string key_;
  std::unique_ptr<EtcdClient> etcd_;
  int64_t lease_ = 0;
  int64_t created_revision_ = 0;
  // Written by the keep-alive thread, read by every master thread at each
  // write batch. Relaxed: a single word compared against the local clock;
  // a stale (older) value only steps down earlier.
  std::atomic<uint64_t> deadline_mono_ns_{0};
  std::atomic<bool> stop_{false};
  std::thread keepalive_;
};

}  // namespace mcxl
