// The election (master_ha.h): campaign by create-if-absent under a lease,
// keep the lease alive, exit when it lapses.
#include "mooncake_cxl/master/master_ha.h"

#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "master_internal.h"
#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/common/log.h"

namespace mcxl {

HaElector::HaElector(HaOptions options)
    : options_(std::move(options)), key_(LeaderKey(options_.cluster_id)) {
  // A call must return well within the lease, so a keep-alive that hangs
  // cannot outlive it unnoticed.
  int timeout_ms = int(options_.ttl_s * 1000 / 4);
  etcd_ = std::make_unique<EtcdClient>(options_.endpoints, timeout_ms < 100 ? 100 : timeout_ms);
}

HaElector::~HaElector() {
  stop_.store(true, std::memory_order_relaxed);
  if (keepalive_.joinable()) keepalive_.join();
}

std::string HaElector::LeaderKey(const std::string& cluster_id) { return "mooncake-cxl/" + cluster_id + "/leader"; }

std::string HaElector::LeaderRecord(const std::string& rpc, const std::string& metrics) {
  return nlohmann::json{{"rpc", rpc}, {"metrics", metrics}, {"pid", uint64_t(getpid())}, {"machine", ThisMachine()}}
      .dump();
}

bool HaElector::HolderDeadHere(const std::string& record) const {
  auto j = nlohmann::json::parse(record, nullptr, false);
  if (!j.is_object()) return false;
  auto pid = j.find("pid");
  auto machine = j.find("machine");
  if (pid == j.end() || !pid->is_number_unsigned() || machine == j.end() || !machine->is_string()) return false;
  return machine->get<std::string>() == ThisMachine() && pid->get<uint64_t>() != uint64_t(getpid()) &&
         LocalPidDead(pid->get<uint64_t>());
}

bool HaElector::HolderStalled(const std::string& record, int64_t lease) {
  if (!options_.leader_heartbeat) return false;
  // Only a leader that serves ticks the heartbeat (every 100 ms at most); one
  // still recovering has announced nothing yet.
  auto j = nlohmann::json::parse(record, nullptr, false);
  auto rpc = j.is_object() ? j.find("rpc") : j.end();
  if (rpc == j.end() || !rpc->is_string() || rpc->get<std::string>().empty()) {
    watched_lease_ = 0;
    return false;
  }
  uint64_t hb = options_.leader_heartbeat(), now = MonoNs();
  if (lease != watched_lease_ || hb != watched_heartbeat_) {
    watched_lease_ = lease, watched_heartbeat_ = hb, watched_since_ns_ = now;
    return false;
  }
  return now - watched_since_ns_ >= uint64_t(options_.ttl_s) * 1000000000ull;
}

bool HaElector::Campaign(const std::atomic<bool>& stop, int64_t* term) {
  bool logged_wait = false, logged_etcd = false;
  std::string record = LeaderRecord("", "");
  while (!stop.load(std::memory_order_relaxed)) {
    if (lease_ == 0) {
      auto l = etcd_->LeaseGrant(options_.ttl_s);
      if (l) lease_ = *l;
    }
    uint64_t sent = MonoNs();
    Result<int64_t> won = lease_ != 0 ? etcd_->CreateIfAbsent(key_, record, lease_) : Result<int64_t>(ErrorCode::RPC_FAIL);
    if (won && *won > 0) {
      created_revision_ = *won;
      // Granted (or refreshed) no earlier than `sent`: valid for the TTL from then.
      deadline_mono_ns_.store(sent + uint64_t(options_.ttl_s) * 1000000000ull, std::memory_order_relaxed);
      auto ka = etcd_->LeaseKeepAlive(lease_);
      if (ka && *ka > 0) deadline_mono_ns_.store(sent + uint64_t(*ka) * 1000000000ull, std::memory_order_relaxed);
      *term = *won;
      MCXL_LOG(kInfo, "ha", "elected leader of cluster %s (term %lld, lease %llx, ttl %lld s)",
               options_.cluster_id.c_str(), (long long)*won, (unsigned long long)lease_, (long long)options_.ttl_s);
      keepalive_ = std::thread([this] { KeepAliveLoop(); });
      return true;
    }
    if (!won) {
      if (!logged_etcd) MCXL_LOG(kWarn, "ha", "etcd (%zu endpoints) does not answer; still campaigning",
                                 etcd_->endpoints().size());
      logged_etcd = true;
      lease_ = 0;  // it may have expired meanwhile: a fresh one next time
    } else {
      logged_etcd = false;
      auto holder = etcd_->Get(key_);
      if (holder && *holder && HolderDeadHere((*holder)->value) && (*holder)->lease != 0) {
        MCXL_LOG(kInfo, "ha", "the leader's process on this machine is gone: revoking its lease");
        (void)etcd_->LeaseRevoke((*holder)->lease);
        continue;
      }
      if (holder && *holder && (*holder)->lease != 0 && HolderStalled((*holder)->value, (*holder)->lease)) {
        MCXL_LOG(kWarn, "ha", "the leader's heartbeat in the pool stopped %lld s ago: revoking its lease",
                 (long long)options_.ttl_s);
        (void)etcd_->LeaseRevoke((*holder)->lease);
        continue;
      }
      if (!logged_wait) MCXL_LOG(kInfo, "ha", "standby: another master leads cluster %s", options_.cluster_id.c_str());
      logged_wait = true;
      // Our idle lease must not lapse meanwhile (it would cost a grant later).
      (void)etcd_->LeaseKeepAlive(lease_);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(kPollMs));
  }
  return false;
}

Status HaElector::Announce(const std::string& rpc, const std::string& metrics) {
  auto r = etcd_->ReplaceIfCreatedAt(key_, LeaderRecord(rpc, metrics), lease_, created_revision_);
  if (!r) return r.error();
  if (*r == 0) return ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;  // no longer ours
  return ErrorCode::OK;
}

void HaElector::Resign() {
  stop_.store(true, std::memory_order_relaxed);
  if (keepalive_.joinable()) keepalive_.join();
  if (lease_ != 0) (void)etcd_->LeaseRevoke(lease_);
}

void HaElector::KeepAliveLoop() {
  const uint64_t period_ns = uint64_t(options_.ttl_s) * 1000000000ull / 3;
  uint64_t next = MonoNs();
  while (!stop_.load(std::memory_order_relaxed)) {
    uint64_t now = MonoNs();
    if (now >= deadline_mono_ns_.load(std::memory_order_relaxed)) {
      MCXL_LOG(kError, "ha", "lease lapsed (etcd unreachable for its TTL): stepping down");
      _exit(kDeposedExitCode);
    }
    if (now >= next) {
      next = now + period_ns;
      auto ttl = etcd_->LeaseKeepAlive(lease_);
      if (ttl && *ttl <= 0) {
        MCXL_LOG(kError, "ha", "etcd says our lease is gone: stepping down");
        _exit(kDeposedExitCode);
      }
      if (ttl) deadline_mono_ns_.store(now + uint64_t(*ttl) * 1000000000ull, std::memory_order_relaxed);
      else next = now + period_ns / 4;  // etcd unreachable: retry sooner
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace mcxl
