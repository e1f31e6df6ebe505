// The client: attach, puts (one master round trip, then copies into the
// pool and a publishing CAS), one-sided reads, pins, the ring and TCP calls.
//
// Atomics: slot_/slot_generation_/incarnation_ are relaxed (see client.h);
// the pool's shared words are accessed through ObjectIndex (seqlock, CAS)
// and the helpers of publish.h; the remaining loads and stores of this
// client's own slot line (heartbeat, pin counters, hit counters) are relaxed
// statistics or hints, ordered where it matters by the seq_cst fence in
// PinValue (commented there).
#include "mooncake_cxl/client.h"

#include <immintrin.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>

#include "mooncake_cxl/clock.h"
#include "mooncake_cxl/key_hash.h"
#include "mooncake_cxl/log.h"
#include "mooncake_cxl/publish.h"
#include "mooncake_cxl/ring_server.h"

namespace mcxl {
namespace {

constexpr int kCopyRetries = 1000;

ErrorCode StatusOfReply(const std::string& reply) {
  Decoder d(reply);
  ErrorCode st = ErrorCode::RPC_FAIL;
  DecodeStatus(&d, &st);
  return st;
}

// Faults in the pages of caller memory ahead of the first copy into it.
// Best effort: older kernels lack MADV_POPULATE_WRITE and skip it.
void PrefaultForWrite(void* p, uint64_t n) {
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
  uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  uintptr_t start = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  uintptr_t end = reinterpret_cast<uintptr_t>(p) + n;
  (void)madvise(reinterpret_cast<void*>(start), end - start, MADV_POPULATE_WRITE);
}

uint64_t TotalSize(const MutSlice* s, size_t n) {
  uint64_t t = 0;
  for (size_t i = 0; i < n; ++i) t += s[i].size;
  return t;
}

}  // namespace

Client::Client(const ClientOptions& options) : options_(options) {}

Client::~Client() { (void)Close(); }

Result<std::shared_ptr<Client>> Client::Connect(const ClientOptions& options) {
  std::string host;
  int port = 0;
  if (!SplitHostPort(options.master_addr, &host, &port)) {
    MCXL_LOG(kError, "client", "master_server_addr '%s' is not host:port", options.master_addr.c_str());
    return ErrorCode::INVALID_PARAMS;
  }
  std::shared_ptr<Client> c(new Client(options));
  c->rpc_ = std::make_unique<RpcClient>(host, port, options.connect_timeout_ms, options.rpc_timeout_ms);
  Status s = c->Attach(true);
  if (!s.ok()) {
    if (c->slot_generation_.load(std::memory_order_relaxed) != 0) {
      // Attached but could not use the pool: give the slot back at once.
      Encoder e;
      Encode(ClientRef{c->slot_.load(std::memory_order_relaxed),
                       c->slot_generation_.load(std::memory_order_relaxed)}, &e);
      (void)c->rpc_->Call(MessageType::kDetach, e.data());
    }
    std::unique_lock<std::shared_mutex> lock(c->life_mu_);
    c->closed_ = true;
    return s.error();
  }
  c->hb_thread_ = std::thread([raw = c.get()] { raw->HeartbeatLoop(); });
  return c;
}

Status Client::Attach(bool initial) {
  std::lock_guard<std::mutex> lock(attach_mu_);
  AttachRequest req;
  req.local_hostname = options_.local_hostname;
  char machine[256] = {};
  gethostname(machine, sizeof(machine) - 1);
  req.machine = machine;
  machine_hash_ = KeyHash(req.machine);
  req.pid = uint64_t(getpid());
  req.prev_slot = slot_.load(std::memory_order_relaxed);
  req.prev_generation = slot_generation_.load(std::memory_order_relaxed);
  Encoder e;
  Encode(req, &e);
  auto r = rpc_->Call(MessageType::kAttach, e.data());
  if (!r) return r.error();
  Decoder d(*r);
  AttachReply reply;
  if (!Decode(&d, &reply)) return ErrorCode::RPC_FAIL;
  if (reply.status != ErrorCode::OK) {
    MCXL_LOG(kError, "client", "the master refused to attach %s: %s", options_.local_hostname.c_str(),
             ErrorCodeName(reply.status));
    return reply.status;
  }
  if (initial) {
    slot_.store(reply.slot, std::memory_order_relaxed);
    slot_generation_.store(reply.slot_generation, std::memory_order_relaxed);
    std::string path = options_.pool_path_override.empty() ? reply.pool_path : options_.pool_path_override;
    uint64_t size = options_.pool_size_override ? options_.pool_size_override : reply.pool_size;
    auto pool = Pool::Open(path, size, false);
    if (!pool) return pool.error();
    Status v = (*pool)->Verify(reply.uuid);
    if (!v.ok()) return v;
    pool_ = std::shared_ptr<Pool>(std::move(pool.value()));
    SetCoherenceMode(CoherenceMode(pool_->superblock()->coherence_mode));
    index_ = std::make_unique<ObjectIndex>(pool_.get());
    memcpy(uuid_, reply.uuid, 16);
  } else if (memcmp(uuid_, reply.uuid, 16) != 0) {
    MCXL_LOG(kError, "client", "the master now serves pool %s, not the mapped pool %s",
             UuidToString(reply.uuid).c_str(), UuidToString(uuid_).c_str());
    return ErrorCode::INVALID_PARAMS;
  }
  // Relaxed: ordered by attach_mu_ for writers; see the member comment.
  slot_.store(reply.slot, std::memory_order_relaxed);
  slot_generation_.store(reply.slot_generation, std::memory_order_relaxed);
  incarnation_.store(reply.incarnation, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> ring_lock(ring_mu_);
    uint32_t ring_bytes = pool_->superblock()->ring_bytes;
    ring_requests_ = ShmRing(pool_->ring(reply.slot, 0), ring_bytes);
    ring_replies_ = ShmRing(pool_->ring(reply.slot, 1), ring_bytes);
  }
  ClientSlot* cs = pool_->client_slot(reply.slot);
  cs->heartbeat_generation.store(reply.slot_generation, std::memory_order_relaxed);
  cs->heartbeat_ns.store(NowNs(), std::memory_order_relaxed);
  PublishRange(&cs->heartbeat_ns, kCacheLine);
  if (!initial)
    MCXL_LOG(kInfo, "client", "re-attached to the master (incarnation %llu) as slot %u",
             (unsigned long long)reply.incarnation, reply.slot);
  return ErrorCode::OK;
}

Result<std::string> Client::MasterCall(MessageType type, const std::function<std::string()>& build,
                                       bool idempotent) {
  uint64_t inc_before = incarnation_.load(std::memory_order_relaxed);
  auto r = CallOnce(type, build());
  if (r.ok() && StatusOfReply(*r) != ErrorCode::ILLEGAL_CLIENT) return r;
  if (!r.ok() && r.error() != ErrorCode::RPC_FAIL && r.error() != ErrorCode::RPC_TIMEOUT) return r;
  // The connection broke, or the master no longer knows our slot (restarted
  // or reclaimed us): re-attach, then retry once if it cannot duplicate work.
  bool lost_slot = r.ok();
  Status a = Attach(false);
  if (!a.ok()) return r.ok() ? ErrorCode::RPC_FAIL : r.error();
  bool restarted = incarnation_.load(std::memory_order_relaxed) != inc_before;
  if (!idempotent && !lost_slot && !restarted) return r.error();
  return CallOnce(type, build());
}

Result<std::string> Client::CallOnce(MessageType type, const std::string& payload) {
  if (options_.use_rings && type != MessageType::kAttach && type != MessageType::kDetach) {
    auto r = RingCall(type, payload);
    if (r.ok() || r.error() != ErrorCode::NOT_SUPPORTED) return r;
  }
  return rpc_->Call(type, payload);
}

Result<std::string> Client::RingCall(MessageType type, const std::string& payload) {
  std::lock_guard<std::mutex> lock(ring_mu_);
  if (!ring_requests_.valid()) return ErrorCode::NOT_SUPPORTED;
  uint64_t id = ring_next_id_++;
  std::string frame = MakeFrame(type, id, payload);
  if (frame.size() > ring_requests_.max_frame()) return ErrorCode::NOT_SUPPORTED;
  Superblock* sb = pool_->superblock();
  uint64_t incarnation = incarnation_.load(std::memory_order_relaxed);
  auto master_gone = [&] {
    // Restarted (a new incarnation), exited (its pid, when on this machine),
    // or silent for longer than any Tick gap.
    uint64_t hb = sb->master_heartbeat_ns.load(std::memory_order_relaxed);
    if (sb->master_incarnation.load(std::memory_order_acquire) != incarnation || NowNs() > hb + 3000000000ull)
      return true;
    pid_t pid = pid_t(sb->master_pid.load(std::memory_order_relaxed));
    return sb->master_machine_hash.load(std::memory_order_relaxed) == machine_hash_ && pid > 0 &&
           kill(pid, 0) != 0 && errno == ESRCH;
  };
  if (master_gone() || !ring_requests_.Push(frame)) return ErrorCode::RPC_FAIL;
  RingDoorbell(sb);
  uint64_t deadline = MonoNs() + uint64_t(options_.rpc_timeout_ms) * 1000000ull;
  std::string reply;
  for (;;) {
    uint64_t now = MonoNs();
    if (now >= deadline) return ErrorCode::RPC_TIMEOUT;
    // Spin ~30 µs (the master answers in a few), then sleep in short slices
    // so that a dead master is noticed.
    if (!ring_replies_.WaitForData(30000, std::min<uint64_t>(deadline - now, 200000000ull))) {
      if (master_gone()) return ErrorCode::RPC_FAIL;
      continue;
    }
    ShmRing::PopResult pr = ring_replies_.Pop(&reply);
    if (pr == ShmRing::PopResult::kCorrupt) {
      MCXL_LOG(kWarn, "client", "reply ring holds a torn or stale record; skipped");
      ring_replies_.SkipAll();
      continue;
    }
    if (pr != ShmRing::PopResult::kOk || reply.size() < sizeof(FrameHeader)) continue;
    FrameHeader h;
    memcpy(&h, reply.data(), sizeof(h));
    if (h.request_id != id) continue;  // a late reply to a request that timed out
    std::string body = reply.substr(sizeof(h));
    if (h.type == uint16_t(MessageType::kError)) {
      Decoder d(body);
      ErrorCode st = ErrorCode::RPC_FAIL;
      DecodeStatus(&d, &st);
      return st;
    }
    return body;
  }
}

void Client::HeartbeatLoop() {
  std::unique_lock<std::mutex> lock(hb_mu_);
  while (!hb_stop_) {
    uint32_t slot = slot_.load(std::memory_order_relaxed);
    uint64_t gen = slot_generation_.load(std::memory_order_relaxed);
    ClientSlot* cs = pool_->client_slot(slot);
    // Relaxed + publish: the master compares it with its clock, nothing more.
    cs->heartbeat_generation.store(gen, std::memory_order_relaxed);
    cs->heartbeat_ns.store(NowNs(), std::memory_order_relaxed);
    PublishRange(&cs->heartbeat_ns, kCacheLine);
    // Acquire: pairs with the master's release store when it assigns or
    // reclaims the slot.
    bool lost = cs->generation.load(std::memory_order_acquire) != gen;
    lock.unlock();
    if (lost) {
      // The master restarted or reclaimed us: take a slot again so that the
      // master can see us alive (readers never talk to it otherwise).
      (void)Attach(false);
    }
    lock.lock();
    hb_cv_.wait_for(lock, std::chrono::milliseconds(options_.heartbeat_interval_ms),
                    [this] { return hb_stop_; });
  }
}

Status Client::Close() {
  std::unique_lock<std::shared_mutex> lock(life_mu_);
  if (closed_) return ErrorCode::OK;
  closed_ = true;
  {
    std::lock_guard<std::mutex> hb(hb_mu_);
    hb_stop_ = true;
  }
  hb_cv_.notify_all();
  if (hb_thread_.joinable()) hb_thread_.join();
  ClientRef ref{slot_.load(std::memory_order_relaxed), slot_generation_.load(std::memory_order_relaxed)};
  Encoder e;
  Encode(ref, &e);
  (void)rpc_->Call(MessageType::kDetach, e.data());
  rpc_->Disconnect();
  return ErrorCode::OK;
}

bool Client::closed() const {
  std::shared_lock<std::shared_mutex> lock(life_mu_);
  return closed_;
}

int Client::HealthCheck() {
  std::shared_lock<std::shared_mutex> lock(life_mu_);
  if (closed_) return 1;
  auto r = CallOnce(MessageType::kPing, "");
  return r.ok() ? 0 : 2;
}

bool Client::ValidKey(std::string_view key, const char* op) const {
  if (key.empty()) {
    MCXL_LOG(kWarn, "client", "%s: empty key", op);
    return false;
  }
  if (key.size() > kMaxKeyLength) {
    MCXL_LOG(kWarn, "client", "%s: key of %zu bytes is longer than the limit of %u", op, key.size(),
             kMaxKeyLength);
    return false;
  }
  return true;
}

uint64_t Client::LeaseTtlNs() const {
  // Relaxed: the master sets it at start; any recent value is fine.
  return pool_->superblock()->lease_ttl_ns.load(std::memory_order_relaxed);
}

std::vector<ErrorCode> Client::Put(const std::vector<std::string_view>& keys,
                                   const std::vector<PutParts>& values, const PutOptions& options,
                                   bool upsert) {
  std::shared_lock<std::shared_mutex> lock(life_mu_);
  std::vector<ErrorCode> out(keys.size(), ErrorCode::OK);
  if (closed_) {
    out.assign(keys.size(), ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
    return out;
  }
  if (values.size() != keys.size()) {
    MCXL_LOG(kWarn, "client", "put: %zu keys but %zu values", keys.size(), values.size());
    out.assign(keys.size(), ErrorCode::INVALID_PARAMS);
    return out;
  }
  std::vector<size_t> todo;  // key indices still to place
  std::vector<uint64_t> sizes(keys.size(), 0);
  for (size_t i = 0; i < keys.size(); ++i) {
    for (const ConstSlice& s : values[i]) sizes[i] += s.size;
    if (!ValidKey(keys[i], "put")) {
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
  uint64_t data_size = pool_->superblock()->data_size;
  for (int backoff_us = 500; !todo.empty(); backoff_us = std::min(backoff_us * 2, 50000)) {
    std::vector<size_t> no_room;
    PutOnce(keys, values, sizes, options, upsert, todo, &out, &no_room);
    todo.clear();
    for (size_t i : no_room) {
      if (sizes[i] >= data_size || MonoNs() >= deadline) out[i] = ErrorCode::NO_AVAILABLE_HANDLE;
      else todo.push_back(i);
    }
    if (!todo.empty()) std::this_thread::sleep_for(std::chrono::microseconds(backoff_us));
  }
  return out;
}

void Client::PutOnce(const std::vector<std::string_view>& keys, const std::vector<PutParts>& values,
                     const std::vector<uint64_t>& sizes, const PutOptions& options, bool upsert,
                     const std::vector<size_t>& todo, std::vector<ErrorCode>* out,
                     std::vector<size_t>* no_room) {
  PutStartRequest req;
  req.put_id = next_put_id_.fetch_add(1, std::memory_order_relaxed);  // unique per client
  {
    std::lock_guard<std::mutex> lock(abandoned_mu_);
    req.abandoned = abandoned_puts_;
  }
  req.upsert = upsert;
  req.config.flags = options.flags;
  req.config.soft_pin_ttl_ms = options.soft_pin_ttl_ms;
  const auto& g = options.group_ids;
  for (size_t i : todo) {
    req.keys.emplace_back(keys[i]);
    req.sizes.push_back(sizes[i]);
    req.groups.push_back(g.size() == keys.size() ? g[i] : g.empty() ? std::string() : g[0]);
  }
  auto build = [&] {
    req.client = {slot_.load(std::memory_order_relaxed), slot_generation_.load(std::memory_order_relaxed)};
    Encoder e;
    Encode(req, &e);
    return e.data();
  };
  auto r = MasterCall(MessageType::kPutStart, build, false);
  PutStartReply reply;
  const std::string reply_bytes = r.ok() ? *r : std::string();
  Decoder d(reply_bytes);
  ErrorCode whole = !r.ok() ? r.error()
                    : !Decode(&d, &reply) ? ErrorCode::RPC_FAIL
                    : reply.status != ErrorCode::OK ? reply.status
                    : reply.items.size() != todo.size() ? ErrorCode::RPC_FAIL
                                                        : ErrorCode::OK;
  {
    std::lock_guard<std::mutex> lock(abandoned_mu_);
    if (r.ok() && !req.abandoned.empty()) {  // the master has them: stop resending
      for (uint64_t id : req.abandoned)
        abandoned_puts_.erase(std::remove(abandoned_puts_.begin(), abandoned_puts_.end(), id),
                              abandoned_puts_.end());
    }
    if (!r.ok()) {
      // No answer: the master may still process it later. Tell it with the
      // next PutStart that this one is abandoned.
      abandoned_puts_.push_back(req.put_id);
      if (abandoned_puts_.size() > 64) abandoned_puts_.erase(abandoned_puts_.begin());
    }
  }
  if (whole != ErrorCode::OK) {
    for (size_t i : todo) (*out)[i] = whole;
    return;
  }
  for (size_t j = 0; j < todo.size(); ++j) {
    size_t i = todo[j];
    const PutStartItem& it = reply.items[j];
    if (it.status == ErrorCode::OBJECT_ALREADY_EXISTS) continue;  // first value kept: success
    if (it.status == ErrorCode::OBJECT_REPLICA_BUSY) {  // no room yet; worth a retry
      no_room->push_back(i);
      continue;
    }
    if (it.status != ErrorCode::OK) {
      (*out)[i] = it.status;
      continue;
    }
    if (!pool_->InDataRegion(it.value_offset, sizes[i])) {
      MCXL_LOG(kError, "client", "master gave an extent outside the data region; put abandoned");
      (void)index_->Abort(it.entry_slot, it.generation);
      (*out)[i] = ErrorCode::INTERNAL_ERROR;
      continue;
    }
    char* dst = pool_->base() + it.value_offset;
    char* p = dst;
    for (const ConstSlice& s : values[i]) {
      memcpy(p, s.data, s.size);
      p += s.size;
    }
    PublishRange(dst, sizes[i]);
    if (!index_->PublishComplete(it.entry_slot, it.generation)) {
      MCXL_LOG(kWarn, "client", "put of '%.*s' was revoked by the master before it completed",
               int(keys[i].size()), keys[i].data());
      (*out)[i] = ErrorCode::TRANSFER_FAIL;
    }
  }
}

Result<EntrySnapshot> Client::Locate(std::string_view key) {
  std::shared_lock<std::shared_mutex> lock(life_mu_);
  if (closed_) return ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
  if (!ValidKey(key, "get")) return ErrorCode::INVALID_PARAMS;
  return index_->FindComplete(key, KeyHash(key));
}

Result<bool> Client::CopyValidated(const EntrySnapshot& snap, std::string_view key, const MutSlice* dsts,
                                   size_t ndsts) {
  std::shared_lock<std::shared_mutex> lock(life_mu_);
  if (closed_) return ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
  if (TotalSize(dsts, ndsts) < snap.value_size) return ErrorCode::INVALID_PARAMS;
  const char* src = index_->ValuePtr(snap, key);
  if (src == nullptr) return false;  // geometry of a stale snapshot: retry
  ObserveRange(src, snap.value_size);
  uint64_t left = snap.value_size;
  for (size_t i = 0; i < ndsts && left > 0; ++i) {
    uint64_t n = dsts[i].size < left ? dsts[i].size : left;
    memcpy(dsts[i].data, src, n);
    src += n;
    left -= n;
  }
  if (!index_->StillValid(snap)) return false;
  index_->ExtendLease(snap.slot, NowNs() + LeaseTtlNs());
  return true;
}

void Client::RecordRead(bool hit) {
  ClientSlot* cs = pool_->client_slot(slot_.load(std::memory_order_relaxed));
  // Relaxed: a statistic; only this client writes the line.
  auto& counter = hit ? cs->get_hits : cs->get_misses;
  counter.fetch_add(1, std::memory_order_relaxed);
  PublishRange(&counter, sizeof(uint64_t));
}

Result<uint64_t> Client::GetInto(std::string_view key, const MutSlice* dsts, size_t ndsts) {
  for (int attempt = 0; attempt < kCopyRetries; ++attempt) {
    auto snap = Locate(key);
    if (snap.error() == ErrorCode::OBJECT_NOT_FOUND) RecordRead(false);
    if (!snap) return snap.error();
    if (TotalSize(dsts, ndsts) < snap->value_size) {
      MCXL_LOG(kWarn, "client", "get of '%.*s': buffer of %llu bytes is smaller than the value (%llu)",
               int(key.size()), key.data(), (unsigned long long)TotalSize(dsts, ndsts),
               (unsigned long long)snap->value_size);
      return ErrorCode::INVALID_PARAMS;
    }
    auto ok = CopyValidated(*snap, key, dsts, ndsts);
    if (!ok) return ok.error();
    if (*ok) {
      RecordRead(true);
      return snap->value_size;
    }
    _mm_pause();
  }
  return ErrorCode::OBJECT_NOT_FOUND;  // rewritten on every attempt: treat as gone
}

int Client::IsExist(std::string_view key) {
  auto snap = Locate(key);
  if (snap.ok()) {
    index_->ExtendLease(snap->slot, NowNs() + LeaseTtlNs());
    return 1;
  }
  return snap.error() == ErrorCode::OBJECT_NOT_FOUND ? 0 : ToInt(snap.error());
}

Result<uint64_t> Client::GetSize(std::string_view key) {
  auto snap = Locate(key);
  if (!snap) return snap.error();
  index_->ExtendLease(snap->slot, NowNs() + LeaseTtlNs());  // as the reference does
  return snap->value_size;
}

ErrorCode Client::Remove(std::string_view key, bool force) {
  auto r = BatchRemove({key}, force);
  return ErrorCode(r[0]);
}

std::vector<int32_t> Client::BatchRemove(const std::vector<std::string_view>& keys, bool force) {
  std::shared_lock<std::shared_mutex> lock(life_mu_);
  if (closed_) return std::vector<int32_t>(keys.size(), ToInt(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS));
  std::vector<int32_t> out(keys.size(), 0);
  RemoveRequest req;
  req.force = force;
  std::vector<size_t> sent;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!ValidKey(keys[i], "remove")) {
      out[i] = ToInt(ErrorCode::INVALID_PARAMS);
      continue;
    }
    req.keys.emplace_back(keys[i]);
    sent.push_back(i);
  }
  if (sent.empty()) return out;
  Encoder e;
  Encode(req, &e);
  auto r = MasterCall(MessageType::kBatchRemove, [&] { return e.data(); }, true);
  RemoveReply reply;
  const std::string reply_bytes = r.ok() ? *r : std::string();
  Decoder d(reply_bytes);
  ErrorCode whole = !r.ok() ? r.error()
                    : !Decode(&d, &reply) || reply.results.size() != sent.size() ? ErrorCode::RPC_FAIL
                                                                                  : reply.status;
  for (size_t j = 0; j < sent.size(); ++j)
    out[sent[j]] = whole != ErrorCode::OK ? ToInt(whole) : reply.results[j];
  return out;
}

Result<uint64_t> Client::RemoveByRegex(const std::string& pattern, bool force) {
  std::shared_lock<std::shared_mutex> lock(life_mu_);
  if (closed_) return ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
  Encoder e;
  Encode(RemoveByRegexRequest{pattern, force}, &e);
  auto r = MasterCall(MessageType::kRemoveByRegex, [&] { return e.data(); }, true);
  if (!r) return r.error();
  CountReply reply;
  Decoder d(*r);
  if (!Decode(&d, &reply)) return ErrorCode::RPC_FAIL;
  if (reply.status != ErrorCode::OK) return reply.status;
  return reply.count;
}

Result<uint64_t> Client::RemoveAll(bool force) {
  std::shared_lock<std::shared_mutex> lock(life_mu_);
  if (closed_) return ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
  Encoder e;
  Encode(RemoveByRegexRequest{"", force}, &e);
  auto r = MasterCall(MessageType::kRemoveAll, [&] { return e.data(); }, true);
  if (!r) return r.error();
  CountReply reply;
  Decoder d(*r);
  if (!Decode(&d, &reply)) return ErrorCode::RPC_FAIL;
  if (reply.status != ErrorCode::OK) return reply.status;
  return reply.count;
}

}  // namespace mcxl

namespace mcxl {

std::vector<int64_t> Client::GetRanges(std::string_view key, const std::vector<RangeCopy>& ranges) {
  std::vector<int64_t> out(ranges.size(), 0);
  for (int attempt = 0; attempt < kCopyRetries; ++attempt) {
    auto snap = Locate(key);
    if (!snap) {
      if (snap.error() == ErrorCode::OBJECT_NOT_FOUND) RecordRead(false);
      out.assign(ranges.size(), ToInt(snap.error()));
      return out;
    }
    std::shared_lock<std::shared_mutex> lock(life_mu_);
    if (closed_) break;
    const char* src = index_->ValuePtr(*snap, key);
    if (src == nullptr) continue;
    ObserveRange(src, snap->value_size);
    for (size_t i = 0; i < ranges.size(); ++i) {
      const RangeCopy& r = ranges[i];
      if (r.src_offset > snap->value_size || r.size > snap->value_size - r.src_offset) {
        out[i] = ToInt(ErrorCode::INVALID_PARAMS);
        continue;
      }
      memcpy(r.dst, src + r.src_offset, r.size);
      out[i] = int64_t(r.size);
    }
    if (index_->StillValid(*snap)) {
      index_->ExtendLease(snap->slot, NowNs() + LeaseTtlNs());
      RecordRead(true);
      return out;
    }
  }
  out.assign(ranges.size(), ToInt(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS));
  return out;
}

Result<PinnedView> Client::PinValue(std::string_view key) {
  for (int attempt = 0; attempt < kCopyRetries; ++attempt) {
    auto snap = Locate(key);
    if (snap.error() == ErrorCode::OBJECT_NOT_FOUND) RecordRead(false);
    if (!snap) return snap.error();
    std::shared_lock<std::shared_mutex> lock(life_mu_);
    if (closed_) return ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
    const char* data = index_->ValuePtr(*snap, key);
    if (data == nullptr) continue;
    PinnedView v;
    {
      std::lock_guard<std::mutex> attach(attach_mu_);
      std::lock_guard<std::mutex> pins(pin_mu_);
      v.slot = slot_.load(std::memory_order_relaxed);
      v.slot_generation = slot_generation_.load(std::memory_order_relaxed);
      if (pin_slot_generation_ != v.slot_generation) {  // re-attached: a fresh table
        free_pins_.clear();
        pin_high_water_ = 0;
        pins_in_use_ = 0;
        pin_slot_generation_ = v.slot_generation;
      }
      uint32_t per = pool_->superblock()->pins_per_client;
      if (free_pins_.empty() && pin_high_water_ >= per) {
        MCXL_LOG(kWarn, "client", "get_buffer of '%.*s': all %u pin records of this client are in use; "
                 "drop some BufferHandles", int(key.size()), key.data(), per);
        return ErrorCode::NO_AVAILABLE_HANDLE;
      }
      if (!free_pins_.empty()) {
        v.record = free_pins_.back();
        free_pins_.pop_back();
      } else {
        v.record = pin_high_water_++;
      }
      ClientSlot* cs = pool_->client_slot(v.slot);
      PinRecord& rec = pool_->pin_table(v.slot)[v.record];
      // Relaxed stores: the seq_cst fence below orders them before the
      // re-check, and the master reads them after its own seq_cst fence.
      cs->pins_in_use.store(++pins_in_use_, std::memory_order_relaxed);
      cs->pin_high_water.store(pin_high_water_, std::memory_order_relaxed);
      rec.generation.store(snap->generation(), std::memory_order_relaxed);
      rec.entry_plus1.store(snap->slot + 1, std::memory_order_relaxed);
      PublishRange(&cs->pins_in_use, 2 * sizeof(uint64_t));
      PublishRange(&rec, sizeof(rec));
    }
    // seq_cst: pin stores before the version re-check (the Dekker pair with
    // the master's tombstone-then-scan; see Master::IsPinned).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (index_->StillValid(*snap)) {
      index_->ExtendLease(snap->slot, NowNs() + LeaseTtlNs());
      v.data = data;
      v.size = snap->value_size;
      RecordRead(true);
      return v;
    }
    lock.unlock();
    Unpin(v);
  }
  return ErrorCode::OBJECT_NOT_FOUND;
}

void Client::Unpin(const PinnedView& v) {
  std::shared_lock<std::shared_mutex> lock(life_mu_);
  if (closed_) return;  // the master cleared the table when we detached
  std::lock_guard<std::mutex> attach(attach_mu_);
  std::lock_guard<std::mutex> pins(pin_mu_);
  // A record of a previous slot is void: the master cleared that table.
  if (v.slot != slot_.load(std::memory_order_relaxed) || v.slot_generation != pin_slot_generation_) return;
  ClientSlot* cs = pool_->client_slot(v.slot);
  PinRecord& rec = pool_->pin_table(v.slot)[v.record];
  // Release: the caller's reads of the view happen before the extent can be
  // seen free.
  rec.entry_plus1.store(0, std::memory_order_release);
  cs->pins_in_use.store(--pins_in_use_, std::memory_order_relaxed);
  PublishRange(&rec, sizeof(rec));
  PublishRange(&cs->pins_in_use, sizeof(uint64_t));
  free_pins_.push_back(v.record);
}

Status Client::RegisterBuffer(uintptr_t ptr, uint64_t size) {
  if (ptr == 0 || size == 0 || ptr + size < ptr) {
    MCXL_LOG(kWarn, "client", "register_buffer(0x%lx, %llu): %s", (unsigned long)ptr,
             (unsigned long long)size, ptr == 0 ? "null pointer" : size == 0 ? "size is 0" : "range wraps");
    return ErrorCode::INVALID_PARAMS;
  }
  std::unique_lock<std::shared_mutex> lock(registry_mu_);
  auto next = registered_.lower_bound(ptr);
  if (next != registered_.end() && next->first < ptr + size) {
    MCXL_LOG(kWarn, "client", "register_buffer(0x%lx, %llu): overlaps the registered buffer [0x%lx, +%llu)",
             (unsigned long)ptr, (unsigned long long)size, (unsigned long)next->first,
             (unsigned long long)next->second);
    return ErrorCode::INVALID_PARAMS;
  }
  if (next != registered_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > ptr) {
      MCXL_LOG(kWarn, "client", "register_buffer(0x%lx, %llu): overlaps the registered buffer [0x%lx, +%llu)",
               (unsigned long)ptr, (unsigned long long)size, (unsigned long)prev->first,
               (unsigned long long)prev->second);
      return ErrorCode::INVALID_PARAMS;
    }
  }
  registered_[ptr] = size;
  lock.unlock();
  PrefaultForWrite(reinterpret_cast<void*>(ptr), size);
  return ErrorCode::OK;
}

Status Client::UnregisterBuffer(uintptr_t ptr) {
  std::unique_lock<std::shared_mutex> lock(registry_mu_);
  auto it = registered_.find(ptr);
  if (it == registered_.end()) {
    MCXL_LOG(kWarn, "client", "unregister_buffer(0x%lx): no registered buffer starts there (%zu registered)",
             (unsigned long)ptr, registered_.size());
    return ErrorCode::INVALID_PARAMS;
  }
  registered_.erase(it);
  return ErrorCode::OK;
}

Status Client::CheckRange(uintptr_t ptr, uint64_t size, const char* op) const {
  if (ptr == 0 || ptr + size < ptr) {
    MCXL_LOG(kWarn, "client", "%s: buffer 0x%lx of %llu bytes is %s", op, (unsigned long)ptr,
             (unsigned long long)size, ptr == 0 ? "a null pointer" : "a range that wraps");
    return ErrorCode::INVALID_PARAMS;
  }
  std::shared_lock<std::shared_mutex> lock(registry_mu_);
  if (registered_.empty()) return ErrorCode::OK;
  // Registered buffers are disjoint: only the one starting at or before ptr
  // and the one after it can be crossed.
  auto next = registered_.upper_bound(ptr);
  if (next != registered_.end() && next->first < ptr + size) {
    MCXL_LOG(kWarn, "client", "%s: buffer [0x%lx, +%llu) straddles the start of the registered buffer "
             "[0x%lx, +%llu)", op, (unsigned long)ptr, (unsigned long long)size,
             (unsigned long)next->first, (unsigned long long)next->second);
    return ErrorCode::INVALID_PARAMS;
  }
  if (next != registered_.begin()) {
    auto prev = std::prev(next);
    uint64_t end = prev->first + prev->second;
    if (ptr < end && ptr + size > end) {
      MCXL_LOG(kWarn, "client", "%s: buffer [0x%lx, +%llu) runs %llu bytes past the end of the registered "
               "buffer [0x%lx, +%llu)", op, (unsigned long)ptr, (unsigned long long)size,
               (unsigned long long)(ptr + size - end), (unsigned long)prev->first,
               (unsigned long long)prev->second);
      return ErrorCode::INVALID_PARAMS;
    }
  }
  return ErrorCode::OK;
}

}  // namespace mcxl
