// The master's entry points: opening (format or recover) a pool, adopting a
// replaced device, dispatching a decoded request (TCP or ring), the periodic
// Tick, statistics, and the index lookups every part shares. The other
// parts by concern: master_impl.h.
//
// Atomics follow the three rules stated in master_impl.h.
#include "master_impl.h"

#include <cstdarg>

#include <sys/stat.h>

#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cstring>

#include "mooncake_cxl/common/access.h"
#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/pool/key_hash.h"
#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/pool/object_header.h"
#include "mooncake_cxl/pool/publish.h"
#include "mooncake_cxl/control/shm_ring.h"

namespace mcxl {

std::string StatusReply(ErrorCode status) {
  Encoder e;
  EncodeStatus(status, &e);
  return e.data();
}

Result<std::unique_ptr<Master>> Master::Create(const MasterConfig& config, std::unique_ptr<Pool> premapped,
                                               std::unique_ptr<WarmScan> warm) {
  auto m = std::make_unique<MasterImpl>(config);
  Status s = m->Open(std::move(premapped), std::move(warm));
  if (!s.ok()) return s.error();
  return std::unique_ptr<Master>(std::move(m));
}

MasterImpl::~MasterImpl() {
  populator_.Stop();  // before the pools it reads go
  if (tier_) tier_->Stop();  // its thread calls back into us
}

Status MasterImpl::Open(std::unique_ptr<Pool> premapped, std::unique_ptr<WarmScan> warm) {
  if (premapped) warm_ = std::move(warm);  // describes that pool only
  machine_ = ThisMachine();
  if (!config_.enable_cxl)
    MCXL_LOG(kWarn, "master", "--enable_cxl=false: this master always serves a CXL pool; using %s",
             config_.cxl_path.c_str());
  if (config_.announce_channels > kMaxAnnounceChannels) {
    MCXL_LOG(kError, "master", "--announce_channels must be 0..%u, got %llu", kMaxAnnounceChannels,
             (unsigned long long)config_.announce_channels);
    return ErrorCode::INVALID_PARAMS;
  }
  if (config_.client_slots == 0 || config_.client_slots > 4096) {
    MCXL_LOG(kError, "master", "--client_slots must be 1..4096, got %llu",
             (unsigned long long)config_.client_slots);
    return ErrorCode::INVALID_PARAMS;
  }
  if (!(config_.index_high_watermark_ratio >= 0.1 && config_.index_high_watermark_ratio <= 0.95)) {
    MCXL_LOG(kError, "master", "--index_high_watermark_ratio must be 0.1..0.95, got %g",
             config_.index_high_watermark_ratio);
    return ErrorCode::INVALID_PARAMS;
  }
  PoolFileOptions file;
  file.group = config_.pool_group;
  // Mooncake's master starts before its CXL device exists (its CXL test
  // creates the pool file after the master is up, at the --cxl_size the
  // master was given): a missing path with a size is created as --format
  // would (0600, or 0660 for --pool_group), not a failed start.
  bool create = config_.format;
  struct stat missing {};
  if (!create && config_.cxl_size != 0 && !config_.cxl_path.empty() &&
      stat(config_.cxl_path.c_str(), &missing) != 0 && errno == ENOENT) {
    MCXL_LOG(kWarn, "master", "pool %s does not exist: creating it as a %llu-byte file (--cxl_size); a device "
             "that appears there later replaces it", config_.cxl_path.c_str(), (unsigned long long)config_.cxl_size);
    create = true;
  }
  if (premapped) {
    pool_ = std::move(premapped);
  } else {
    auto pool = Pool::Open(config_.cxl_path, config_.cxl_size, create, file);
    if (!pool) return pool.error();
    pool_ = std::move(pool.value());
  }
  bool fresh = config_.format || !pool_->IsFormatted();
  if (fresh && config_.ha_term != 0 && pool_->IsFormatted() && pool_->Verify(nullptr).ok() &&
      pool_->superblock()->master_term.load(std::memory_order_relaxed) != 0) {
    // An elected master that takes over must not erase what its predecessor served.
    MCXL_LOG(kWarn, "ha", "--format ignored: pool %s was already served by an elected master; recovering it",
             config_.cxl_path.c_str());
    fresh = false;
  }
  if (fresh) warm_.reset();  // stops its scan before Format rewrites what it reads
  if (fresh) {
    FormatOptions fo;
    fo.index_capacity = config_.index_capacity;
    fo.client_slots = uint32_t(config_.client_slots);
    fo.announce_channels = uint32_t(config_.announce_channels);
    if (config_.coherence != "coherent" && config_.coherence != "noncoherent") {
      MCXL_LOG(kError, "master", "--coherence must be coherent or noncoherent, not '%s'", config_.coherence.c_str());
      return ErrorCode::INVALID_PARAMS;
    }
    fo.coherence = config_.coherence == "noncoherent" ? CoherenceMode::kNonCoherent : CoherenceMode::kCoherent;
    fo.allow_world_readable = config_.allow_world_readable_pool;
    Status s = pool_->Format(fo);
    if (!s.ok()) return s;
  } else {
    Status s = pool_->Verify(nullptr);
    if (!s.ok()) return s;
  }
  if (config_.ha_term != 0 && pool_->geometry().coherence == CoherenceMode::kNonCoherent) {
    // The leaders' fence (master_writing against master_term) is a
    // store->load pair across hosts, which needs coherence.
    MCXL_LOG(kError, "ha", "--enable_ha on the non-coherent pool %s refused: the fence between an old and a new "
             "leader needs cross-host coherence (docs/architecture.md section 7); run a single master there",
             config_.cxl_path.c_str());
    return ErrorCode::INVALID_PARAMS;
  }
  std::string huge = pool_->TmpfsHugePolicy();
  if (huge == "never" || huge == "deny")
    MCXL_LOG(kInfo, "master", "pool %s is on a tmpfs with 4 KiB pages (huge=%s); mounted with huge=advise "
             "it would get 2 MiB pages (faster large and batch reads, ms client attach; README)",
             pool_->path().c_str(), huge.c_str());
  std::string why;
  if (!fresh && !PoolModeAcceptable(pool_->file_mode(), false, &why))
    MCXL_LOG(kWarn, "master", "pool %s: %s (chmod o-rw it)", pool_->path().c_str(), why.c_str());
  // Sized for any geometry, so that a replaced device never reallocates it
  // under the RingServer (which reads it without mu_).
  attached_bits_.reset(new std::atomic<uint64_t>[(kMaxClientSlots + 63) / 64]());
  if (config_.enable_offload) {  // before AdoptPool: the superblock publishes it
    auto tier = TierManager::Open(config_, this, UuidToString(pool_->superblock()->uuid));
    if (!tier) return tier.error();
    tier_ = std::move(tier.value());
  }
  AdoptPool(std::move(pool_), fresh);
  // Off the start path: a put reaching a page first faults it in itself.
  if (config_.prefault_pool)
    populator_.Start(pool_.get(), PopulatePlan(*pool_, true), "master", PopulateMode::kAllocate,
                     BusySinceLastPoll(&requests_seen_),
                     [this] { return alloc_frontier_.load(std::memory_order_relaxed); });  // relaxed: a hint
  if (tier_) {
    std::lock_guard<FencedMutex> lock(mu_);
    tier_->Recover(fresh);
    tier_->Start();
  }
  return ErrorCode::OK;
}

void MasterImpl::AdoptPool(std::unique_ptr<Pool> pool, bool fresh) {
  if (pool_ && pool_.get() != pool.get()) {
    // The device behind our path was replaced (CheckReplacedDevice). The old
    // mapping stays for a grace period: the RingServer may be reading it
    // this moment. Its clients see a new incarnation and no heartbeat, so
    // their next request fails over to Attach, which refuses their token.
    Superblock* old = pool_->superblock();
    old->master_incarnation.fetch_add(1, std::memory_order_release);
    old->master_heartbeat_ns.store(0, std::memory_order_relaxed);
    PublishRange(&old->master_incarnation, kCacheLine);
    PublishRange(&old->master_heartbeat_ns, sizeof(uint64_t));
    ReplacedPool r;
    memcpy(r.token, token_, sizeof(r.token));
    r.uuid = pool_->UuidString();
    r.since_mono_ns = MonoNs();
    std::array<uint8_t, 16> tok;
    memcpy(tok.data(), token_, 16);
    if (replaced_tokens_.size() >= 16) replaced_tokens_.erase(replaced_tokens_.begin());
    replaced_tokens_.emplace_back(r.uuid, tok);
    index_.reset();
    r.pool = std::move(pool_);
    replaced_.push_back(std::move(r));
    for (uint32_t i = 0; i < clients_.size(); ++i) SetAttached(i, false);
    pending_.clear();
    deferred_.clear();
    pinned_.clear();
    quarantine_.clear();
    group_of_.clear();
    groups_.clear();
    if (tier_) tier_->ForgetPool();
    live_entries_ = 0;
    round_blocked_transiently_ = false;
    MasterStats keep = stats_;
    stats_ = MasterStats{};
    stats_.put_requests = keep.put_requests, stats_.put_failures = keep.put_failures;
    stats_.remove_requests = keep.remove_requests, stats_.remove_failures = keep.remove_failures;
    stats_.refused_requests = keep.refused_requests;
    stats_.pool_replacements = keep.pool_replacements + 1;
    ++pool_epoch_;
  }
  Superblock* adopted = pool->superblock();
  if (config_.ha_term != 0 && mu_.term() == 0) {
    // Elected: fence off the previous leader before the first structural write.
    uint64_t prev_pid = adopted->master_pid.load(std::memory_order_relaxed);
    bool prev_local = adopted->master_machine_hash.load(std::memory_order_relaxed) == KeyHash(machine_);
    uint64_t term = FencedMutex::TakeTerm(adopted, config_.ha_term, prev_pid, prev_local, kHaRemoteBatchWaitNs);
    mu_.Arm(adopted, term, config_.ha_lease_deadline);
    MCXL_LOG(kInfo, "ha", "term %llu written into pool %s", (unsigned long long)term, pool->path().c_str());
  } else if (mu_.term() != 0) {
    // A replaced device, formatted under mu_ (held): it carries our term from now on.
    adopted->master_term.store(mu_.term(), std::memory_order_seq_cst);
    PublishRange(&adopted->master_term, sizeof(uint64_t));
    mu_.Arm(adopted, mu_.term(), config_.ha_lease_deadline);
  }
  pool_ = std::move(pool);
  struct stat st {};
  if (fstat(pool_->fd(), &st) == 0) pool_dev_ = uint64_t(st.st_dev), pool_ino_ = uint64_t(st.st_ino);
  Superblock* sb = pool_->superblock();
  memcpy(token_, sb->auth_token, sizeof(token_));  // read-only after Format
  const PoolGeometry& geo = pool_->geometry();  // verified; the shared words may change later
  SetCoherenceMode(geo.coherence);
  if (geo.coherence == CoherenceMode::kNonCoherent)
    MCXL_LOG(kInfo, "master", "pool %s is non-coherent: the master publishes puts and applies leases for its "
             "clients, rings are polled", pool_->path().c_str());
  index_ = std::make_unique<ObjectIndex>(pool_.get());
  index_->EnableShadow();  // before Recover: its tombstones keep it exact
  alloc_ = std::make_unique<ExtentAllocator>(geo.data_offset, geo.data_size, 2 * geo.index_capacity + 2);
  entry_meta_.assign(geo.index_capacity, EntryMeta{});
  clients_.assign(geo.client_slot_count, ClientInfo{});
  retired_.assign(geo.client_slot_count, RetiredPins{});
  channels_.assign(geo.announce_channels, ChannelState{});
  slot_holds_.assign(geo.client_slot_count, {});
  recovered_holds_.clear();
  channel_of_.clear();
  pin_tables_.assign((geo.client_slot_count + 63) / 64, 0);
  stats_.capacity_bytes = alloc_->capacity();
  // Relaxed stores + one publish: readers only use these as hints.
  sb->lease_ttl_ns.store(config_.default_kv_lease_ttl_ms * 1000000ull, std::memory_order_relaxed);
  sb->master_pid.store(uint64_t(getpid()), std::memory_order_relaxed);
  sb->master_machine_hash.store(KeyHash(machine_), std::memory_order_relaxed);
  sb->master_heartbeat_ns.store(NowNs(), std::memory_order_relaxed);
  TierManager::PublishConfig(tier_.get(), config_, sb);
  uint64_t inc = sb->master_incarnation.load(std::memory_order_relaxed) + 1;
  sb->master_incarnation.store(inc, std::memory_order_release);
  PublishRange(&sb->master_incarnation, kCacheLine);
  if (!fresh) Recover();
  MCXL_LOG(kInfo, "master", "pool %s uuid %s incarnation %llu: %llu objects, %llu/%llu bytes used",
           pool_->path().c_str(), pool_->UuidString().c_str(), (unsigned long long)inc,
           (unsigned long long)stats_.complete_keys, (unsigned long long)alloc_->used_bytes(),
           (unsigned long long)alloc_->capacity());
  slot_count_.store(geo.client_slot_count, std::memory_order_release);
  // Release: pairs with pool()'s acquire; the Pool is immutable once shared.
  pool_view_.store(pool_.get(), std::memory_order_release);
}

void MasterImpl::LogReplacementOnce(uint64_t dev, uint64_t ino, int reason, bool error, const char* fmt, ...) {
  if (skipped_dev_ == dev && skipped_ino_ == ino && skipped_reason_ == reason) return;
  skipped_dev_ = dev, skipped_ino_ = ino, skipped_reason_ = reason;
  char line[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  if (error) MCXL_LOG(kError, "master", "%s", line);
  else MCXL_LOG(kInfo, "master", "%s", line);
}

void MasterImpl::CheckReplacedDevice() {
  // Called WITHOUT mu_ (Ping, Attach, Tick): the format of a new device is
  // long work; only the swap (AdoptPool) takes mu_. replace_mu_ makes one
  // caller do it while the others wait (a Ping that waits gets the new pool).
  std::lock_guard<std::mutex> guard(replace_mu_);
  struct stat st {};
  const std::string& path = config_.cxl_path;
  if (stat(path.c_str(), &st) != 0) {
    // Deleted (Mooncake's CXL test does it between its test classes): the
    // old mapping is still ours; wait for a new device at the path.
    LogReplacementOnce(0, 0, 1, false, "pool %s: the path no longer exists (%s); still serving the old pool "
                       "until a new device appears there", path.c_str(), strerror(errno));
    return;
  }
  uint64_t dev = uint64_t(st.st_dev), ino = uint64_t(st.st_ino);
  uint64_t cur_dev, cur_ino;
  {
    std::lock_guard<FencedMutex> lock(mu_);
    if (pool_lost_) return;
    cur_dev = pool_dev_, cur_ino = pool_ino_;
  }
  if (dev == cur_dev && ino == cur_ino) return;  // the same device (a shrink is CheckSize's)
  uint64_t need = std::max<uint64_t>(kMinPoolSize, config_.cxl_size);
  if (S_ISREG(st.st_mode) && uint64_t(st.st_size) < need) {
    LogReplacementOnce(dev, ino, 2, false, "pool %s was replaced by a new file of %llu bytes; waiting for it to "
                       "hold %llu bytes before formatting it", path.c_str(), (unsigned long long)st.st_size,
                       (unsigned long long)need);
    return;
  }
  auto opened = Pool::Open(path, config_.cxl_size, false);
  if (!opened) {
    LogReplacementOnce(dev, ino, 3, true, "pool %s was replaced, but the new device cannot be opened (%s); still "
                       "serving the old pool", path.c_str(), ErrorCodeName(opened.error()));
    return;
  }
  std::unique_ptr<Pool> fresh = std::move(opened.value());
  if (fstat(fresh->fd(), &st) == 0) dev = uint64_t(st.st_dev), ino = uint64_t(st.st_ino);  // what we opened
  if (fresh->IsFormatted()) {
    // Never format over a pool: it may be another master's.
    const Superblock* sb = fresh->superblock();
    LogReplacementOnce(dev, ino, 4, true, "POOL DEVICE REPLACED: %s now holds another pool's superblock (uuid %s); "
                       "refusing to format or serve it; still serving pool %s. Remove it, or restart the master "
                       "on it", path.c_str(), UuidToString(sb->uuid).c_str(), pool().UuidString().c_str());
    return;
  }
  std::string why;
  if (!PoolModeAcceptable(fresh->file_mode(), config_.allow_world_readable_pool, &why)) {
    LogReplacementOnce(dev, ino, 5, true, "POOL DEVICE REPLACED: %s is a new blank device, but %s: not formatted "
                       "(chmod o-rw it, or run the master with --allow_world_readable_pool); still serving the "
                       "old pool", path.c_str(), why.c_str());
    return;
  }
  FormatOptions fo;
  fo.index_capacity = config_.index_capacity;
  fo.client_slots = uint32_t(config_.client_slots);
  fo.announce_channels = uint32_t(config_.announce_channels);
  fo.coherence = config_.coherence == "noncoherent" ? CoherenceMode::kNonCoherent : CoherenceMode::kCoherent;
  fo.allow_world_readable = config_.allow_world_readable_pool;
  Status f = fresh->Format(fo);
  if (!f.ok()) {
    LogReplacementOnce(dev, ino, 6, true, "POOL DEVICE REPLACED: formatting the new device at %s failed (%s); still "
                       "serving the old pool", path.c_str(), ErrorCodeName(f.error()));
    return;
  }
  populator_.Stop();  // it names the old pool, which AdoptPool retires
  const Pool* adopted = fresh.get();
  std::lock_guard<FencedMutex> lock(mu_);
  if (pool_lost_) return;
  std::string old_uuid = pool_->UuidString();
  AdoptPool(std::move(fresh), true);
  alloc_frontier_.store(0, std::memory_order_relaxed);  // an offset of the old pool
  if (config_.prefault_pool)
    populator_.Start(adopted, PopulatePlan(*adopted, true), "master", PopulateMode::kAllocate,
                     BusySinceLastPoll(&requests_seen_),
                     [this] { return alloc_frontier_.load(std::memory_order_relaxed); });  // relaxed: a hint
  MCXL_LOG(kError, "master", "POOL DEVICE REPLACED: %s is a new device (inode %llu -> %llu); formatted it as pool "
           "%s with a new token. Pool %s and its objects are gone; its clients must setup() again",
           path.c_str(), (unsigned long long)cur_ino, (unsigned long long)ino, pool_->UuidString().c_str(),
           old_uuid.c_str());
}

void MasterImpl::ReleaseReplacedPools(uint64_t now_mono) {
  size_t keep = 0;
  for (auto& r : replaced_) {
    if (now_mono - r.since_mono_ns < kReplacedPoolGraceNs) replaced_[keep++] = std::move(r);
  }
  replaced_.resize(keep);
}

const ObjectHeader* MasterImpl::HeaderOf(uint64_t entry_slot) const {
  const EntryMeta& m = entry_meta_[entry_slot];
  Extent ext;
  if (!m.live || !alloc_->Lookup(m.extent, &ext)) return nullptr;
  return pool_->At<const ObjectHeader>(ext.offset);
}

std::string_view MasterImpl::KeyOf(uint64_t entry_slot) const {
  // The key length is ours and the extent holds header + key (we sized it).
  const ObjectHeader* h = HeaderOf(entry_slot);
  if (h == nullptr) return {};
  return std::string_view(reinterpret_cast<const char*>(h + 1), entry_meta_[entry_slot].key_len);
}

bool MasterImpl::CheckedLive(uint64_t slot) const {
  const EntryMeta& m = entry_meta_[slot];
  if (m.quarantined) return false;
  const IndexEntry& e = index_->entry(slot);
  const char* why = nullptr;
  Extent ext;
  uint64_t off = e.object_offset.load(std::memory_order_relaxed);
  uint64_t value_size = e.value_size.load(std::memory_order_relaxed);
  if (!m.live || !alloc_->Lookup(m.extent, &ext)) {
    why = "no object of the master's is recorded there";
  } else if (off != ext.offset) {
    why = "its object_offset is not the extent the master allocated";
  } else if (!in_segment_.empty() && in_segment_.count(slot) != 0
                 ? !SegmentEntryFits(slot, value_size, ext.size, m.key_len) ||
                       StateOf(e.state_gen.load(std::memory_order_relaxed)) == EntryState::kComplete
             : StateOf(e.state_gen.load(std::memory_order_relaxed)) == EntryState::kOnDisk
                 ? value_size == 0 || ExtentBytes(m.key_len, sizeof(DiskStub)) > ext.size
                 : value_size == 0 || value_size > ext.size || ExtentBytes(m.key_len, value_size) > ext.size ||
                       StateOf(e.state_gen.load(std::memory_order_relaxed)) == EntryState::kInSegment) {
    why = "its value_size does not fit the extent the master allocated";
  } else {
    const ObjectHeader* h = pool_->At<const ObjectHeader>(ext.offset);
    ObserveRange(h, sizeof(ObjectHeader));
    if (h->magic != kObjectMagic || h->key_len != m.key_len ||
        h->key_hash != e.key_hash.load(std::memory_order_relaxed) || h->value_size != value_size)
      why = "its object header was overwritten";
  }
  if (why == nullptr) return true;
  m.quarantined = true;
  quarantine_.push_back(slot);
  ++corrupt_entries_;
  MCXL_LOG(kError, "master", "index entry %llu is corrupt (%s: object_offset %llu, value_size %llu); "
           "skipped and reclaimed", (unsigned long long)slot, why, (unsigned long long)off,
           (unsigned long long)value_size);
  return false;
}

void MasterImpl::ReclaimCorrupt() {
  std::vector<uint64_t> slots;
  slots.swap(quarantine_);
  for (uint64_t s : slots) {
    EntryMeta& m = entry_meta_[s];
    if (!m.quarantined) continue;  // the slot was reused since (a new EntryMeta)
    m.quarantined = false;
    uint64_t sg = index_->entry(s).state_gen.load(std::memory_order_acquire);
    EntryState st = StateOf(sg);
    bool linked = st != EntryState::kEmpty && st != EntryState::kTombstone;
    if (!m.live) {
      if (linked) index_->Tombstone(s);  // not ours at all: nothing to free
      continue;
    }
    // Ours: unlink as a remove would (pins respected); the extent freed is
    // the one our handle names, never one the entry claims. A pending put of
    // it finds the entry gone and is dropped. A writer may still be copying
    // into a WRITING one: revoke it and free only after the release timeout.
    if (st == EntryState::kWriting && index_->Abort(s, GenOf(sg)))
      Unlink(s, false, MonoNs() + config_.put_start_release_timeout_sec * kNsPerSec);
    else
      Unlink(s, true, 0);
  }
}

void MasterImpl::FindLive(std::string_view key, uint64_t hash, std::vector<uint64_t>* out) const {
  // The shadow names the slots the master filed under `hash`: no walk over
  // the pool's tombstones. Each is checked in the pool as a probe would.
  index_->ShadowSlots(hash, &find_candidates_);
  out->clear();
  for (uint64_t slot : find_candidates_) {
    const IndexEntry& e = index_->entry(slot);
    // Acquire: a client's COMPLETE CAS published the value before it.
    EntryState st = StateOf(e.state_gen.load(std::memory_order_acquire));
    if (st != EntryState::kWriting && !Readable(st)) continue;
    if (e.key_hash.load(std::memory_order_relaxed) != hash) continue;
    if (CheckedLive(slot) && KeyOf(slot) == key) out->push_back(slot);
  }
}

bool MasterImpl::PoolLost() {
  if (pool_lost_) return true;
  if (pool_->CheckSize() && !pool_->failed()) return false;
  pool_lost_ = true;
  stats_.pool_lost = true;
  MCXL_LOG(kError, "master", "pool device shrank from %llu to %llu bytes: the master stops serving %s%s",
           (unsigned long long)pool_->size(), (unsigned long long)pool_->DeviceSize(), pool_->path().c_str(),
           config_.exit_on_pool_loss ? " and exits" : "; every request is refused");
  if (config_.exit_on_pool_loss) {
    fflush(stdout);
    fflush(stderr);
    _exit(kPoolLostExitCode);
  }
  return true;
}

std::string MasterImpl::Handle(uint16_t type, std::string_view payload, uint32_t* conn_slot) {
  requests_seen_.Note();
  // A client about to map the pool by its path: serve what is there now.
  if (type == uint16_t(MessageType::kPing) || type == uint16_t(MessageType::kAttach)) CheckReplacedDevice();
  if (RunsInSlices(type)) {
    std::string refusal;
    {
      std::lock_guard<FencedMutex> lock(mu_);
      if (!Admit(type, payload, *conn_slot, &refusal)) {
        CountOp(type, refusal);
        return refusal;
      }
    }
    std::string reply = HandleRemoveMatching(payload, type == uint16_t(MessageType::kRemoveAll));
    std::lock_guard<FencedMutex> lock(mu_);
    CountOp(type, reply);
    return reply;
  }
  std::lock_guard<FencedMutex> lock(mu_);
  if (pool_lost_) return StatusReply(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
  std::string reply = Dispatch(type, payload, conn_slot);
  CountOp(type, reply);
  return reply;
}

void MasterImpl::CountOp(uint16_t type, const std::string& reply) {
  if (type >= kMessageTypes) return;
  ++op_requests_[type];
  int32_t status = 0;
  if (reply.size() >= sizeof(status)) memcpy(&status, reply.data(), sizeof(status));
  if (status != 0) ++op_failures_[type];
}

void MasterImpl::ServeRing(uint32_t slot) {
  requests_seen_.Note();
  std::lock_guard<FencedMutex> lock(mu_);
  if (pool_lost_ || slot >= clients_.size() || !clients_[slot].attached) return;
  // Only the current attachment's requests are served (see shm_ring.h): a
  // reclaimed client that resumed may still push one into its old rings.
  const uint64_t gen = clients_[slot].generation;
  bool stale_logged = false;
  uint32_t ring_bytes = pool_->geometry().ring_bytes;
  ShmRing requests(pool_->ring(slot, 0), ring_bytes),
      replies(pool_->ring(slot, 1), ring_bytes, &clients_[slot].reply_tail);
  // Per thread and reused (only the ring thread serves rings): its capacity
  // outlives the call, so a request costs no allocation here.
  thread_local std::string frame;
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
      // Tagged for the current attachment when the id is unreadable, so that
      // its client drops the reply as a late one.
      uint64_t id = ok && RingRequestOf(h.request_id, gen) ? h.request_id : RingRequestId(gen, 0);
      (void)replies.Push(MakeFrame(MessageType::kError, id, e.data()));
      replies.WakeConsumer();
      continue;
    }
    if (!RingRequestOf(h.request_id, gen)) {
      // No reply: the reply ring is the current client's, and the sender
      // notices its lost slot by itself.
      if (!stale_logged)
        MCXL_LOG(kWarn, "ring", "request ring of client slot %u holds a %s request of an earlier "
                 "attachment of the slot; dropped", slot, MessageTypeName(h.type));
      stale_logged = true;
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
    if (RunsInSlices(h.type)) {
      // A whole-index scan would stall every ring client behind it (one
      // ring thread): NOT_SUPPORTED makes the client send it over TCP.
      Encoder e;
      EncodeStatus(ErrorCode::NOT_SUPPORTED, &e);
      (void)replies.Push(MakeFrame(MessageType::kError, h.request_id, e.data()));
      replies.WakeConsumer();
      continue;
    }
    std::string_view payload = std::string_view(frame).substr(sizeof(h));
    if (sizeof(FrameHeader) + ReplyBytesBound(h.type, payload) > replies.max_frame()) {
      // Its reply could not be pushed: refused before any work, and the
      // client (which checks this before sending) retries over TCP.
      MCXL_LOG(kWarn, "ring", "client slot %u sent a %s whose reply (up to %llu bytes) exceeds a ring record "
               "(%llu bytes); refused with NOT_SUPPORTED (send it over TCP)", slot, MessageTypeName(h.type),
               (unsigned long long)ReplyBytesBound(h.type, payload), (unsigned long long)replies.max_frame());
      Encoder e;
      EncodeStatus(ErrorCode::NOT_SUPPORTED, &e);
      (void)replies.Push(MakeFrame(MessageType::kError, h.request_id, e.data()));
      replies.WakeConsumer();
      continue;
    }
    uint32_t conn_slot = slot;
    std::string reply = Dispatch(h.type, payload, &conn_slot);
    CountOp(h.type, reply);
    FrameHeader rh{kFrameMagic, kProtocolVersion, h.type, uint32_t(reply.size()), 0, h.request_id};
    if (!replies.Push(&rh, sizeof(rh), reply))  // header + body: no joined copy
      MCXL_LOG(kWarn, "ring", "reply ring of client slot %u is full (client stuck?); reply dropped", slot);
    replies.WakeConsumer();
  }
}

std::string MasterImpl::Dispatch(uint16_t type, std::string_view payload, uint32_t* conn_slot) {
  Decoder d(payload);
  std::string refusal;
  if (!Admit(type, payload, *conn_slot, &refusal)) return refusal;
  switch (MessageType(type)) {
    case MessageType::kPing: {  // the bootstrap: no credential needed
      const Superblock* sb = pool_->superblock();
      PingReply r;
      r.incarnation = sb->master_incarnation.load(std::memory_order_relaxed);
      r.pool_path = pool_->path();
      r.pool_size = sb->pool_size;
      memcpy(r.uuid, sb->uuid, 16);
      Encoder e;
      Encode(r, &e);
      return e.data();
    }
    case MessageType::kAttach: return HandleAttach(&d, conn_slot);
    case MessageType::kDetach: return HandleDetach(&d, conn_slot);
    case MessageType::kHeartbeat: return HandleHeartbeat(&d);
    case MessageType::kPutStart: return HandlePutStart(&d);
    case MessageType::kRemove: return HandleRemove(&d, false);
    case MessageType::kBatchRemove: return HandleRemove(&d, true);
    case MessageType::kPromote: return HandlePromote(&d);
    case MessageType::kSettle: return HandleSettle(&d);
    case MessageType::kAnnounceOpen: return HandleAnnounceOpen(&d);
    case MessageType::kAnnounceClose: return HandleAnnounceClose(&d);
    case MessageType::kLocate: return HandleLocate(&d);
    case MessageType::kPublish: return HandlePublish(&d);
    case MessageType::kLeases: return HandleLeases(&d);
    case MessageType::kSegmentSession: return HandleSegmentSession(&d);
    case MessageType::kRemoveByRegex:
    case MessageType::kRemoveAll: return StatusReply(ErrorCode::NOT_SUPPORTED);  // Handle: in slices
    default:
      MCXL_LOG(kWarn, "master", "request of unknown type %u (%zu bytes) rejected", type, payload.size());
      return StatusReply(ErrorCode::INVALID_PARAMS);
  }
}

uint64_t MasterImpl::Tick() {
  {
    uint64_t t = MonoNs();
    // Relaxed: a rate limit; two threads checking at once is harmless.
    if (t - last_replace_check_mono_.load(std::memory_order_relaxed) > kClientCheckIntervalNs) {
      last_replace_check_mono_.store(t, std::memory_order_relaxed);
      CheckReplacedDevice();
    }
  }
  std::lock_guard<FencedMutex> lock(mu_);
  uint64_t now = MonoNs();
  if (!replaced_.empty()) ReleaseReplacedPools(now);
  if (pool_lost_) return 100;
  if (now - last_size_check_mono_ > kClientCheckIntervalNs || pool_->failed()) {
    last_size_check_mono_ = now;
    if (PoolLost()) return 100;  // before touching the pool again
  }
  Superblock* sb = pool_->superblock();
  sb->master_heartbeat_ns.store(NowNs(), std::memory_order_relaxed);  // a hint only
  PublishRange(&sb->master_heartbeat_ns, sizeof(uint64_t));
  if (!quarantine_.empty()) ReclaimCorrupt();
  if (index_->RestoreMaxProbe()) {
    ++corrupt_entries_;
    MCXL_LOG(kError, "master", "the superblock's max_probe was overwritten; restored to %llu",
             (unsigned long long)index_->max_probe());
  }
  if (!pending_.empty() || !deferred_.empty()) CheckPending();
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

MasterStats MasterImpl::stats() const {
  std::lock_guard<FencedMutex> lock(mu_);
  MasterStats s = stats_;
  s.corrupt_entries = corrupt_entries_;
  s.pending_puts = pending_.size();
  s.allocated_bytes = alloc_->used_bytes();
  s.index_live_entries = live_entries_;
  s.attached_clients = 0;
  for (const auto& c : clients_) s.attached_clients += c.attached ? 1 : 0;
  if (tier_) tier_->FillStats(&s);
  DiskReads reads = DiskReadCounts();
  s.disk_hits = reads.hits;
  s.disk_checksum_failures = reads.bad;
  return s;
}

}  // namespace mcxl
