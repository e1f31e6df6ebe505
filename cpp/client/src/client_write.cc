// Writes: puts (one PutStart round trip, copies straight into the granted
// extents, then a publishing CAS per entry that names its generation, so a
// revoked put can never be published) and removes (master calls).
//
// A value is copied in chunks of kPutChunkBytes; before each chunk the put
// must still be ours (entry WRITING with our generation, our client slot
// still of the generation the PutStart named), else the copy stops. So a
// writer stopped (SIGSTOP, a fault) while the master revoked its put and
// resumed later writes at most the rest of one chunk into the revoked
// extent; the master keeps that extent reserved while the writer may run
// (master_puts.cc), so even that chunk lands in space nobody else uses.
// The client never writes the object header (master-written, before the
// value) nor any index field but its generation-naming CAS.
//
// Atomics: as stated at the top of client.cc; the chunk check is below.
#include "mooncake_cxl/client/client.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/pool/key_hash.h"
#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/pool/publish.h"
#include "mooncake_cxl/control/doorbell.h"
#include "client_internal.h"
#include "mooncake_cxl/pool/pool_copy.h"

namespace mcxl {

bool Client::PutStillOurs(const PutStartItem& it, const ClientRef& owner) const {
  // Relaxed loads after ObserveRange: a stop hint, not a publish. A stale
  // WRITING seen here costs one more chunk, the bound stated above.
  const IndexEntry& e = index_->entry(it.entry_slot);
  // For writing: the publishing CAS needs the line exclusive, so fetch it so
  // once (the master just wrote it) rather than shared and then again.
  __builtin_prefetch(&e, 1, 3);
  ObserveRange(&e.state_gen, sizeof(uint64_t));
  if (e.state_gen.load(std::memory_order_relaxed) != PackStateGen(it.generation, EntryState::kWriting))
    return false;
  const ClientSlot* cs = pool_->client_slot(owner.slot);
  ObserveRange(&cs->generation, sizeof(uint64_t));
  return cs->generation.load(std::memory_order_relaxed) == owner.generation;
}

bool Client::CopyValueChecked(const ConstSlice* parts, size_t nparts, char* dst, const PutStartItem& it,
                              const ClientRef& owner) {
  uint64_t budget = 0;  // bytes left before the next check
  char* p = dst;
  uint64_t total = 0;
  for (size_t k = 0; k < nparts; ++k) total += parts[k].size;
  const bool stream = total >= kStreamToPoolMin;  // large values: every part streams (pool_copy.h)
  for (size_t k = 0; k < nparts; ++k) {
    const ConstSlice& s = parts[k];
    const char* src = static_cast<const char*>(s.data);
    for (uint64_t done = 0; done < s.size;) {
      if (budget == 0) {
        if (!PutStillOurs(it, owner)) return false;
        budget = kPutChunkBytes;
      }
      uint64_t n = std::min<uint64_t>(budget, s.size - done);
      if (stream) StreamToPool(p, src + done, n);
      else memcpy(p, src + done, n);
      PublishRangeUnless(SimMutation::kDropPublishWriteback, p, n);
      p += n;
      done += n;
      budget -= n;
    }
  }
  return true;
}

ErrorCode Client::PutOne(std::string_view user_key, const ConstSlice* parts, size_t nparts,
                         const PutOptions& options, bool upsert) {
  // Put for one key, without its per-key vectors (the common small put).
  std::string buf;  // the key as stored when scoped (tenant.h)
  std::string_view key;
  bool key_ok = ScopeKey(user_key, "put", tenant_prefix_.empty() ? nullptr : &buf, &key);
  std::shared_lock<std::shared_mutex> lock(life_mu_);
  if (closed_ || pool_->failed()) return ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
  if (!key_ok) return ErrorCode::INVALID_PARAMS;
  uint64_t size = 0;
  for (size_t k = 0; k < nparts; ++k) size += parts[k].size;
  if (size == 0) {
    MCXL_LOG(kWarn, "client", "put of '%.*s': empty value", int(key.size()), key.data());
    return ErrorCode::INVALID_PARAMS;
  }
  const auto& g = options.group_ids;
  std::string_view group = g.empty() ? std::string_view() : std::string_view(g[0]);
  // Refused for space: retried with backoff as in Put.
  uint64_t deadline = 0;
  for (int backoff_us = 500;; backoff_us = std::min(backoff_us * 2, 50000)) {
    bool no_room = false;
    ErrorCode rc = PutOnceOne(key, parts, nparts, size, group, options, upsert, &no_room);
    if (!no_room) return rc;
    if (deadline == 0) deadline = MonoNs() + uint64_t(options_.put_wait_ms) * 1000000ull;
    if (size >= pool_->geometry().data_size || MonoNs() >= deadline) return ErrorCode::NO_AVAILABLE_HANDLE;
    std::this_thread::sleep_for(std::chrono::microseconds(backoff_us));
  }
}

void Client::FillPutStartHead(const PutOptions& options, bool upsert, PutStartRequest* req) {
  req->put_id = next_put_id_.fetch_add(1, std::memory_order_relaxed);  // unique per client
  {
    std::lock_guard<std::mutex> lock(abandoned_mu_);
    req->abandoned = abandoned_puts_;
  }
  req->upsert = upsert;
  req->config.flags = options.flags;
  req->config.soft_pin_ttl_ms = options.soft_pin_ttl_ms;
  req->placement = uint8_t((segment_size_ != 0 ? kPlaceSegment : 0) | (options.same_node ? kPlaceSameNode : 0) |
                           (options.preferred_segment.empty() ? 0 : kPlaceNamed));
  if (req->placement & kPlaceNamed) req->preferred_segment = options.preferred_segment;
}

ErrorCode Client::PutStartCall(PutStartRequest* req, size_t n, const std::string_view* keys, const uint64_t* sizes,
                               const std::string_view* groups, const PutStartReply** reply) {
  // The request and reply buffers are per thread and reused: once they have
  // grown, a PutStart allocates nothing here.
  thread_local std::string req_buf, reply_buf;
  thread_local PutStartReply decoded;
  struct Args {  // captured by one pointer: the std::function stays inline (no allocation)
    Client* self;
    PutStartRequest* req;
    size_t n;
    const std::string_view *keys, *groups;
    const uint64_t* sizes;
  } args{this, req, n, keys, groups, sizes};
  auto build = [a = &args](std::string* out) {
    a->req->client = {a->self->slot_.load(std::memory_order_relaxed),
                      a->self->slot_generation_.load(std::memory_order_relaxed)};
    Encoder e;
    out->clear();
    std::swap(e.mutable_data(), *out);  // encode into the reused buffer
    EncodePutStartViews(*a->req, a->n, a->keys, a->sizes, a->groups, &e);
    std::swap(e.mutable_data(), *out);
  };
  Status r = MasterCallInto(MessageType::kPutStart, build, false, &req_buf, &reply_buf);
  ErrorCode whole = r.error();
  if (r.ok()) {
    Decoder d(reply_buf);
    whole = !Decode(&d, &decoded)              ? ErrorCode::RPC_FAIL
            : decoded.status != ErrorCode::OK    ? decoded.status
            : decoded.items.size() != n          ? ErrorCode::RPC_FAIL
                                                 : ErrorCode::OK;
  }
  NoteAbandoned(r.ok(), req->abandoned, req->put_id);
  *reply = &decoded;
  return whole;
}

ErrorCode Client::PutOnceOne(std::string_view key, const ConstSlice* parts, size_t nparts, uint64_t size,
                             std::string_view group, const PutOptions& options, bool upsert, bool* no_room) {
  // PutOnce for one key, without its per-key vectors.
  PutStartRequest req;  // keys/sizes/groups stay empty (PutStartCall encodes from views)
  FillPutStartHead(options, upsert, &req);
  const PutStartReply* reply = nullptr;
  ErrorCode whole = PutStartCall(&req, 1, &key, &size, &group, &reply);
  if (whole != ErrorCode::OK) return whole;
  const PutStartItem& it = reply->items[0];
  if (NonCoherent()) {
    std::vector<std::pair<uint64_t, uint64_t>> deferred;
    ErrorCode rc = FinishPutItem(key, parts, nparts, size, it, req.client, no_room, &deferred);
    if (rc != ErrorCode::OK || deferred.empty()) return rc;
    std::vector<ErrorCode> results;
    ErrorCode call = PublishByMaster(deferred, &results);
    return call != ErrorCode::OK ? call : results[0];
  }
  ErrorCode rc = FinishPutItem(key, parts, nparts, size, it, req.client, no_room);
  if (rc != ErrorCode::OK || !it.settle || it.status != ErrorCode::OK) return rc;
  // An older value of the key has a record on disk: tombstoned durably
  // before the put returns, as in PutOnce.
  Status st = Settle({{std::string(key), it.generation}});
  return st.ok() ? ErrorCode::OK : st.error();
}

void Client::NoteAbandoned(bool answered, const std::vector<uint64_t>& sent, uint64_t put_id) {
  if (answered && sent.empty()) return;  // the common case: nothing to note
  std::lock_guard<std::mutex> lock(abandoned_mu_);
  if (answered) {  // the master has them: stop resending
    for (uint64_t id : sent)
      abandoned_puts_.erase(std::remove(abandoned_puts_.begin(), abandoned_puts_.end(), id),
                            abandoned_puts_.end());
    return;
  }
  // No answer: the master may still process it later. Tell it with the
  // next PutStart that this one is abandoned.
  abandoned_puts_.push_back(put_id);
  if (abandoned_puts_.size() > 64) abandoned_puts_.erase(abandoned_puts_.begin());
}

ErrorCode Client::FinishPutItem(std::string_view key, const ConstSlice* parts, size_t nparts, uint64_t size,
                                const PutStartItem& it, const ClientRef& owner, bool* no_room,
                                std::vector<std::pair<uint64_t, uint64_t>>* deferred) {
  if (it.status == ErrorCode::OBJECT_ALREADY_EXISTS) return ErrorCode::OK;  // first value kept: success
  if (it.status == ErrorCode::OBJECT_REPLICA_BUSY) {  // no room yet; worth a retry
    *no_room = true;
    return it.status;
  }
  if (it.status != ErrorCode::OK) return it.status;
  const bool in_segment = it.segment_generation != 0;
  char* dst = in_segment ? SegmentTarget(it, size)
              : pool_->InDataRegion(it.value_offset, size) ? pool_->base() + it.value_offset
                                                            : nullptr;
  if (dst == nullptr || it.entry_slot >= index_->capacity()) {
    MCXL_LOG(kError, "client", "master gave an extent outside the data region or segment; put abandoned");
    // On a non-coherent pool the entry is the master's alone: it revokes
    // the put when its discard timeout passes.
    if (deferred == nullptr && it.entry_slot < index_->capacity()) (void)index_->Abort(it.entry_slot, it.generation);
    return ErrorCode::INTERNAL_ERROR;
  }
  if (!in_segment) {
    put_frontier_.store(it.value_offset + size, std::memory_order_relaxed);  // relaxed: a hint (client.h)
    // The extent's lines may be in this host's cache from an earlier object
    // (and its first line holds the master's header and key): dropped first,
    // so the write-backs below are based on the pool's bytes (a fence when
    // coherent). A segment is this host's DRAM: nothing to drop.
    ObserveRange(dst, size);
  }
  if (!CopyValueChecked(parts, nparts, dst, it, owner)) {
    MCXL_LOG(kWarn, "client", "put of '%.*s' was revoked by the master during its copy; stopped",
             int(key.size()), key.data());
    return ErrorCode::TRANSFER_FAIL;
  }
  if (pool_->failed()) return ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;  // the copy may have gone to replacement pages (see PoolFaultAction)
  if (deferred != nullptr) {  // the master publishes (client_noncoherent.cc); never a segment put (Attach refuses segments on a non-coherent pool)
    deferred->emplace_back(it.entry_slot, it.generation);
    return ErrorCode::OK;
  }
  if (!index_->PublishComplete(it.entry_slot, it.generation,
                               in_segment ? EntryState::kInSegment : EntryState::kComplete)) {
    MCXL_LOG(kWarn, "client", "put of '%.*s' was revoked by the master before it completed",
             int(key.size()), key.data());
    return ErrorCode::TRANSFER_FAIL;
  }
  return ErrorCode::OK;
}

std::vector<ErrorCode> Client::Put(const std::vector<std::string_view>& user_keys,
                                   const std::vector<PutParts>& values, const PutOptions& options,
                                   bool upsert) {
  if (values.size() != user_keys.size()) {
    MCXL_LOG(kWarn, "client", "put: %zu keys but %zu values", user_keys.size(), values.size());
    return std::vector<ErrorCode>(user_keys.size(), ErrorCode::INVALID_PARAMS);
  }
  std::vector<ConstSlice> parts;
  std::vector<size_t> first;
  first.reserve(values.size() + 1);
  for (const PutParts& v : values) {
    first.push_back(parts.size());
    parts.insert(parts.end(), v.begin(), v.end());
  }
  first.push_back(parts.size());
  return Put(user_keys, parts, first, options, upsert);
}

std::vector<ErrorCode> Client::Put(const std::vector<std::string_view>& user_keys,
                                   const std::vector<ConstSlice>& parts, const std::vector<size_t>& first,
                                   const PutOptions& options, bool upsert) {
  // The keys as stored (tenant.h); an invalid one stays empty and is refused below.
  std::vector<std::string> bufs(tenant_prefix_.empty() ? 0 : user_keys.size());
  std::vector<std::string_view> keys(user_keys.size());
  std::vector<bool> key_ok(user_keys.size());
  for (size_t i = 0; i < user_keys.size(); ++i)
    key_ok[i] = ScopeKey(user_keys[i], "put", bufs.empty() ? nullptr : &bufs[i], &keys[i]);
  std::shared_lock<std::shared_mutex> lock(life_mu_);
  std::vector<ErrorCode> out(keys.size(), ErrorCode::OK);
  if (closed_ || pool_->failed()) {
    out.assign(keys.size(), ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
    return out;
  }
  if (first.size() != keys.size() + 1 || first.back() > parts.size()) {
    MCXL_LOG(kWarn, "client", "put: %zu keys but %zu part offsets", keys.size(), first.size());
    out.assign(keys.size(), ErrorCode::INVALID_PARAMS);
    return out;
  }
  std::vector<size_t> todo;  // key indices still to place
  todo.reserve(keys.size());
  std::vector<uint64_t> sizes(keys.size(), 0);
  for (size_t i = 0; i < keys.size(); ++i) {
    for (size_t k = first[i]; k < first[i + 1]; ++k) sizes[i] += parts[k].size;
    if (!key_ok[i]) {
      out[i] = ErrorCode::INVALID_PARAMS;
      continue;
    }
    if (sizes[i] == 0) {
      MCXL_LOG(kWarn, "client", "put of '%.*s': empty value", int(keys[i].size()), keys[i].data());
      out[i] = ErrorCode::INVALID_PARAMS;
      continue;
    }
    todo.push_back(i);
  }
  // A full pool is usually a matter of moments (leases lapse, eviction
  // catches up): keys refused for space are retried with backoff for up to
  // put_wait_ms before NO_AVAILABLE_HANDLE is returned.
  uint64_t deadline = MonoNs() + uint64_t(options_.put_wait_ms) * 1000000ull;
  uint64_t data_size = pool_->geometry().data_size;
  for (int backoff_us = 500; !todo.empty(); backoff_us = std::min(backoff_us * 2, 50000)) {
    std::vector<size_t> no_room;
    // In requests of at most kMaxRequestKeys keys and about kMaxRequestBytes
    // (the master's per-request limits, rpc_protocol.h).
    const auto& g = options.group_ids;
    for (size_t begin = 0; begin < todo.size();) {
      size_t end = begin, bytes = 0;
      while (end < todo.size() && end - begin < kMaxRequestKeys) {
        size_t i = todo[end];
        size_t group = g.size() == keys.size() ? g[i].size() : g.empty() ? 0 : g[0].size();
        size_t item = 16 + keys[i].size() + group;
        if (end > begin && bytes + item > kMaxRequestBytes) break;
        bytes += item;
        ++end;
      }
      std::vector<size_t> part(todo.begin() + begin, todo.begin() + end);
      PutOnce(keys, parts, first, sizes, options, upsert, part, &out, &no_room);
      begin = end;
    }
    todo.clear();
    for (size_t i : no_room) {
      if (sizes[i] >= data_size || MonoNs() >= deadline) out[i] = ErrorCode::NO_AVAILABLE_HANDLE;
      else todo.push_back(i);
    }
    if (!todo.empty()) std::this_thread::sleep_for(std::chrono::microseconds(backoff_us));
  }
  return out;
}

void Client::PutOnce(const std::vector<std::string_view>& keys, const std::vector<ConstSlice>& parts,
                     const std::vector<size_t>& first, const std::vector<uint64_t>& sizes,
                     const PutOptions& options, bool upsert, const std::vector<size_t>& todo,
                     std::vector<ErrorCode>* out, std::vector<size_t>* no_room) {
  // Encoded from views (PutStartCall): the batch copies no key and, once
  // the per-thread buffers have grown, allocates only these three vectors.
  PutStartRequest req;  // keys/sizes/groups stay empty
  FillPutStartHead(options, upsert, &req);
  const auto& g = options.group_ids;
  std::vector<std::string_view> send_keys, send_groups;
  std::vector<uint64_t> send_sizes;
  send_keys.reserve(todo.size());
  send_groups.reserve(todo.size());
  send_sizes.reserve(todo.size());
  for (size_t i : todo) {
    send_keys.push_back(keys[i]);
    send_sizes.push_back(sizes[i]);
    send_groups.push_back(g.size() == keys.size() ? std::string_view(g[i])
                          : g.empty()               ? std::string_view()
                                                    : std::string_view(g[0]));
  }
  const PutStartReply* reply = nullptr;
  ErrorCode whole =
      PutStartCall(&req, todo.size(), send_keys.data(), send_sizes.data(), send_groups.data(), &reply);
  if (whole != ErrorCode::OK) {
    for (size_t i : todo) (*out)[i] = whole;
    return;
  }
  std::vector<std::pair<std::string, uint64_t>> settle;  // published puts the master asked to settle
  std::vector<size_t> settled;
  // A non-coherent pool: the master publishes the copied values (and
  // settles upserts), one kPublish for the batch.
  const bool by_master = NonCoherent();
  std::vector<std::pair<uint64_t, uint64_t>> deferred;
  std::vector<size_t> deferred_keys;
  for (size_t j = 0; j < todo.size(); ++j) {
    size_t i = todo[j];
    bool busy = false;
    const PutStartItem& it = reply->items[j];
    size_t before = deferred.size();
    ErrorCode rc = FinishPutItem(keys[i], parts.data() + first[i], first[i + 1] - first[i], sizes[i], it,
                                 req.client, &busy, by_master ? &deferred : nullptr);
    if (deferred.size() != before) deferred_keys.push_back(i);
    if (busy) no_room->push_back(i);
    else if (rc != ErrorCode::OK) (*out)[i] = rc;
    else if (it.settle && it.status == ErrorCode::OK) {
      settle.emplace_back(std::string(keys[i]), it.generation);
      settled.push_back(i);
    }
  }
  if (!deferred.empty()) {
    std::vector<ErrorCode> results;
    ErrorCode call = PublishByMaster(deferred, &results);
    for (size_t j = 0; j < deferred_keys.size(); ++j)
      (*out)[deferred_keys[j]] = call != ErrorCode::OK ? call : results[j];
    return;  // the master settled them
  }
  if (settle.empty()) return;
  // An older value of these keys has a record on disk: it is tombstoned
  // durably before the put returns (a --format rebuild would bring it back).
  Status s = Settle(settle);
  if (!s.ok())
    for (size_t i : settled) (*out)[i] = s.error();
}

Status Client::Settle(const std::vector<std::pair<std::string, uint64_t>>& items) {
  return MasterCallInChunks<SettleRequest, TicketReply>(
      MessageType::kSettle, items, kMaxRequestKeys, true,
      [&](size_t, size_t, const Status& st, const TicketReply& reply) {
        return st.ok() ? WaitTombstones(reply.tomb_ticket) : st;
      });
}

Status Client::WaitTombstones(uint64_t ticket) {
  if (ticket == 0) return ErrorCode::OK;
  const Superblock* sb = pool_->superblock();
  const uint64_t incarnation = incarnation_.load(std::memory_order_relaxed);
  const uint64_t start = MonoNs();
  for (uint64_t round = 0;; ++round) {
    ObserveRange(&sb->tier_tombs_durable, sizeof(uint64_t));
    // Acquire: pairs with the tier thread's release after its writes.
    if (sb->tier_tombs_durable.load(std::memory_order_acquire) >= ticket) return ErrorCode::OK;
    ObserveRange(&sb->master_incarnation, sizeof(uint64_t));
    if (sb->master_incarnation.load(std::memory_order_acquire) != incarnation) {
      MCXL_LOG(kWarn, "client", "master restarted before the tombstones of a remove/upsert were durable");
      return ErrorCode::RPC_FAIL;
    }
    uint64_t waited = MonoNs() - start;
    if (waited > kTombWaitNs) {
      MCXL_LOG(kWarn, "client", "tombstones of a remove/upsert not durable after %llu s (SSD tier stalled?)",
               (unsigned long long)(kTombWaitNs / 1000000000ull));
      return ErrorCode::RPC_TIMEOUT;
    }
    // A group commit takes a wake-up and one pwrite: yield first, then sleep
    // in steps of 20 us growing to 1 ms.
    if (round < 64) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(std::min<uint64_t>(1000, 20ull << std::min<uint64_t>(6, (round - 64) / 16))));
  }
}

ErrorCode Client::Remove(std::string_view key, bool force) {
  auto r = BatchRemove({key}, force);
  return ErrorCode(r[0]);
}

std::vector<int32_t> Client::BatchRemove(const std::vector<std::string_view>& keys, bool force) {
  std::string buf;
  std::string_view stored;
  std::shared_lock<std::shared_mutex> lock(life_mu_);
  if (closed_) return std::vector<int32_t>(keys.size(), ToInt(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS));
  FlushLeases();  // a non-coherent pool: our reads' leases land before the master judges them
  std::vector<int32_t> out(keys.size(), 0);
  RemoveRequest req;
  req.force = force;
  std::vector<size_t> sent;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!ScopeKey(keys[i], "remove", &buf, &stored)) {
      out[i] = ToInt(ErrorCode::INVALID_PARAMS);
      continue;
    }
    req.keys.emplace_back(stored);
    sent.push_back(i);
  }
  // In requests within the master's per-request limits (rpc_protocol.h).
  for (size_t begin = 0; begin < sent.size();) {
    size_t end = begin, bytes = 0;
    while (end < sent.size() && end - begin < kMaxRequestKeys &&
           (end == begin || bytes + 4 + req.keys[end].size() <= kMaxRequestBytes))
      bytes += 4 + req.keys[end++].size();
    RemoveRequest part;
    part.force = force;
    part.keys.assign(req.keys.begin() + begin, req.keys.begin() + end);
    auto r = MasterCall(MessageType::kBatchRemove, [&] {
      part.client = Ref();  // current after a re-attach
      Encoder e;
      Encode(part, &e);
      return e.data();
    }, true);
    RemoveReply reply;
    const std::string reply_bytes = r.ok() ? *r : std::string();
    Decoder d(reply_bytes);
    ErrorCode whole = !r.ok() ? r.error()
                      : !Decode(&d, &reply) || reply.results.size() != end - begin ? ErrorCode::RPC_FAIL
                                                                                    : reply.status;
    if (whole == ErrorCode::OK) {
      // Tombstones of disk-resident keys: durable before we return (0 = none).
      Status w = WaitTombstones(reply.tomb_ticket);
      if (!w.ok())
        for (int32_t& res : reply.results)
          if (res == 0) res = ToInt(w.error());
    }
    for (size_t j = begin; j < end; ++j)
      out[sent[j]] = whole != ErrorCode::OK ? ToInt(whole) : reply.results[j - begin];
    begin = end;
  }
  return out;
}

Result<uint64_t> Client::RemoveByRegex(const std::string& pattern, bool force) {
  return RemoveMatching(MessageType::kRemoveByRegex, pattern, force);
}

Result<uint64_t> Client::RemoveAll(bool force) { return RemoveMatching(MessageType::kRemoveAll, "", force); }

Result<uint64_t> Client::RemoveMatching(MessageType type, const std::string& pattern, bool force) {
  std::shared_lock<std::shared_mutex> lock(life_mu_);
  if (closed_) return ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
  FlushLeases();  // as in BatchRemove
  auto r = MasterCall(type, [&] {
    Encoder e;
    Encode(RemoveByRegexRequest{Ref(), pattern, force}, &e);
    return e.data();
  }, true);
  if (!r) return r.error();
  CountReply reply;
  Decoder d(*r);
  if (!Decode(&d, &reply)) return ErrorCode::RPC_FAIL;
  if (reply.status != ErrorCode::OK) return reply.status;
  Status w = WaitTombstones(reply.tomb_ticket);
  if (!w.ok()) return w.error();
  return reply.count;
}

}  // namespace mcxl
