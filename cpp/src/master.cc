// The master's request handling, recovery and client tracking; eviction is in
// master_eviction.cc, the monitoring pages in master_http.cc.
//
// Atomics in this file follow three rules, so each load and store below
// needs no comment of its own:
//  * Entry fields other than state_gen and the lease word, superblock and
//    client-slot lines of the master's: only the master writes them, under
//    mu_, so its own loads are relaxed (program order) and its stores go
//    through ObjectIndex's seqlock or a release store + PublishRange.
//  * state_gen: a client may CAS WRITING->COMPLETE/ABORTED at any time. Loads
//    that decide on that are acquire (they pair with the client's release
//    CAS and make its value bytes visible); the master's own transitions of a
//    WRITING entry go through the same CAS (ObjectIndex::Abort), so exactly
//    one side wins. A decision uses one load per entry, never two.
//  * Client-written lines (heartbeat, pins, hit counters) and lease words are
//    hints compared with the clock or summed for statistics: relaxed, after
//    ObserveRange.
#include "mooncake_cxl/master.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <regex>
#include <unordered_map>

#include "mooncake_cxl/clock.h"
#include "mooncake_cxl/key_hash.h"
#include "mooncake_cxl/log.h"
#include "mooncake_cxl/object_header.h"
#include "mooncake_cxl/publish.h"
#include "mooncake_cxl/shm_ring.h"

namespace mcxl {
namespace {

constexpr uint64_t kNsPerSec = 1000000000ull;
constexpr uint64_t kClientCheckIntervalNs = 500 * 1000000ull;

std::string ThisMachine() {
  char buf[256] = {};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

// True when `pid` is gone or a zombie (a killed child not yet reaped).
bool LocalPidDead(uint64_t pid) {
  if (pid == 0) return false;
  if (kill(pid_t(pid), 0) != 0 && errno == ESRCH) return true;
  char path[64];
  snprintf(path, sizeof(path), "/proc/%llu/stat", (unsigned long long)pid);
  FILE* f = fopen(path, "r");
  if (f == nullptr) return true;
  char buf[512] = {};
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  const char* rp = static_cast<const char*>(memrchr(buf, ')', n));
  return rp != nullptr && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X');
}

std::string StatusReply(ErrorCode status) {
  Encoder e;
  EncodeStatus(status, &e);
  return e.data();
}

}  // namespace

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

void Master::Recover() {
  // Pids of the previous incarnation's clients, to free their unfinished
  // extents at once when they are dead.
  std::vector<uint64_t> old_pid(clients_.size(), 0);
  for (uint32_t i = 0; i < clients_.size(); ++i) {
    ClientSlot* cs = pool_->client_slot(i);
    // Only a client of this machine can be known dead by its pid.
    if (cs->generation.load(std::memory_order_relaxed) != 0 &&
        cs->machine_hash.load(std::memory_order_relaxed) == KeyHash(machine_))
      old_pid[i] = cs->pid.load(std::memory_order_relaxed);
    cs->generation.store(0, std::memory_order_relaxed);  // every client re-attaches
    // Pins of the previous incarnation's clients are void: they re-attach
    // with empty tables.
    PinRecord* t = pool_->pin_table(i);
    for (uint32_t r = 0; r < pool_->superblock()->pins_per_client; ++r)
      t[r].entry_plus1.store(0, std::memory_order_relaxed);
    cs->pins_in_use.store(0, std::memory_order_relaxed);
    cs->pin_high_water.store(0, std::memory_order_relaxed);
    PublishRange(t, pool_->superblock()->pins_per_client * sizeof(PinRecord));
    PublishRange(&cs->heartbeat_ns, kCacheLine);
  }
  PublishRange(pool_->client_slot(0), clients_.size() * sizeof(ClientSlot));

  struct Found {
    uint64_t slot, offset, extent, generation;
  };
  std::vector<Found> complete;
  std::vector<uint64_t> unfinished;
  uint64_t capacity = index_->capacity();
  for (uint64_t slot = 0; slot < capacity; ++slot) {
    IndexEntry& e = index_->entry(slot);
    index_->RepairVersion(slot);
    uint64_t sg = e.state_gen.load(std::memory_order_acquire);
    next_generation_ = std::max(next_generation_, GenOf(sg) + 1);
    EntryState st = StateOf(sg);
    if (st == EntryState::kEmpty || st == EntryState::kTombstone) continue;
    uint64_t off = e.object_offset.load(std::memory_order_relaxed);
    const ObjectHeader* h = CheckedObjectHeader(*pool_, off);
    bool ok = h != nullptr && h->key_hash == e.key_hash.load(std::memory_order_relaxed) &&
              h->value_size == e.value_size.load(std::memory_order_relaxed) &&
              h->generation == GenOf(sg);
    // A live client of the previous incarnation may publish an unfinished
    // put this very moment: revoke with the same CAS it uses, so exactly one
    // of us wins, and keep the put if it won.
    if (st == EntryState::kWriting && ok && !index_->Abort(slot, GenOf(sg)))
      st = StateOf(e.state_gen.load(std::memory_order_acquire));
    if (st == EntryState::kComplete && ok) {
      complete.push_back({slot, off, h->extent_size, GenOf(sg)});
    } else if ((st == EntryState::kWriting || st == EntryState::kAborted) && ok) {
      unfinished.push_back(slot);
    } else {
      MCXL_LOG(kWarn, "master", "recovery: entry %llu (state %d) has no valid object header; dropped",
               (unsigned long long)slot, int(st));
      index_->Tombstone(slot);
      ++stats_.dropped_on_recovery;
    }
  }
  // Reserve in address order (the allocator's fast path for recovery).
  auto by_offset = [](const Found& a, const Found& b) { return a.offset < b.offset; };
  std::sort(complete.begin(), complete.end(), by_offset);
  std::unordered_map<uint64_t, std::vector<uint64_t>> by_hash;
  for (const Found& f : complete) {
    auto ext = alloc_->Reserve(f.offset, f.extent);
    if (!ext) {
      MCXL_LOG(kWarn, "master", "recovery: entry %llu overlaps another object; dropped",
               (unsigned long long)f.slot);
      index_->Tombstone(f.slot);
      ++stats_.dropped_on_recovery;
      continue;
    }
    entry_meta_[f.slot] = EntryMeta{ext->handle, false};
    AddToGroup(f.slot);
    ++live_entries_;
    CountComplete(f.slot);
    by_hash[index_->entry(f.slot).key_hash.load(std::memory_order_relaxed)].push_back(f.slot);
  }
  // An upsert caught mid-flight leaves two COMPLETE entries of one key: keep
  // the newest.
  for (auto& [hash, slots] : by_hash) {
    if (slots.size() < 2) {
      uint32_t fl = index_->entry(slots[0]).flags.load(std::memory_order_relaxed);
      if (fl & kFlagSuperseded) index_->SetFlags(slots[0], fl & ~kFlagSuperseded);
      continue;
    }
    for (uint64_t s : slots) {
      if (StateOf(index_->entry(s).state_gen.load(std::memory_order_relaxed)) != EntryState::kComplete)
        continue;  // unlinked as an older value of a key handled just before
      ClearSupersededIfSettled(std::string(KeyOf(s)), hash);
    }
  }
  // Unfinished puts: revoke. Their extents are reserved (a live client of the
  // old incarnation might still write) and released later unless the owner is
  // known dead.
  uint64_t release_at = MonoNs() + config_.put_start_release_timeout_sec * kNsPerSec;
  std::vector<std::pair<uint64_t, uint64_t>> unfinished_ext;
  for (uint64_t slot : unfinished) {
    IndexEntry& e = index_->entry(slot);
    const ObjectHeader* h = pool_->At<const ObjectHeader>(e.object_offset.load(std::memory_order_relaxed));
    unfinished_ext.emplace_back(e.object_offset.load(std::memory_order_relaxed), h->extent_size);
    uint32_t owner = e.owner_slot.load(std::memory_order_relaxed);
    bool dead = owner < old_pid.size() && old_pid[owner] != 0 && LocalPidDead(old_pid[owner]);
    auto ext = alloc_->Reserve(e.object_offset.load(std::memory_order_relaxed), h->extent_size);
    index_->Tombstone(slot);
    ++stats_.revoked_puts;
    if (!ext) continue;  // overlapped a kept object: it was never ours to free
    if (dead) (void)alloc_->Free(ext->handle);
    else deferred_.push_back({ext->handle, release_at});
  }
  stats_.recovered_objects = stats_.complete_keys;
  MCXL_LOG(kInfo, "master", "recovery: kept %llu objects, revoked %zu unfinished puts, dropped %llu",
           (unsigned long long)stats_.complete_keys, unfinished.size(),
           (unsigned long long)stats_.dropped_on_recovery);
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

bool Master::ClientValid(const ClientRef& ref) const {
  return ref.slot < clients_.size() && clients_[ref.slot].attached &&
         clients_[ref.slot].generation == ref.generation;
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

void Master::SetAttached(uint32_t slot, bool attached) {
  uint64_t bit = 1ull << (slot % 64);
  auto& word = attached_bits_[slot / 64];
  // Release: the ring resets made before are visible to the RingServer
  // once it sees the bit. Only this (locked) path writes the bitmap.
  word.store(attached ? word.load(std::memory_order_relaxed) | bit : word.load(std::memory_order_relaxed) & ~bit,
             std::memory_order_release);
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

std::string Master::HandleAttach(Decoder* d, uint32_t* conn_slot) {
  AttachRequest req;
  AttachReply reply;
  if (!Decode(d, &req)) {
    MCXL_LOG(kWarn, "master", "malformed Attach request rejected");
    reply.status = ErrorCode::INVALID_PARAMS;
  } else {
    uint32_t slot = kNoSlot;
    if (ClientValid({req.prev_slot, req.prev_generation})) {
      slot = req.prev_slot;  // a reconnect of a live client keeps its slot
    } else {
      for (uint32_t i = 0; i < clients_.size(); ++i)
        if (!clients_[i].attached) {
          slot = i;
          break;
        }
    }
    if (slot == kNoSlot) {
      MCXL_LOG(kWarn, "master", "attach of %s refused: all %zu client slots are taken",
               req.local_hostname.c_str(), clients_.size());
      reply.status = ErrorCode::NO_AVAILABLE_HANDLE;
    } else {
      ClientInfo& c = clients_[slot];
      ClientSlot* cs = pool_->client_slot(slot);
      if (!c.attached || c.generation != req.prev_generation) {
        c = ClientInfo{};
        c.attached = true;
        c.generation = (uint64_t(pool_->superblock()->master_incarnation.load(std::memory_order_relaxed)) << 32) +
                       next_generation_++;
        c.pid = req.pid;
        c.local = req.machine == machine_;
        c.attach_ns = NowNs();
        cs->pid.store(req.pid, std::memory_order_relaxed);
        cs->machine_hash.store(KeyHash(req.machine), std::memory_order_relaxed);
        snprintf(cs->host, sizeof(cs->host), "%s", req.local_hostname.c_str());
        // Release: pid and host are visible before the generation that
        // marks the slot assigned.
        ShmRing::Reset(pool_->ring(slot, 0));
        ShmRing::Reset(pool_->ring(slot, 1));
        cs->generation.store(c.generation, std::memory_order_release);
        PublishRange(cs, kCacheLine);
        SetAttached(slot, true);
        MCXL_LOG(kInfo, "master", "client %s (pid %llu) attached as slot %u",
                 req.local_hostname.c_str(), (unsigned long long)req.pid, slot);
      }
      c.connected = true;
      *conn_slot = slot;
      const Superblock* sb = pool_->superblock();
      reply.slot = slot;
      reply.slot_generation = c.generation;
      reply.incarnation = sb->master_incarnation.load(std::memory_order_relaxed);
      reply.pool_path = pool_->path();
      reply.pool_size = sb->pool_size;
      memcpy(reply.uuid, sb->uuid, 16);
      reply.lease_ttl_ms = config_.default_kv_lease_ttl_ms;
    }
  }
  Encoder e;
  Encode(reply, &e);
  return e.data();
}

std::string Master::HandleDetach(Decoder* d, uint32_t* conn_slot) {
  ClientRef ref;
  if (!Decode(d, &ref) || !d->done()) return StatusReply(ErrorCode::INVALID_PARAMS);
  if (!ClientValid(ref)) return StatusReply(ErrorCode::ILLEGAL_CLIENT);
  ReclaimClient(ref.slot, "detached");
  *conn_slot = kNoSlot;
  return StatusReply(ErrorCode::OK);
}

std::string Master::HandleHeartbeat(Decoder* d) {
  ClientRef ref;
  if (!Decode(d, &ref) || !d->done()) return StatusReply(ErrorCode::INVALID_PARAMS);
  return StatusReply(ClientValid(ref) ? ErrorCode::OK : ErrorCode::ILLEGAL_CLIENT);
}

PutStartItem Master::PutStartOne(const PutStartRequest& req, size_t i) {
  PutStartItem item;
  const std::string& key = req.keys[i];
  uint64_t size = req.sizes[i];
  if (key.empty() || key.size() > kMaxKeyLength) {
    MCXL_LOG(kWarn, "master", "put refused: key length %zu is outside 1..%u", key.size(), kMaxKeyLength);
    item.status = ErrorCode::INVALID_PARAMS;
    return item;
  }
  if (size == 0) {
    MCXL_LOG(kWarn, "master", "put of '%s' refused: empty value", key.c_str());
    item.status = ErrorCode::INVALID_PARAMS;
    return item;
  }
  uint64_t hash = KeyHash(key);
  std::vector<uint64_t> live;
  FindLive(key, hash, &live);
  if (!live.empty() && !req.upsert) {
    item.status = ErrorCode::OBJECT_ALREADY_EXISTS;
    return item;
  }
  if ((req.config.flags & kFlagSoftPin) && req.config.soft_pin_ttl_ms > config_.max_kv_soft_pin_ttl_ms) {
    MCXL_LOG(kWarn, "master", "put of '%s' refused: soft_pin_ttl_ms %llu is above --max_kv_soft_pin_ttl=%llu",
             key.c_str(), (unsigned long long)req.config.soft_pin_ttl_ms,
             (unsigned long long)config_.max_kv_soft_pin_ttl_ms);
    item.status = ErrorCode::INVALID_PARAMS;
    return item;
  }
  uint64_t extent_bytes = ExtentBytes(key.size(), size);
  if (extent_bytes < size || extent_bytes > alloc_->capacity()) {
    MCXL_LOG(kWarn, "master", "put of '%s' refused: %llu bytes can never fit a pool of %llu",
             key.c_str(), (unsigned long long)size, (unsigned long long)alloc_->capacity());
    item.status = ErrorCode::NO_AVAILABLE_HANDLE;
    return item;
  }
  auto ext = AllocateForPut(extent_bytes, key);
  if (!ext) {
    item.status = ext.error();
    return item;
  }
  uint64_t gen = next_generation_++;
  uint64_t now = NowNs();
  ObjectHeaderFields f;
  f.key_hash = hash;
  f.generation = gen;
  f.value_size = size;
  f.extent_size = ext->size;
  f.put_time_ns = now;
  f.group_hash = req.groups[i].empty() ? 0 : KeyHash(req.groups[i]);
  f.flags = req.config.flags & (kFlagHardPin | kFlagSoftPin);
  f.soft_pin_ttl_ms = !(f.flags & kFlagSoftPin)     ? 0
                      : req.config.soft_pin_ttl_ms ? req.config.soft_pin_ttl_ms
                                                   : config_.default_kv_soft_pin_ttl_ms;
  WriteObjectHeader(*pool_, ext->offset, f, key);
  auto slot = index_->Insert({hash, ext->offset, size, gen, now, f.flags, req.client.slot});
  if (!slot) {
    (void)alloc_->Free(ext->handle);
    MCXL_LOG(kWarn, "master", "put of '%s' refused: no index slot in its probe sequence", key.c_str());
    item.status = ErrorCode::NO_AVAILABLE_HANDLE;
    return item;
  }
  if (req.upsert) {
    // Every older entry of the key, COMPLETE or still WRITING (a concurrent
    // upsert), is marked: a reader that meets one keeps probing and takes the
    // newest generation, so once this upsert returns no reader sees an older
    // value, whichever of the concurrent upserts completes last. (Looked up
    // again: making room may have evicted some.)
    FindLive(key, hash, &live);
    for (uint64_t s : live) {
      if (s == *slot) continue;
      uint32_t fl = index_->entry(s).flags.load(std::memory_order_relaxed);
      if (!(fl & kFlagSuperseded)) index_->SetFlags(s, fl | kFlagSuperseded);
    }
  }
  entry_meta_[*slot] = EntryMeta{ext->handle, false};
  AddToGroup(*slot);
  ++live_entries_;
  pending_.push_back({*slot, gen, req.client.slot, req.put_id, MonoNs(), req.upsert});
  item.entry_slot = *slot;
  item.generation = gen;
  item.value_offset = index_->ValueOffset(ext->offset, key.size());
  return item;
}

std::string Master::HandlePutStart(Decoder* d) {
  PutStartRequest req;
  PutStartReply reply;
  if (!Decode(d, &req)) {
    MCXL_LOG(kWarn, "master", "malformed PutStart request rejected");
    reply.status = ErrorCode::INVALID_PARAMS;
  } else if (!ClientValid(req.client)) {
    reply.status = ErrorCode::ILLEGAL_CLIENT;  // the client re-attaches and retries
  } else {
    ForgetAbandoned(req.client.slot, req.abandoned);
    const auto& gave_up = clients_[req.client.slot].abandoned;
    if (std::find(gave_up.begin(), gave_up.end(), req.put_id) != gave_up.end()) {
      // A PutStart its client gave up on, arriving late: do nothing.
      MCXL_LOG(kInfo, "master", "late PutStart %llu of client slot %u ignored: the client abandoned it",
               (unsigned long long)req.put_id, req.client.slot);
      reply.status = ErrorCode::RPC_TIMEOUT;
    } else {
      reply.items.reserve(req.keys.size());
      for (size_t i = 0; i < req.keys.size(); ++i) {
        ++stats_.put_requests;
        reply.items.push_back(PutStartOne(req, i));
        ErrorCode st = reply.items.back().status;
        if (st != ErrorCode::OK && st != ErrorCode::OBJECT_ALREADY_EXISTS) ++stats_.put_failures;
      }
    }
  }
  Encoder e;
  Encode(reply, &e);
  return e.data();
}

bool Master::IsPinned(uint64_t entry_slot, uint64_t generation) const {
  // seq_cst fence: the tombstone (or lease check) before it and the pin loads
  // after it form a Dekker pair with the client's pin store, fence, version
  // re-check: either we see its pin or it sees our version change.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  uint32_t per = pool_->superblock()->pins_per_client;
  for (uint32_t c = 0; c < clients_.size(); ++c) {
    if (!clients_[c].attached) continue;
    ClientSlot* cs = pool_->client_slot(c);
    ObserveRange(&cs->pins_in_use, 2 * sizeof(uint64_t));
    if (cs->pins_in_use.load(std::memory_order_relaxed) == 0) continue;
    uint64_t hwm = std::min<uint64_t>(cs->pin_high_water.load(std::memory_order_relaxed), per);
    PinRecord* t = pool_->pin_table(c);
    ObserveRange(t, hwm * sizeof(PinRecord));
    for (uint64_t i = 0; i < hwm; ++i)
      if (t[i].entry_plus1.load(std::memory_order_relaxed) == entry_slot + 1 &&
          t[i].generation.load(std::memory_order_relaxed) == generation)
        return true;
  }
  return false;
}

void Master::ReleaseUnpinned() {
  size_t keep = 0;
  for (const PinnedFree& p : pinned_) {
    if (IsPinned(p.entry_slot, p.generation)) pinned_[keep++] = p;
    else (void)alloc_->Free(p.handle);
  }
  pinned_.resize(keep);
}

void Master::Unlink(uint64_t entry_slot, bool free_now, uint64_t release_mono_ns) {
  uint64_t gen = GenOf(index_->entry(entry_slot).state_gen.load(std::memory_order_relaxed));
  index_->Tombstone(entry_slot);
  --live_entries_;
  RemoveFromGroup(entry_slot);
  EntryMeta& meta = entry_meta_[entry_slot];
  if (meta.counted) --stats_.complete_keys;
  meta.counted = false;
  if (free_now && IsPinned(entry_slot, gen)) {
    pinned_.push_back({meta.extent, entry_slot, gen});
  } else if (free_now) {
    Status s = alloc_->Free(meta.extent);
    if (!s.ok())
      MCXL_LOG(kError, "master", "extent of entry %llu was already free", (unsigned long long)entry_slot);
  } else {
    deferred_.push_back({meta.extent, release_mono_ns});
  }
}

ErrorCode Master::RemoveKey(std::string_view key, bool force) {
  if (key.empty() || key.size() > kMaxKeyLength) return ErrorCode::INVALID_PARAMS;
  std::vector<uint64_t> live, complete;
  FindLive(key, KeyHash(key), &live);
  uint64_t now = NowNs();
  for (uint64_t s : live) {
    // One look per entry (see ClearSupersededIfSettled): only what was
    // COMPLETE here is checked and removed.
    uint64_t sg = index_->entry(s).state_gen.load(std::memory_order_acquire);
    if (StateOf(sg) != EntryState::kComplete) continue;
    if (!force && (index_->LeaseUntil(s) > now || IsPinned(s, GenOf(sg)))) return ErrorCode::OBJECT_HAS_LEASE;
    complete.push_back(s);
  }
  if (complete.empty()) return live.empty() ? ErrorCode::OBJECT_NOT_FOUND : ErrorCode::REPLICA_IS_NOT_READY;
  for (uint64_t s : complete) Unlink(s, true, 0);
  return ErrorCode::OK;
}

std::string Master::HandleRemove(Decoder* d, bool batch) {
  RemoveRequest req;
  RemoveReply reply;
  if (!Decode(d, &req) || (!batch && req.keys.size() != 1)) {
    MCXL_LOG(kWarn, "master", "malformed Remove request rejected");
    reply.status = ErrorCode::INVALID_PARAMS;
  } else {
    for (const auto& k : req.keys) {
      ++stats_.remove_requests;
      ErrorCode r = RemoveKey(k, req.force);
      if (r != ErrorCode::OK) ++stats_.remove_failures;
      reply.results.push_back(ToInt(r));
    }
    if (!batch) reply.status = ErrorCode(reply.results[0]);
  }
  Encoder e;
  Encode(reply, &e);
  return e.data();
}

std::string Master::HandleRemoveMatching(Decoder* d, bool all) {
  RemoveByRegexRequest req;
  CountReply reply;
  if (!Decode(d, &req)) {
    MCXL_LOG(kWarn, "master", "malformed RemoveByRegex/RemoveAll request rejected");
    reply.status = ErrorCode::INVALID_PARAMS;
    Encoder e;
    Encode(reply, &e);
    return e.data();
  }
  std::regex re;
  if (!all) {
    try {
      re = std::regex(req.pattern, std::regex::ECMAScript);
    } catch (const std::regex_error& ex) {
      MCXL_LOG(kWarn, "master", "remove_by_regex: invalid pattern '%s': %s", req.pattern.c_str(), ex.what());
      reply.status = ErrorCode::INVALID_PARAMS;
      Encoder e;
      Encode(reply, &e);
      return e.data();
    }
  }
  uint64_t now = NowNs();
  for (uint64_t s = 0; s < index_->capacity(); ++s) {
    const IndexEntry& e = index_->entry(s);
    uint64_t sg = e.state_gen.load(std::memory_order_acquire);
    if (StateOf(sg) != EntryState::kComplete) continue;
    if (!req.force && (index_->LeaseUntil(s) > now || IsPinned(s, GenOf(sg)))) continue;
    if (!all) {
      std::string_view k = KeyOf(s);
      if (!std::regex_search(k.begin(), k.end(), re)) continue;
    }
    Unlink(s, true, 0);
    ++reply.count;
  }
  Encoder e;
  Encode(reply, &e);
  return e.data();
}

void Master::ClearSupersededIfSettled(std::string_view key, uint64_t hash) {
  std::vector<uint64_t> live;
  FindLive(key, hash, &live);
  // One snapshot of the states: a client may publish WRITING->COMPLETE at
  // any moment, and an entry seen WRITING here is not ours to judge (its own
  // completion settles it later). Deciding on a second look would unlink a
  // just-published newer value as if it were old.
  std::vector<uint64_t> states(live.size());
  uint64_t newest_gen = 0, newest = UINT64_MAX;
  bool pending_upsert = false;
  for (size_t i = 0; i < live.size(); ++i) {
    // Acquire: pairs with the client's COMPLETE CAS.
    states[i] = index_->entry(live[i]).state_gen.load(std::memory_order_acquire);
    if (StateOf(states[i]) == EntryState::kWriting) pending_upsert = true;
    else if (GenOf(states[i]) > newest_gen) newest_gen = GenOf(states[i]), newest = live[i];
  }
  for (size_t i = 0; i < live.size(); ++i) {
    uint64_t s = live[i];
    if (StateOf(states[i]) != EntryState::kComplete) continue;
    if (s != newest) {  // an older value of an upserted key
      Unlink(s, true, 0);
      continue;
    }
    uint32_t fl = index_->entry(s).flags.load(std::memory_order_relaxed);
    if (!pending_upsert && (fl & kFlagSuperseded)) index_->SetFlags(s, fl & ~kFlagSuperseded);
  }
}

EntryState Master::PendingState(const PendingPut& p) const {
  uint64_t sg = index_->entry(p.entry_slot).state_gen.load(std::memory_order_acquire);
  EntryState st = StateOf(sg);
  bool ours = GenOf(sg) == p.generation &&
              (st == EntryState::kWriting || st == EntryState::kComplete || st == EntryState::kAborted);
  return ours ? st : EntryState::kEmpty;
}

void Master::CountComplete(uint64_t entry_slot) {
  EntryMeta& meta = entry_meta_[entry_slot];
  if (!meta.counted) ++stats_.complete_keys;
  meta.counted = true;
}

void Master::FinishPending(const PendingPut& p, EntryState state) {
  if (state == EntryState::kEmpty) return;  // already unlinked by a remove
  if (state == EntryState::kComplete) {
    CountComplete(p.entry_slot);
    if (p.upsert) {
      std::string key(KeyOf(p.entry_slot));
      ClearSupersededIfSettled(key, KeyHash(key));
    }
    return;
  }
  // ABORTED by its client: reclaim now (the client stopped writing first).
  std::string key(KeyOf(p.entry_slot));
  Unlink(p.entry_slot, true, 0);
  if (p.upsert) ClearSupersededIfSettled(key, KeyHash(key));
}

void Master::RevokePending(const PendingPut& p, bool owner_dead) {
  std::string key(KeyOf(p.entry_slot));
  if (!index_->Abort(p.entry_slot, p.generation)) {
    // The client published it meanwhile (a normal object now), or the entry
    // is no longer this put at all.
    FinishPending(p, PendingState(p));
    return;
  }
  ++stats_.revoked_puts;
  MCXL_LOG(kInfo, "master", "revoked unfinished put of '%s' (client slot %u %s)", key.c_str(), p.owner,
           owner_dead ? "exited" : "unresponsive or too slow");
  Unlink(p.entry_slot, owner_dead,
         p.start_mono_ns + config_.put_start_release_timeout_sec * kNsPerSec);
  if (p.upsert) ClearSupersededIfSettled(key, KeyHash(key));
}

void Master::ForgetAbandoned(uint32_t slot, const std::vector<uint64_t>& ids) {
  if (ids.empty()) return;
  auto& list = clients_[slot].abandoned;
  for (uint64_t id : ids)
    if (std::find(list.begin(), list.end(), id) == list.end()) list.push_back(id);
  if (list.size() > 256) list.erase(list.begin(), list.end() - 256);
  size_t keep = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    PendingPut p = pending_[i];
    if (p.owner == slot && std::find(ids.begin(), ids.end(), p.put_id) != ids.end()) {
      // The client will never write it: revoke and free at once.
      if (PendingState(p) == EntryState::kWriting) RevokePending(p, true);
      else FinishPending(p, PendingState(p));
      continue;
    }
    pending_[keep++] = p;
  }
  pending_.resize(keep);
}

void Master::CheckPending() {
  // Completion and the discard timeout only; dead clients are found by
  // CheckClients, which revokes their puts with the slot.
  uint64_t now = MonoNs();
  uint64_t discard_ns = config_.put_start_discard_timeout_sec * kNsPerSec;
  size_t keep = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    PendingPut p = pending_[i];
    EntryState st = PendingState(p);
    if (st != EntryState::kWriting) {
      FinishPending(p, st);
      continue;
    }
    if (now - p.start_mono_ns > discard_ns) {
      RevokePending(p, false);
      continue;
    }
    pending_[keep++] = p;
  }
  pending_.resize(keep);
  size_t dkeep = 0;
  for (size_t i = 0; i < deferred_.size(); ++i) {
    if (now >= deferred_[i].release_mono_ns) (void)alloc_->Free(deferred_[i].handle);
    else deferred_[dkeep++] = deferred_[i];
  }
  deferred_.resize(dkeep);
}

void Master::ReclaimClient(uint32_t slot, const char* why) {
  ClientInfo& c = clients_[slot];
  if (!c.attached) return;
  bool dead = c.local && LocalPidDead(c.pid);
  // Revoke this client's unfinished puts before the slot can be reused.
  size_t keep = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    PendingPut p = pending_[i];
    if (p.owner != slot) {
      pending_[keep++] = p;
      continue;
    }
    EntryState st = PendingState(p);
    if (st != EntryState::kWriting) FinishPending(p, st);
    else RevokePending(p, dead);
  }
  pending_.resize(keep);
  c = ClientInfo{};
  SetAttached(slot, false);
  ShmRing::Reset(pool_->ring(slot, 0));
  ShmRing::Reset(pool_->ring(slot, 1));
  ClientSlot* cs = pool_->client_slot(slot);
  retired_hits_ += cs->get_hits.load(std::memory_order_relaxed);
  retired_misses_ += cs->get_misses.load(std::memory_order_relaxed);
  cs->get_hits.store(0, std::memory_order_relaxed);
  cs->get_misses.store(0, std::memory_order_relaxed);
  cs->generation.store(0, std::memory_order_release);
  PublishRange(cs, kCacheLine);
  // Its pins die with it (DESIGN.md §2): clear the table for the next owner.
  uint32_t per = pool_->superblock()->pins_per_client;
  PinRecord* t = pool_->pin_table(slot);
  for (uint32_t i = 0; i < per; ++i) t[i].entry_plus1.store(0, std::memory_order_relaxed);
  cs->pins_in_use.store(0, std::memory_order_relaxed);
  cs->pin_high_water.store(0, std::memory_order_relaxed);
  PublishRange(t, per * sizeof(PinRecord));
  PublishRange(&cs->heartbeat_ns, kCacheLine);
  MCXL_LOG(kInfo, "master", "client slot %u reclaimed: %s", slot, why);
}

void Master::OnDisconnect(uint32_t slot) {
  std::lock_guard<std::mutex> lock(mu_);
  if (slot >= clients_.size() || !clients_[slot].attached) return;
  clients_[slot].connected = false;
  if (clients_[slot].local && LocalPidDead(clients_[slot].pid)) ReclaimClient(slot, "process exited");
}

void Master::CheckClients() {
  uint64_t now = NowNs();
  uint64_t ttl = config_.client_ttl_s * kNsPerSec;
  for (uint32_t i = 0; i < clients_.size(); ++i) {
    ClientInfo& c = clients_[i];
    if (!c.attached) continue;
    if (c.local && LocalPidDead(c.pid)) {
      ReclaimClient(i, "process exited");
      continue;
    }
    ClientSlot* cs = pool_->client_slot(i);
    ObserveRange(&cs->heartbeat_ns, kCacheLine);
    uint64_t hb = cs->heartbeat_ns.load(std::memory_order_relaxed);
    if (cs->heartbeat_generation.load(std::memory_order_relaxed) != c.generation) hb = 0;
    uint64_t last = std::max(hb, c.attach_ns);
    if (now > last && now - last > ttl) ReclaimClient(i, "heartbeat expired");
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
