// Remote clients: hosts that cannot map the pool reach it through the
// Transfer Engine of a process that maps it (mooncake_cxl.pool_te). The
// master gives them what a mapping would: where a key's value lies
// (kLocate, a seqlock snapshot the client validates its copy against by
// re-reading the entry), and the publishing CAS they cannot do over the
// engine (kPublish). Both name the attached client (Admit); a Locate is a
// read (lease, hit or miss), a Publish is the client's own CAS, done here
// only for a put still pending for that client.
//
// Atomics follow the three rules stated in master_impl.h.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "master_impl.h"
#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/pool/key_hash.h"
#include "mooncake_cxl/pool/publish.h"
#include "tier_manager.h"

namespace mcxl {

std::string MasterImpl::TeSession() const {
  if (config_.te_protocol.empty() || config_.te_session_file.empty()) return {};
  // Re-read at each remote attach: the serving process may have restarted
  // on another port. Short and bounded: a session is "host:port".
  int fd = open(config_.te_session_file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return {};
  char buf[256];
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return {};
  std::string s(buf, size_t(n));
  s.resize(std::min(s.find('\n'), s.size()));  // the first line; the writer's pid follows
  while (!s.empty() && s.back() == ' ') s.pop_back();
  for (char c : s)
    if (c < 0x21 || c > 0x7e) return {};  // not a session name
  return s;
}

bool DropDeadTeSession(const std::string& path) {
  if (path.empty()) return false;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  char buf[256];
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n < 0) return false;
  buf[n] = 0;
  // No second line (a writer of another format) or no number there: the
  // writer cannot be judged, so the file is left for it to replace.
  const char* nl = static_cast<const char*>(memchr(buf, '\n', size_t(n)));
  if (nl == nullptr) return false;
  char* end = nullptr;
  unsigned long long pid = strtoull(nl + 1, &end, 10);
  if (end == nl + 1 || pid == 0 || pid > uint64_t(INT32_MAX) || !LocalPidDead(pid)) return false;
  if (unlink(path.c_str()) != 0) return false;
  MCXL_LOG(kInfo, "master", "removed %s: its Transfer Engine process (pid %llu) is gone", path.c_str(), pid);
  return true;
}

void MasterImpl::FillRemoteReply(AttachReply* reply) const {
  reply->te_protocol = config_.te_protocol;
  reply->te_session = TeSession();
  reply->index_offset = pool_->geometry().index_offset;
  reply->index_capacity = index_->capacity();
  reply->tombs_word_offset = offsetof(Superblock, tier_tombs_durable);
  if (reply->te_session.empty())
    MCXL_LOG(kWarn, "master", "remote client attached but no Transfer Engine serves the pool (%s%s)",
             config_.te_protocol.empty() ? "--pool_te_protocol is off" : "no session in ",
             config_.te_protocol.empty() ? "" : config_.te_session_file.c_str());
}

LocateItem MasterImpl::LocateOne(const ClientRef& ref, const std::string& key, uint64_t lease_until_ns) {
  LocateItem item;
  if (key.empty() || key.size() > kMaxKeyLength) {
    item.status = ErrorCode::INVALID_PARAMS;
    return item;
  }
  uint64_t hash = KeyHash(key);
  std::vector<uint64_t> live;
  FindLive(key, hash, &live);
  EntrySnapshot best, s;
  bool found = false;
  for (uint64_t slot : live) {
    // Under mu_ no structural write is in progress; ReadEntry is the same
    // seqlock copy a reader takes, so its version is what the client compares.
    if (!index_->ReadEntry(slot, &s) || !Readable(s.state())) continue;
    if (!found || s.generation() > best.generation()) best = s, found = true;
  }
  ClientSlot* cs = pool_->client_slot(ref.slot);
  bool peek = lease_until_ns == kLocatePeek;
  bool count = lease_until_ns != kLocateToValidate && !peek;
  if (!found) {
    // Relaxed: a statistic; a remote client never writes its slot line.
    if (count) cs->get_misses.fetch_add(1, std::memory_order_relaxed);
    item.status = ErrorCode::OBJECT_NOT_FOUND;
    return item;
  }
  if (best.state() == EntryState::kOnDisk) {
    // The client cannot open the tier's files: stage it, it locates again.
    if (tier_) (void)tier_->Promote(PromoteRequest{ref, key, best.generation(), true});
    item.status = ErrorCode::REPLICA_IS_NOT_READY;
    return item;
  }
  if (best.state() == EntryState::kInSegment) {
    // In a client's DRAM segment: its pool extent is a stub, never a value
    // to copy. A remote reader does not read segments (a miss).
    if (count) cs->get_misses.fetch_add(1, std::memory_order_relaxed);
    item.status = ErrorCode::OBJECT_NOT_FOUND;
    return item;
  }
  uint64_t now = NowNs();
  uint64_t until = now + config_.default_kv_lease_ttl_ms * 1000000ull;
  uint64_t hold_cap = now + kMaxLeaseHoldNs;
  if (lease_until_ns > until) until = std::min(lease_until_ns, hold_cap);
  if (!peek) index_->ExtendLease(best.slot, until);
  if (count) cs->get_hits.fetch_add(1, std::memory_order_relaxed);  // relaxed: a statistic
  item.entry_offset = pool_->geometry().index_offset + best.slot * sizeof(IndexEntry);
  item.version = best.version;
  item.state_gen = best.state_gen;
  // From the master's own record of the key's length, not the pool's header.
  item.value_offset = index_->ValueOffset(best.object_offset, entry_meta_[best.slot].key_len);
  item.value_size = best.value_size;
  item.put_time_ns = best.put_time_ns;
  // The writer's host, from the slot table (the master's bound, a bounded string).
  if (best.owner_slot < clients_.size()) {
    const char* host = pool_->client_slot(best.owner_slot)->host;
    item.writer.assign(host, strnlen(host, sizeof(ClientSlot::host)));
  }
  return item;
}

std::string MasterImpl::HandleLocate(Decoder* d) {
  return FoldBatch<LocateRequest, LocateReply>(
      d, "Locate", "keys", [](const LocateRequest& r) { return r.keys.size(); },
      [&](const LocateRequest& req, LocateReply* reply) {
        reply->items.reserve(req.keys.size());
        for (const auto& k : req.keys) reply->items.push_back(LocateOne(req.client, k, req.lease_until_ns));
        PublishRange(&pool_->client_slot(req.client.slot)->get_hits, 2 * sizeof(uint64_t));
      });
}

std::string MasterImpl::HandlePublish(Decoder* d) {
  return FoldBatch<PublishRequest, PublishReply>(
      d, "Publish", "puts", [](const PublishRequest& r) { return r.items.size(); },
      [&](const PublishRequest& req, PublishReply* reply) {
        reply->results.reserve(req.items.size());
        for (const auto& [slot, gen] : req.items) {
          auto it = std::find_if(pending_.begin(), pending_.end(), [&](const PendingPut& p) {
            return p.entry_slot == slot && p.generation == gen && p.owner == req.client.slot;
          });
          // Not (or no longer) this client's unfinished put: revoked, or a
          // forged item. The CAS names the generation, so it cannot touch
          // another object either way.
          if (it == pending_.end() || !index_->PublishComplete(slot, gen)) {
            reply->results.push_back(ToInt(ErrorCode::TRANSFER_FAIL));
            continue;
          }
          reply->results.push_back(0);
          if (it->upsert) {
            // What HandleSettle does for a local client: the older values go now.
            std::string key(KeyOf(slot));
            uint64_t hash = index_->entry(slot).key_hash.load(std::memory_order_relaxed);
            if (!key.empty()) ClearSupersededIfSettled(key, hash);
            if (tier_ && !key.empty()) reply->tomb_ticket = std::max(reply->tomb_ticket, tier_->PendingTomb(key));
          }
        }
      });
}

}  // namespace mcxl
