// Reads of objects whose value lives in the SSD tier (EntryState::kOnDisk,
// tier_manager.h). Contract: the entry is found one-sidedly as any other;
// its stub (DiskStub) is copied and the entry re-checked; then the client
// reads the record itself (tier::ReadRecord verifies key, length,
// generation, crc32c) when it can open the tier's directory, else it asks
// the master to stage the object into the pool and reads it from there. A
// record that fails its checks while the entry still names it is a miss
// (ReadRecord's log line, this slot's disk_checksum_failures), never bytes.
// An entry that changed meanwhile (promotion, compaction, removal) fails
// the re-check: the caller locates it again.
//
// Atomics: as stated at the top of client.cc; the tier counters in the slot
// are statistics (relaxed).
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/client/client.h"
#include "mooncake_cxl/tier/disk_tier.h"
#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/pool/publish.h"
#include "client_internal.h"

namespace mcxl {
namespace {
constexpr uint64_t kStageWaitNs = 20ull * 1000000000ull;  // a promotion at the watermark waits for demotions
}

std::shared_ptr<const Client::TierView> Client::Tier() const {
  std::lock_guard<std::mutex> l(tier_mu_);
  return tier_view_;
}

std::string Client::tier_root() const {
  auto t = Tier();
  return t ? t->root : std::string();
}

bool Client::tier_direct() const {
  auto t = Tier();
  return t && t->direct;
}

void Client::LoadTier() {
  auto v = std::make_shared<TierView>();
  Superblock* sb = pool_->superblock();
  ObserveRange(&sb->tier_config, sizeof(uint64_t) + sizeof(sb->tier_root));
  // Relaxed: written before the incarnation the Attach reply named.
  uint64_t cfg = sb->tier_config.load(std::memory_order_relaxed);
  if (cfg & kTierEnabled) {
    v->root.assign(sb->tier_root, strnlen(sb->tier_root, sizeof(sb->tier_root)));
    if (!options_.offload_path_override.empty()) v->root = options_.offload_path_override;
    v->promotion = (cfg & kTierPromotionOnHit) != 0;
    v->direct = options_.tier_direct_read && !v->root.empty() && access(v->root.c_str(), R_OK | X_OK) == 0;
    if (!v->direct)
      MCXL_LOG(kInfo, "client", "SSD tier at '%s': %s; disk-resident objects are staged into the pool by the master",
               v->root.c_str(), options_.tier_direct_read ? "not readable here" : "direct reads disabled");
  }
  std::lock_guard<std::mutex> l(tier_mu_);
  tier_view_ = std::move(v);
}

void Client::SendPromote(std::string_view key, uint64_t generation, bool stage) {
  (void)MasterCall(MessageType::kPromote, [&] {
    PromoteRequest req;
    req.client = Ref();
    req.key = std::string(key);
    req.generation = generation;
    req.stage = stage;
    Encoder e;
    Encode(req, &e);
    return e.data();
  }, true);
}

Status Client::StageAndWait(const EntrySnapshot& snap, std::string_view key) {
  SendPromote(key, snap.generation(), true);
  uint64_t deadline = MonoNs() + kStageWaitNs;
  for (int i = 0; MonoNs() < deadline; ++i) {
    if (!index_->StillValid(snap)) return ErrorCode::OK;  // promoted (or gone): locate again
    std::this_thread::sleep_for(std::chrono::microseconds(i < 20 ? 50 : 1000));
  }
  MCXL_LOG(kWarn, "client", "'%.*s' is in the SSD tier and was not staged into the pool within %llu s; a miss",
           int(key.size()), key.data(), (unsigned long long)(kStageWaitNs / 1000000000ull));
  return ErrorCode::OBJECT_NOT_FOUND;
}

Result<bool> Client::CopyFromDisk(const EntrySnapshot& snap, std::string_view key, const ReadDest& dest) {
  auto tier = Tier();
  const DiskStub* st = index_->StubPtr(snap, key);
  if (st == nullptr || !tier || tier->root.empty()) return false;  // stale geometry (or no tier): locate again
  ObserveRange(st, sizeof(DiskStub));
  DiskStub c;
  memcpy(static_cast<void*>(&c), st, offsetof(DiskStub, disk_reads));  // one copy; only it is used
  if (!index_->StillValid(snap)) return false;
  if (c.magic != kDiskStubMagic || c.value_len != snap.value_size || c.key_len != key.size() ||
      c.generation != snap.generation()) {
    MCXL_LOG(kError, "client", "the SSD-tier stub of '%.*s' is corrupt; a miss", int(key.size()), key.data());
    return ErrorCode::OBJECT_NOT_FOUND;
  }
  if (!tier->direct) {
    Status s = StageAndWait(snap, key);
    if (!s.ok()) return s.error();
    return false;  // now in the pool: locate again
  }
  tier::RecordLocation loc;
  loc.segment_id = c.segment_id;
  loc.offset = c.record_offset;
  loc.value_len = c.value_len;
  loc.crc32c = c.crc32c;
  loc.key_len = c.key_len;
  loc.generation = c.generation;
  // Straight into the first slice when it holds the whole value; else read
  // whole, then scatter (or copy the ranges).
  std::string tmp;
  bool direct = dest.ranges == nullptr && dest.nslices > 0 && dest.slices[0].size >= snap.value_size;
  void* dst = direct ? dest.slices[0].data : nullptr;
  if (!direct) {
    tmp.resize(snap.value_size);
    dst = tmp.data();
  }
  Status r = tier::ReadRecord(tier->root, loc, key, dst, snap.value_size);
  if (!r.ok()) {
    // Moved or removed meanwhile (compaction, promotion, removal): locate again.
    if (!index_->StillValid(snap) || r.error() == ErrorCode::FILE_NOT_FOUND) {
      if (r.error() == ErrorCode::FILE_NOT_FOUND && index_->StillValid(snap))
        std::this_thread::sleep_for(std::chrono::microseconds(200));  // the relocation lands shortly
      return false;
    }
    ClientSlot* cs = pool_->client_slot(slot_.load(std::memory_order_relaxed));
    cs->disk_checksum_failures.fetch_add(1, std::memory_order_relaxed);
    PublishRange(&cs->disk_checksum_failures, sizeof(uint64_t));
    MCXL_LOG(kError, "client", "record of '%.*s' in the SSD tier failed its checks (%s); a miss", int(key.size()),
             key.data(), ErrorCodeName(r.error()));
    return ErrorCode::OBJECT_NOT_FOUND;
  }
  if (!index_->StillValid(snap)) return false;
  if (!direct) CopyOut(tmp.data(), snap.value_size, dest);
  offload_reads_.fetch_add(1, std::memory_order_relaxed);
  ClientSlot* cs = pool_->client_slot(slot_.load(std::memory_order_relaxed));
  cs->disk_hits.fetch_add(1, std::memory_order_relaxed);
  PublishRange(&cs->disk_hits, sizeof(uint64_t));
  if (tier->promotion) SendPromote(key, snap.generation(), false);  // counted toward admission
  return true;
}

}  // namespace mcxl
