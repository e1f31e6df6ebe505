// Announcement channels: "blocks ready" records through the pool (the block
// KV layer's hand-off, docs/architecture.md), so a decode process learns
// that a prefill process stored blocks with no TCP between them.
//
// Contract: a pool region holds announce_channels channels (layout.h
// AnnounceChannelHeader) of announce_slots one-line records. The master
// alone names and frees channels (kAnnounceOpen, kAnnounceClose: names are
// scoped by tenant like keys, and each client holds at most a few open); a
// channel is free again once no attached client holds it and its producer
// closed or exited; it keeps its name and records until another name needs
// it, and the master wipes them before it carries the new name. Producers and readers open a channel by the index and name
// hash the master gave: a header that no longer carries that hash is lost
// to them (kLost, or a failed Publish), so nothing written under one name is
// read under another. One producer at a time owns a channel (owner_pid, CAS
// from 0, or from a dead pid of this machine); any number of readers follow
// it, each with a private cursor, so readers never write the channel except
// readers_waiting. The producer never waits for readers: record n overwrites
// record n - announce_slots, and a reader that fell that far behind gets
// kLapped (how many it lost) and resumes at the oldest record still held.
// Announcements are hints: the store's objects are the truth, so a lapped or
// timed-out reader falls back to a lookup.
//
// Record n, in slot n % slots, is seqlocked by its seq word: 2n+1 while it
// is written, 2n+2 once complete; the producer then sets head = n+1. A reader
// of record n accepts it only if seq reads 2n+2 before and after copying the
// payload, so a record torn by a lapping producer is never returned. Waiting
// is spin-then-futex on head's low 32 bits, like ShmRing (in non-coherent
// mode, short sleeps and re-polls: a futex wake does not cross hosts).
//
// Everything read from the pool is bounded: slots and channels come from the
// Pool's private geometry, cursor % slots indexes the records.
//
// Thread safety: one thread per AnnounceProducer / AnnounceReader object.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "mooncake_cxl/common/error_code.h"
#include "mooncake_cxl/pool/pool.h"

namespace mcxl {

struct AnnounceMessage {
  uint64_t words[7] = {};
};

// The channel's name hash for a tenant-scoped name: never 0.
uint64_t AnnounceNameHash(std::string_view scoped_name);

// The master's side (under its lock; nothing else writes these words).
// Names channel `ch` (free) `name_hash`: the old name withdrawn first (its
// readers stop), records wiped, head 0, holders none, then the new name.
void NameAnnounceChannel(const Pool& pool, uint32_t ch, uint64_t name_hash);
// Frees channel `ch`: no name, no holder, no owner.
void FreeAnnounceChannel(const Pool& pool, uint32_t ch);
void SetAnnounceHolder(const Pool& pool, uint32_t ch, uint32_t slot, bool held);
// The producer owning `ch` (0: none) and KeyHash of its machine's hostname.
uint64_t AnnounceOwner(const Pool& pool, uint32_t ch, uint64_t* machine_hash);

class AnnounceProducer {
 public:
  // Claims channel `ch` (named name_hash by the master): OBJECT_ALREADY_EXISTS
  // while a live process owns it, OBJECT_NOT_FOUND when the channel does not
  // carry that name. on_close runs once, at Close (the hold's release).
  static Result<std::unique_ptr<AnnounceProducer>> Open(std::shared_ptr<Pool> pool, uint32_t ch, uint64_t name_hash,
                                                        std::function<void()> on_close = {});
  ~AnnounceProducer();
  // Publishes one record; returns its number. UNAVAILABLE_IN_CURRENT_STATUS
  // once the channel is no longer ours (taken over, or freed by the master).
  Result<uint64_t> Publish(const AnnounceMessage& m);
  // Releases the channel (the destructor does too).
  void Close();
  uint64_t head() const;

 private:
  AnnounceProducer(std::shared_ptr<Pool> pool, AnnounceChannelHeader* ch, uint64_t name_hash)
      : pool_(std::move(pool)), ch_(ch), name_hash_(name_hash) {}
  std::shared_ptr<Pool> pool_;
  AnnounceChannelHeader* ch_;
  uint64_t name_hash_;
  uint64_t pid_ = 0;  // getpid() at the claim (a syscall: not per publish)
  std::function<void()> on_close_;
  bool open_ = true;
};

class AnnounceReader {
 public:
  // Follows channel `ch` (named name_hash by the master; a reader may start
  // before any producer). from_start: also the records still held; else
  // only new ones. OBJECT_NOT_FOUND when the channel does not carry the name.
  static Result<std::unique_ptr<AnnounceReader>> Open(std::shared_ptr<Pool> pool, uint32_t ch, uint64_t name_hash,
                                                      bool from_start, std::function<void()> on_close = {});
  ~AnnounceReader();
  // kLost: the channel no longer carries its name (freed and maybe renamed):
  // nothing more comes from it.
  enum class ReadResult { kOk, kEmpty, kLapped, kLost };
  // kOk: *m is record *number; kLapped: *number = records lost (cursor moved).
  ReadResult Next(AnnounceMessage* m, uint64_t* number);
  // Until a record past the cursor exists or timeout_ns passes; true if one
  // does (or the channel is lost: Next says so).
  bool Wait(uint64_t spin_ns, uint64_t timeout_ns);
  // Drops the hold (the destructor does too); Next then says kLost.
  void Close();
  uint64_t cursor() const { return cursor_; }
  uint64_t head() const;
  // The channel still carries the name it was opened by.
  bool named() const;
  // The producer's pid, 0 when none owns the channel.
  uint64_t producer_pid() const;
  // True when the channel's owner is a process of this machine that no
  // longer exists (its claim is left until another producer takes it over);
  // false while it lives, for another host's owner, or with no owner.
  bool producer_dead() const;
  // Counts producer claims of the channel: a new owner changes it.
  uint64_t epoch() const;

 private:
  AnnounceReader(std::shared_ptr<Pool> pool, AnnounceChannelHeader* ch, uint64_t name_hash)
      : pool_(std::move(pool)), ch_(ch), name_hash_(name_hash) {}
  std::shared_ptr<Pool> pool_;
  AnnounceChannelHeader* ch_;
  uint64_t name_hash_;
  std::function<void()> on_close_;
  bool open_ = true;
  uint64_t cursor_ = 0;
};

}  // namespace mcxl
