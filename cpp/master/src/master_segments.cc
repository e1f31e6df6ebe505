// DRAM segments as the master sees them: a client's memory beside the pool,
// one more place a value can live (docs/architecture.md §10).
//
// Contract: an Attach names the segment's size (and the Transfer Engine
// session serving it); the master keeps an ExtentAllocator of its bytes in
// its own memory and never dereferences the segment. A put placed there gets
// a stub extent in the pool (ObjectHeader | key | SegmentStub) whose entry
// the owner publishes kInSegment; Unlink frees both. Before a slot is
// reused (reclaim, detach, a new attachment) every object of its segment is
// unlinked, so a reader meets a bumped version or a stub naming an ended
// generation: a miss, never another object's bytes. Another in-pod reader
// asks kSegmentSession for the owner's TE session and segment size (per
// attachment: both fixed from its Attach to its end). Only the owner writes
// its segment: a preferred_segment naming another client's goes to the pool.
// (Writes by others were tried and taken out: a peer stalled mid-write and
// revoked could land its bytes after the owner was reclaimed and re-attached
// over the same memory, tearing the owner's new objects; the randomized
// fault test caught it. It needs the revoked range kept out of the next
// attachment's allocator first.)
//
// Atomics follow the three rules stated in master_impl.h.
#include "master_impl.h"

#include <algorithm>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/pool/publish.h"
#include "prom_writer.h"

namespace mcxl {

namespace {
// A segment larger than this is refused at Attach (the allocator's arrays
// are sized from it).
constexpr uint64_t kMaxSegmentBytes = 1ull << 40;
constexpr uint64_t kMaxSegmentSession = 256;
}  // namespace

bool MasterImpl::AdoptSegment(ClientInfo* c, uint32_t slot, const AttachRequest& req) {
  c->hostname = req.local_hostname;
  if (req.segment_size == 0) return true;
  if (pool_->geometry().coherence == CoherenceMode::kNonCoherent) {
    // Stage 1: the master publishes a non-coherent pool's puts itself, as
    // kComplete; a segment put would need kInSegment (architecture.md §10).
    MCXL_LOG(kWarn, "master", "client %.64s (slot %u): DRAM segment refused: the pool is non-coherent "
             "(segments need a coherent pool)", req.local_hostname.c_str(), slot);
    return false;
  }
  if (req.segment_size < kCacheLine || req.segment_size > kMaxSegmentBytes ||
      req.segment_session.size() > kMaxSegmentSession) {
    MCXL_LOG(kWarn, "master", "client %.64s (slot %u): DRAM segment of %llu bytes (session of %zu bytes) "
             "refused: 64 B .. 1 TiB, a session of at most %llu bytes", req.local_hostname.c_str(), slot,
             (unsigned long long)req.segment_size, req.segment_session.size(),
             (unsigned long long)kMaxSegmentSession);
    return false;
  }
  uint64_t size = req.segment_size / kCacheLine * kCacheLine;
  // One block per 4 KiB at most: objects are larger (KV-cache blocks).
  uint64_t blocks = std::min<uint64_t>(size / 4096 + 64, 1u << 22);
  c->segment_size = size;
  c->segment_session = req.segment_session;
  c->segment = std::make_shared<ExtentAllocator>(0, size, blocks);
  MCXL_LOG(kInfo, "master", "client %.64s (slot %u) contributes a DRAM segment of %llu bytes%s%s",
           req.local_hostname.c_str(), slot, (unsigned long long)size,
           req.segment_session.empty() ? "" : ", served at ", req.segment_session.c_str());
  return true;
}

std::string MasterImpl::HandleSegmentSession(Decoder* d) {
  SegmentSessionRequest req;
  SegmentSessionReply reply;
  if (!Decode(d, &req)) {
    MCXL_LOG(kWarn, "master", "malformed SegmentSession request rejected");
    reply.status = ErrorCode::INVALID_PARAMS;
  } else if (!ClientValid(req.client)) {
    reply.status = ErrorCode::ILLEGAL_CLIENT;
  } else if (!ClientValid(ClientRef{req.slot, req.generation}) || !clients_[req.slot].segment ||
             clients_[req.slot].segment_session.empty()) {
    reply.status = ErrorCode::OBJECT_NOT_FOUND;  // ended, or no segment served: a miss
  } else {
    reply.segment_size = clients_[req.slot].segment_size;
    reply.session = clients_[req.slot].segment_session;
  }
  Encoder e;
  Encode(reply, &e);
  return e.data();
}

uint32_t MasterImpl::PlaceInSegment(const PutStartRequest& req, uint64_t bytes, uint64_t pool_extent_bytes,
                                    Extent* ext) {
  uint32_t putter = req.client.slot;
  ClientInfo& own = clients_[putter];
  if (!own.segment) return kNoSlot;  // only the owner writes a segment
  bool wanted = false;
  if ((req.placement & kPlaceNamed) && !req.preferred_segment.empty()) {
    wanted = req.preferred_segment == own.hostname;
  } else if (req.placement & kPlaceSameNode) {
    wanted = true;
  } else {
    // Spill instead of evicting (or demoting to the SSD): the pool past the
    // point where eviction starts, ahead (watermark - ratio/2) or inline.
    double start = std::max(0.0, config_.eviction_high_watermark_ratio - config_.eviction_ratio / 2);
    uint64_t high = uint64_t(start * double(alloc_->capacity()));
    uint64_t used = alloc_->used_bytes();
    used -= std::min(used, EvictPendingBytes());
    wanted = used + pool_extent_bytes > high;
  }
  if (!wanted) return kNoSlot;
  return AllocateInSegment(putter, bytes, ext);
}

uint32_t MasterImpl::AllocateInSegment(uint32_t owner, uint64_t bytes, Extent* ext) {
  ExtentAllocator& seg = *clients_[owner].segment;
  auto got = seg.Allocate(bytes);
  if (!got && EvictFromSegment(owner, bytes) > 0) got = seg.Allocate(bytes);
  if (!got) return kNoSlot;  // full of what may not go: the pool (a preference, not a demand)
  *ext = *got;
  return owner;
}

uint64_t MasterImpl::EvictFromSegment(uint32_t owner, uint64_t bytes) {
  const ExtentAllocator& seg = *clients_[owner].segment;
  uint64_t now = NowNs(), ttl = config_.default_kv_lease_ttl_ms * 1000000ull;
  std::vector<SampledSlot> cands;  // (last access, slot), oldest first
  auto mine = segment_entries_of_.find(owner);
  if (mine == segment_entries_of_.end()) return 0;
  for (uint64_t s : mine->second) {
    const IndexEntry& e = index_->entry(s);
    // One look at the state; unfinished, hard-pinned, leased, soft-pinned
    // and grouped objects stay (a group goes whole, with pool members: not here).
    if (StateOf(e.state_gen.load(std::memory_order_acquire)) != EntryState::kInSegment) continue;
    if ((e.flags.load(std::memory_order_relaxed) & kFlagHardPin) || index_->LeaseUntil(s) > now ||
        SoftPinActive(s, now) || group_of_.count(s) != 0 || OlderUnfinished(s))
      continue;
    cands.push_back({LastAccessNs(s, ttl), s, e.state_gen.load(std::memory_order_relaxed)});
  }
  std::sort(cands.begin(), cands.end());
  uint64_t n = 0, freed = 0;
  for (const auto& c : cands) {
    if (seg.largest_free() >= bytes) break;
    // An earlier candidate's older values may have taken this one along.
    if (index_->entry(c.slot).state_gen.load(std::memory_order_acquire) != c.state_gen) continue;
    uint64_t size = index_->entry(c.slot).value_size.load(std::memory_order_relaxed);
    uint64_t gone = UnlinkWithOlder(c.slot, nullptr);
    if (gone == 0) continue;
    n += gone;
    freed += size;
  }
  stats_.evicted_keys += n;
  stats_.evicted_bytes += freed;
  if (n > 0)
    MCXL_LOG(kInfo, "master", "evict: %llu objects (%llu bytes) of the DRAM segment of client slot %u, for a put of "
             "%llu bytes", (unsigned long long)n, (unsigned long long)freed, owner, (unsigned long long)bytes);
  return n;
}

void MasterImpl::WriteSegmentStub(uint64_t stub_offset, uint64_t key_len, uint32_t owner, const Extent& ext) {
  auto* st = pool_->At<SegmentStub>(stub_offset + ObjectHeaderBytes(key_len));
  st->magic = kSegmentStubMagic;
  st->slot = owner;
  st->reserved = 0;
  st->slot_generation = clients_[owner].generation;
  st->offset = ext.offset;
  st->length = ext.size;
  PublishRange(st, sizeof(SegmentStub));  // before the entry that names it is inserted
}

void MasterImpl::RecordSegmentPlacement(uint64_t entry_slot, const SegmentPlacement& p) {
  ForgetSegmentPlacement(entry_slot);  // an earlier record of the slot is another object's
  in_segment_[entry_slot] = p;
  segment_entries_of_[p.owner].insert(entry_slot);
}

void MasterImpl::ForgetSegmentPlacement(uint64_t entry_slot) {
  auto it = in_segment_.find(entry_slot);
  if (it == in_segment_.end()) return;
  auto mine = segment_entries_of_.find(it->second.owner);
  if (mine != segment_entries_of_.end()) {
    mine->second.erase(entry_slot);
    if (mine->second.empty()) segment_entries_of_.erase(mine);
  }
  in_segment_.erase(it);
}

void MasterImpl::FreeSegmentExtent(uint64_t entry_slot) {
  auto it = in_segment_.find(entry_slot);
  if (it == in_segment_.end()) return;
  const SegmentPlacement& p = it->second;
  ClientInfo& c = clients_[p.owner];
  // A segment of an ended attachment is gone with its allocator.
  if (c.segment && c.generation == p.owner_generation) (void)c.segment->Free(p.handle);
  ForgetSegmentPlacement(entry_slot);
}

void MasterImpl::DropSegment(uint32_t slot, const char* why) {
  ClientInfo& c = clients_[slot];
  if (!c.segment) return;
  std::vector<uint64_t> doomed;  // a copy: unlinking forgets them one by one
  if (auto mine = segment_entries_of_.find(slot); mine != segment_entries_of_.end())
    doomed.assign(mine->second.begin(), mine->second.end());
  uint64_t gone = 0;
  for (uint64_t s : doomed) {
    EntryState st = StateOf(index_->entry(s).state_gen.load(std::memory_order_acquire));
    if (!entry_meta_[s].live) {
      ForgetSegmentPlacement(s);
      continue;
    }
    // A WRITING one is the owner's own put, revoked (it writes only its own
    // memory); a published one goes with the older values of its key, oldest
    // first, as every unlink does (none can be current once it is gone).
    if (st == EntryState::kWriting &&
        index_->Abort(s, GenOf(index_->entry(s).state_gen.load(std::memory_order_relaxed)))) {
      Unlink(s, true, 0);
      ++gone;
    } else if (StateOf(index_->entry(s).state_gen.load(std::memory_order_acquire)) == EntryState::kInSegment) {
      gone += UnlinkWithOlder(s, nullptr);
    }
    ForgetSegmentPlacement(s);
  }
  MCXL_LOG(kInfo, "master", "DRAM segment of client slot %u (%s) dropped: %llu objects are misses now", slot, why,
           (unsigned long long)gone);
  c.segment.reset();
  c.segment_size = 0;
}

bool MasterImpl::SegmentEntryFits(uint64_t slot, uint64_t value_size, uint64_t extent_size,
                                  uint32_t key_len) const {
  auto it = in_segment_.find(slot);
  if (it == in_segment_.end()) return false;
  const ClientInfo& c = clients_[it->second.owner];
  Extent seg;
  return c.segment && c.generation == it->second.owner_generation && c.segment->Lookup(it->second.handle, &seg) &&
         value_size != 0 && value_size <= seg.size && ExtentBytes(key_len, sizeof(SegmentStub)) <= extent_size;
}

void MasterImpl::WriteSegmentMetrics(PromWriter* w) const {
  w->Header("mooncake_cxl_segment_bytes", "gauge",
            "DRAM segments of attached clients: bytes (kind=capacity) and bytes in use (kind=used), by owner");
  for (const ClientInfo& c : clients_) {
    if (!c.attached || !c.segment) continue;
    std::string owner = "{segment=\"" + LabelEscape(c.hostname) + "\",kind=";
    w->Sample("mooncake_cxl_segment_bytes", (owner + "\"capacity\"}").c_str(), double(c.segment->capacity()));
    w->Sample("mooncake_cxl_segment_bytes", (owner + "\"used\"}").c_str(), double(c.segment->used_bytes()));
  }
  w->Metric("mooncake_cxl_segment_objects", "gauge", "Objects whose value is in a DRAM segment (or being put there)",
            in_segment_.size());
}

}  // namespace mcxl
