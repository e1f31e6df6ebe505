// The client's side of --enable_ha: the elected master's address from its
// record in etcd, and the term check that refuses a deposed master's replies.
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "mooncake_cxl/client/client.h"
#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/pool/publish.h"

namespace mcxl {

Status Client::FindLeader(uint64_t deadline_mono_ns, std::string* host, int* port) {
  bool logged = false;
  for (;;) {
    auto kv = etcd_->Get(leader_key_);
    if (kv && *kv) {
      auto j = nlohmann::json::parse((*kv)->value, nullptr, false);
      auto rpc = j.is_object() ? j.find("rpc") : j.end();
      // An empty address: elected, not serving yet.
      if (rpc != j.end() && rpc->is_string() && !rpc->get<std::string>().empty()) {
        if (SplitHostPort(rpc->get<std::string>(), host, port)) return ErrorCode::OK;
        if (!logged) MCXL_LOG(kWarn, "client", "the leader record in etcd names no host:port");
        logged = true;
      }
    }
    if (MonoNs() >= deadline_mono_ns) {
      MCXL_LOG(kWarn, "client", "no elected master serves %s in etcd (%s)", leader_key_.c_str(),
               kv ? "no leader record" : "etcd does not answer");
      return ErrorCode::RPC_FAIL;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

bool Client::TermSuperseded() const {
  uint64_t mine = term_.load(std::memory_order_relaxed);
  if (mine == 0) return false;
  const Superblock* sb = pool_->superblock();
  ObserveRange(&sb->master_term, sizeof(uint64_t));
  // Relaxed: a hint; the fence of master_fence.h is what stops a deposed master.
  return sb->master_term.load(std::memory_order_relaxed) != mine;
}

}  // namespace mcxl
