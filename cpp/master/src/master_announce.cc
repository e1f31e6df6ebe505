// Announcement channels as the master keeps them (announce.h). Contract:
//   * Names are the tenant's: kAnnounceOpen scopes the name as keys are
//     (tenant.h), so two tenants' "prefill-0" are two channels.
//   * Every open is a hold of the client's slot, counted here and mirrored
//     as a bit in the channel header (read back only after a restart). A
//     client holds at most --announce_channels_per_client at once.
//   * A channel is freed once nobody holds it and its producer closed or is
//     a process of this machine that exited (or of another host, whose slot
//     ended with it): kAnnounceClose, the slot's reclaim (exit, kill,
//     heartbeat, detach), and a sweep every 500 ms for producers that exit
//     later. A channel whose live local producer lost its slot stays named.
//   * A freed channel keeps its name and records until another name needs
//     it (never-named channels first, then the longest freed): a consumer
//     that opens it again meanwhile still reads what its producer said
//     before it died. Renaming wipes it (NameAnnounceChannel).
//   * After a restart the header bits say which slots held which channels:
//     those holds follow their process (pid and machine of the slot) to the
//     slot it re-attaches to, and end when it is known dead or after a
//     client ttl without it. Bits count one hold per slot and channel.
//   * Nothing read from the pool decides more than "named or not" and who
//     held: names and holds are the master's own records afterwards.
// Pool words are written through announce.h's master-side calls, under mu_.
#include <algorithm>

#include "master_impl.h"
#include "master_internal.h"
#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/common/tenant.h"
#include "mooncake_cxl/control/announce.h"
#include "mooncake_cxl/pool/key_hash.h"
#include "mooncake_cxl/pool/publish.h"

namespace mcxl {

bool MasterImpl::AnnounceLogAllowed() {
  uint64_t now = MonoNs();
  if (now - announce_log_mono_ >= kNsPerSec) {
    if (announce_unlogged_ != 0)
      MCXL_LOG(kWarn, "master", "%llu more announce channel refusals not logged", (unsigned long long)announce_unlogged_);
    announce_log_mono_ = now, announce_logged_ = 0, announce_unlogged_ = 0;
  }
  if (announce_logged_ < kRefusalLinesPerSec) return ++announce_logged_, true;
  ++announce_unlogged_;
  return false;
}

std::string MasterImpl::HandleAnnounceOpen(Decoder* d) {
  AnnounceOpenRequest req;
  AnnounceOpenReply reply;
  Encoder e;
  auto answer = [&](ErrorCode code) {
    reply.status = code;
    Encode(reply, &e);
    return e.data();
  };
  if (!Decode(d, &req)) return answer(ErrorCode::INVALID_PARAMS);
  if (!ClientValid(req.client)) return answer(ErrorCode::ILLEGAL_CLIENT);
  const uint32_t slot = req.client.slot;
  const std::string& tenant = clients_[slot].tenant;
  if (req.name.empty() || req.name.size() > kMaxChannelNameBytes || req.name[0] == kTenantMark) {
    if (AnnounceLogAllowed())
      MCXL_LOG(kWarn, "master", "announce channel open by slot %u refused: a name of %zu bytes (1..%u, not starting "
               "with 0x1d)", slot, req.name.size(), kMaxChannelNameBytes);
    return answer(ErrorCode::INVALID_PARAMS);
  }
  std::vector<uint32_t>& mine = slot_holds_[slot];
  if (mine.size() >= config_.announce_channels_per_client) {
    if (AnnounceLogAllowed())
      MCXL_LOG(kWarn, "master", "announce channel '%.64s' refused to slot %u: it holds %zu channels open "
               "(--announce_channels_per_client=%llu); close some", req.name.c_str(), slot, mine.size(),
               (unsigned long long)config_.announce_channels_per_client);
    ++stats_.announce_refusals;
    return answer(ErrorCode::NO_AVAILABLE_HANDLE);
  }
  const uint64_t h = AnnounceNameHash(TenantPrefix(tenant) + req.name);
  uint32_t ch;
  auto it = channel_of_.find(h);
  if (it != channel_of_.end()) {
    ch = it->second;
  } else {
    ch = uint32_t(channels_.size());
    uint64_t oldest = UINT64_MAX;
    for (uint32_t i = 0; i < channels_.size(); ++i) {
      ChannelState& c = channels_[i];
      if (c.name_hash == 0) {
        ch = i;
        break;
      }
      if (!c.freed && c.holds == 0) MaybeFreeChannel(i);
      if (c.freed && c.freed_seq < oldest) oldest = c.freed_seq, ch = i;
    }
    if (ch == channels_.size()) {
      if (AnnounceLogAllowed())
        MCXL_LOG(kWarn, "master", "announce channel '%.64s' refused to slot %u: all %zu channels are held open",
                 req.name.c_str(), slot, channels_.size());
      ++stats_.announce_refusals;
      return answer(ErrorCode::NO_AVAILABLE_HANDLE);
    }
    if (channels_[ch].name_hash != 0) channel_of_.erase(channels_[ch].name_hash);
    NameAnnounceChannel(*pool_, ch, h);
    channels_[ch] = ChannelState{h};
    channel_of_[h] = ch;
  }
  channels_[ch].freed = false;
  ++channels_[ch].holds;
  mine.push_back(ch);
  SetAnnounceHolder(*pool_, ch, slot, true);
  reply.channel = ch;
  reply.name_hash = h;
  return answer(ErrorCode::OK);
}

std::string MasterImpl::HandleAnnounceClose(Decoder* d) {
  AnnounceCloseRequest req;
  if (!Decode(d, &req)) return StatusReply(ErrorCode::INVALID_PARAMS);
  if (!ClientValid(req.client)) return StatusReply(ErrorCode::ILLEGAL_CLIENT);
  auto& held = slot_holds_[req.client.slot];
  auto it = std::find(held.begin(), held.end(), req.channel);
  // A hold dropped already (a reclaim in between) or never taken: nothing to do.
  if (it == held.end() || channels_[req.channel].name_hash != req.name_hash)
    return StatusReply(ErrorCode::OBJECT_NOT_FOUND);
  held.erase(it);
  ReleaseHold(req.client.slot, req.channel);
  return StatusReply(ErrorCode::OK);
}

void MasterImpl::SyncHolderBit(uint32_t slot, uint32_t ch) {
  const auto& held = slot_holds_[slot];
  bool holds = std::find(held.begin(), held.end(), ch) != held.end();
  for (const auto& r : recovered_holds_)
    holds = holds || (r.old_slot == slot && std::find(r.channels.begin(), r.channels.end(), ch) != r.channels.end());
  SetAnnounceHolder(*pool_, ch, slot, holds);
}

void MasterImpl::ReleaseHold(uint32_t slot, uint32_t ch) {
  --channels_[ch].holds;
  SyncHolderBit(slot, ch);
  if (channels_[ch].holds == 0) MaybeFreeChannel(ch);
}

void MasterImpl::DropAnnounceHolds(uint32_t slot) {
  std::vector<uint32_t> held;
  held.swap(slot_holds_[slot]);
  for (uint32_t ch : held) ReleaseHold(slot, ch);
}

void MasterImpl::MaybeFreeChannel(uint32_t ch) {
  ChannelState& c = channels_[ch];
  if (c.name_hash == 0 || c.freed || c.holds != 0) return;
  uint64_t machine = 0;
  uint64_t owner = AnnounceOwner(*pool_, ch, &machine);
  // A live producer of this machine that lost its slot (stopped past
  // --client_ttl) may publish again: its channel keeps its name until it
  // exits. Another host's producer held the channel through its slot, which
  // ended: its next publish finds the channel gone.
  if (owner != 0 && machine == KeyHash(machine_) && !LocalPidDead(owner)) return;
  c.freed = true;
  c.freed_seq = ++channels_freed_;
  ++stats_.announce_channels_freed;
  MCXL_LOG(kInfo, "master", "announce channel %u freed (no holder, no live producer)", ch);
}

void MasterImpl::SweepAnnounceChannels() {
  const uint64_t now = MonoNs(), ttl = config_.client_ttl_s * kNsPerSec;
  const uint64_t here = KeyHash(machine_);
  // Holds a restart found whose process did not re-attach: dropped once it
  // is known dead, or after a client ttl.
  for (size_t i = 0; i < recovered_holds_.size();) {
    RecoveredHolds& r = recovered_holds_[i];
    if (!((r.machine_hash == here && LocalPidDead(r.pid)) || now - r.since_mono > ttl)) {
      ++i;
      continue;
    }
    RecoveredHolds gone = std::move(r);
    recovered_holds_.erase(recovered_holds_.begin() + long(i));
    for (uint32_t ch : gone.channels) ReleaseHold(gone.old_slot, ch);
  }
  for (uint32_t ch = 0; ch < channels_.size(); ++ch)
    if (channels_[ch].name_hash != 0 && !channels_[ch].freed && channels_[ch].holds == 0) MaybeFreeChannel(ch);
}

void MasterImpl::AttachAnnounceHolds(uint32_t slot, uint64_t pid, uint64_t machine_hash) {
  DropAnnounceHolds(slot);  // none: every end of an attachment dropped them
  for (size_t i = 0; i < recovered_holds_.size(); ++i) {
    RecoveredHolds& r = recovered_holds_[i];
    if (r.pid != pid || r.machine_hash != machine_hash) continue;
    RecoveredHolds mine = std::move(r);
    recovered_holds_.erase(recovered_holds_.begin() + long(i));
    for (uint32_t ch : mine.channels) {
      slot_holds_[slot].push_back(ch);
      SetAnnounceHolder(*pool_, ch, slot, true);
      if (mine.old_slot != slot) SyncHolderBit(mine.old_slot, ch);
    }
    return;
  }
}

void MasterImpl::RecoverAnnounceChannels() {
  const uint32_t slots = pool_->geometry().client_slot_count;
  const uint64_t now = MonoNs();
  std::vector<int64_t> entry_of(slots, -1);  // slot -> its recovered_holds_ entry
  for (uint32_t ch = 0; ch < channels_.size(); ++ch) {
    AnnounceChannelHeader* c = pool_->announce_channel(ch);
    ObserveRange(c, sizeof(*c));
    // Relaxed: the previous master's words, read once, before any client
    // re-attaches; a bad one costs at most a channel's name.
    uint64_t h = c->name_hash.load(std::memory_order_relaxed);
    if (h == 0) continue;
    if ((h & 1) == 0 || channel_of_.count(h) != 0) {  // no master wrote that: free it
      FreeAnnounceChannel(*pool_, ch);
      continue;
    }
    channels_[ch].name_hash = h;
    channel_of_[h] = ch;
    for (uint32_t w = 0; w < (slots + 63) / 64; ++w) {
      for (uint64_t bits = c->holders[w].load(std::memory_order_relaxed); bits != 0; bits &= bits - 1) {
        const uint32_t s = w * 64 + uint32_t(__builtin_ctzll(bits));
        if (s >= slots) break;
        ClientSlot* cs = pool_->client_slot(s);
        if (cs->generation.load(std::memory_order_relaxed) == 0) {
          SetAnnounceHolder(*pool_, ch, s, false);
          continue;
        }
        if (entry_of[s] < 0) {
          entry_of[s] = int64_t(recovered_holds_.size());
          recovered_holds_.push_back({cs->pid.load(std::memory_order_relaxed),
                                      cs->machine_hash.load(std::memory_order_relaxed), now, s, {}});
        }
        recovered_holds_[size_t(entry_of[s])].channels.push_back(ch);
        ++channels_[ch].holds;
      }
    }
  }
  for (uint32_t ch = 0; ch < channels_.size(); ++ch) MaybeFreeChannel(ch);
}

}  // namespace mcxl
