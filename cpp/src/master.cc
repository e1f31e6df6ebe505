// The master's entry points: opening (format or recover) a pool, dispatching
// a decoded request (TCP or ring), the periodic Tick, statistics, and the
// index lookups every part shares. The parts by concern:
//   master_puts.cc      PutStart, pending puts, upsert settling, abandonment
//   master_remove.cc    removal, deferred and pin-deferred frees
//   master_clients.cc   attach/detach/heartbeat, liveness, reclaim
//   master_recovery.cc  restart on a formatted pool
//   master_eviction.cc  sampled approximate LRU
//   master_http.cc      the monitoring pages
//
// Atomics follow the three rules stated in master.h.
#include "mooncake_cxl/master.h"

#include <unistd.h>
#include <algorithm>
#include <cstring>

#include "mooncake_cxl/clock.h"
#include "mooncake_cxl/key_hash.h"
#include "mooncake_cxl/log.h"
#include "mooncake_cxl/object_header.h"
#include "mooncake_cxl/publish.h"
#include "mooncake_cxl/shm_ring.h"
#include "master_internal.h"

namespace mcxl {

std::string StatusReply(ErrorCode status) {
  Encoder e;
  EncodeStatus(status, &e);
  return e.data();
}

Result<std::unique_ptr<Master>> Master::Create(const MasterConfig& config) {
  std::unique_ptr<Master> m(new Master(config));
  Status s = m->Open();
  if (!s.ok()) return s.error();
  return m;
}

Status Master::Open() {
  machine_ = ThisMachine();
  if (!config_.enable_cxl)
    MCXL_LOG(kWarn, "master", "--enable_cxl=false: this master always serves a CXL pool; using %s",
             config_.cxl_path.c_str());
  if (config_.client_slots == 0 || config_.client_slots > 4096) {
    MCXL_LOG(kError, "master", "--client_slots must be 1..4096, got %llu",
             (unsigned long long)config_.client_slots);
    return ErrorCode::INVALID_PARAMS;
  }
  auto pool = Pool::Open(config_.cxl_path, config_.cxl_size, config_.format);
  if (!pool) return pool.error();
  pool_ = std::move(pool.value());
  bool fresh = config_.format || !pool_->IsFormatted();
  if (fresh) {
    FormatOptions fo;
    fo.index_capacity = config_.index_capacity;
    fo.client_slots = uint32_t(config_.client_slots);
    if (config_.coherence != "coherent" && config_.coherence != "noncoherent") {
      MCXL_LOG(kError, "master", "--coherence must be coherent or noncoherent, not '%s'", config_.coherence.c_str());
      return ErrorCode::INVALID_PARAMS;
    }
    fo.coherence = config_.coherence == "noncoherent" ? CoherenceMode::kNonCoherent : CoherenceMode::kCoherent;
    Status s = pool_->Format(fo);
    if (!s.ok()) return s;
  } else {
    Status s = pool_->Verify(nullptr);
    if (!s.ok()) return s;
  }
  Superblock* sb = pool_->superblock();
  SetCoherenceMode(CoherenceMode(sb->coherence_mode));
  index_ = std::make_unique<ObjectIndex>(pool_.get());
  alloc_ = std::make_unique<ExtentAllocator>(sb->data_offset, sb->data_size,
                                             2 * sb->index_capacity + 2);
  entry_meta_.assign(sb->index_capacity, EntryMeta{});
  clients_.assign(sb->client_slot_count, ClientInfo{});
  retired_.assign(sb->client_slot_count, RetiredPins{});
  attached_bits_.reset(new std::atomic<uint64_t>[(sb->client_slot_count + 63) / 64]());
  stats_.capacity_bytes = alloc_->capacity();
  // Relaxed stores + one publish: readers only use these as hints.
  sb->lease_ttl_ns.store(config_.default_kv_lease_ttl_ms * 1000000ull, std::memory_order_relaxed);
  sb->master_pid.store(uint64_t(getpid()), std::memory_order_relaxed);
  sb->master_machine_hash.store(KeyHash(machine_), std::memory_order_relaxed);
  sb->master_heartbeat_ns.store(NowNs(), std::memory_order_relaxed);
  uint64_t inc = sb->master_incarnation.load(std::memory_order_relaxed) + 1;
  sb->master_incarnation.store(inc, std::memory_order_release);
  PublishRange(&sb->master_incarnation, kCacheLine);
  if (!fresh) Recover();
  MCXL_LOG(kInfo, "master", "pool %s uuid %s incarnation %llu: %llu objects, %llu/%llu bytes used",
           pool_->path().c_str(), pool_->UuidString().c_str(), (unsigned long long)inc,
           (unsigned long long)stats_.complete_keys, (unsigned long long)alloc_->used_bytes(),
           (unsigned long long)alloc_->capacity());
  return ErrorCode::OK;
}

const ObjectHeader& Master::HeaderOf(uint64_t entry_slot) const {
  return *pool_->At<const ObjectHeader>(index_->entry(entry_slot).object_offset.load(std::memory_order_relaxed));
}

std::string_view Master::KeyOf(uint64_t entry_slot) const {
  // The master wrote this header itself; it is trusted.
  const auto* h = pool_->At<const ObjectHeader>(
      index_->entry(entry_slot).object_offset.load(std::memory_order_relaxed));
  return std::string_view(reinterpret_cast<const char*>(h + 1), h->key_len);
}

void Master::FindLive(std::string_view key, uint64_t hash, std::vector<uint64_t>* out) const {
  out->clear();
  uint64_t cap = index_->capacity();
  uint64_t max_probe = std::min(pool_->superblock()->max_probe.load(std::memory_order_relaxed), cap - 1);
  uint64_t home = index_->HomeSlot(hash);
  for (uint64_t i = 0; i <= max_probe; ++i) {
    uint64_t slot = (home + i) & (cap - 1);
    const IndexEntry& e = index_->entry(slot);
    // Acquire: a client's COMPLETE CAS published the value before it.
    EntryState st = StateOf(e.state_gen.load(std::memory_order_acquire));
    if (st == EntryState::kEmpty) break;
    if (st != EntryState::kWriting && st != EntryState::kComplete) continue;
    if (e.key_hash.load(std::memory_order_relaxed) != hash) continue;
    if (KeyOf(slot) == key) out->push_back(slot);
  }
}

std::string Master::Handle(uint16_t type, std::string_view payload, uint32_t* conn_slot) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string reply = Dispatch(type, payload, conn_slot);
  CountOp(type, reply);
  return reply;
}

void Master::CountOp(uint16_t type, const std::string& reply) {
  if (type >= kMessageTypes) return;
  ++op_requests_[type];
  int32_t status = 0;
  if (reply.size() >= sizeof(status)) memcpy(&status, reply.data(), sizeof(status));
  if (status != 0) ++op_failures_[type];
}

void Master::ServeRing(uint32_t slot) {
  std::lock_guard<std::mutex> lock(mu_);
  if (slot >= clients_.size() || !clients_[slot].attached) return;
  uint32_t ring_bytes = pool_->superblock()->ring_bytes;
  ShmRing requests(pool_->ring(slot, 0), ring_bytes), replies(pool_->ring(slot, 1), ring_bytes);
  std::string frame;
  for (int served = 0; served < 64; ++served) {  // bounded: other clients wait
    ShmRing::PopResult r = requests.Pop(&frame);
    if (r == ShmRing::PopResult::kEmpty) break;
    FrameHeader h{};
    bool ok = r == ShmRing::PopResult::kOk && frame.size() >= sizeof(h);
    if (ok) memcpy(&h, frame.data(), sizeof(h));
    FrameCheck check = ok ? CheckFrameHeader(h) : FrameCheck::kBadMagic;
    if (!ok || check != FrameCheck::kOk || h.payload_bytes != frame.size() - sizeof(h)) {
      MCXL_LOG(kWarn, "ring", "request ring of client slot %u holds %s; answered with an error and skipped",
               slot, r == ShmRing::PopResult::kCorrupt ? "a torn or stale record" : FrameCheckName(check));
      requests.SkipAll();
      Encoder e;
      EncodeStatus(ErrorCode::INVALID_PARAMS, &e);
      (void)replies.Push(MakeFrame(MessageType::kError, ok ? h.request_id : 0, e.data()));
      replies.WakeConsumer();
      continue;
    }
    if (h.type == uint16_t(MessageType::kAttach) || h.type == uint16_t(MessageType::kDetach)) {
      MCXL_LOG(kWarn, "ring", "client slot %u sent %s over its ring; only TCP carries it", slot,
               MessageTypeName(h.type));
      Encoder e;
      EncodeStatus(ErrorCode::INVALID_PARAMS, &e);
      (void)replies.Push(MakeFrame(MessageType(h.type), h.request_id, e.data()));
      replies.WakeConsumer();
      continue;
    }
    uint32_t conn_slot = slot;
    std::string reply = Dispatch(h.type, std::string_view(frame).substr(sizeof(h)), &conn_slot);
    CountOp(h.type, reply);
    if (!replies.Push(MakeFrame(MessageType(h.type), h.request_id, reply)))
      MCXL_LOG(kWarn, "ring", "reply ring of client slot %u is full (client stuck?); reply dropped", slot);
    replies.WakeConsumer();
  }
}

std::string Master::Dispatch(uint16_t type, std::string_view payload, uint32_t* conn_slot) {
  Decoder d(payload);
  switch (MessageType(type)) {
    case MessageType::kPing: {
      Encoder e;
      Encode(PingReply{ErrorCode::OK, pool_->superblock()->master_incarnation.load(std::memory_order_relaxed)}, &e);
      return e.data();
    }
    case MessageType::kAttach: return HandleAttach(&d, conn_slot);
    case MessageType::kDetach: return HandleDetach(&d, conn_slot);
    case MessageType::kHeartbeat: return HandleHeartbeat(&d);
    case MessageType::kPutStart: return HandlePutStart(&d);
    case MessageType::kRemove: return HandleRemove(&d, false);
    case MessageType::kBatchRemove: return HandleRemove(&d, true);
    case MessageType::kRemoveByRegex: return HandleRemoveMatching(&d, false);
    case MessageType::kRemoveAll: return HandleRemoveMatching(&d, true);
    default:
      MCXL_LOG(kWarn, "master", "request of unknown type %u (%zu bytes) rejected", type, payload.size());
      return StatusReply(ErrorCode::INVALID_PARAMS);
  }
}

uint64_t Master::Tick() {
  std::lock_guard<std::mutex> lock(mu_);
  Superblock* sb = pool_->superblock();
  sb->master_heartbeat_ns.store(NowNs(), std::memory_order_relaxed);  // a hint only
  PublishRange(&sb->master_heartbeat_ns, sizeof(uint64_t));
  if (!pending_.empty() || !deferred_.empty()) CheckPending();
  uint64_t now = MonoNs();
  if (!pinned_.empty() && now - last_pin_scan_mono_ > 5 * 1000000ull) {
    last_pin_scan_mono_ = now;
    ReleaseUnpinned();
  }
  if (now - last_client_check_mono_ > kClientCheckIntervalNs) {
    last_client_check_mono_ = now;
    CheckClients();
  }
  return !pending_.empty() ? 1 : !pinned_.empty() ? 5 : 100;
}

MasterStats Master::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  MasterStats s = stats_;
  s.pending_puts = pending_.size();
  s.allocated_bytes = alloc_->used_bytes();
  s.attached_clients = 0;
  for (const auto& c : clients_) s.attached_clients += c.attached ? 1 : 0;
  return s;
}

}  // namespace mcxl
