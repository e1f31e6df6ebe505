// Announcement channels: "blocks ready" records through the pool (the block
// KV layer's hand-off, docs/architecture.md), so a decode process learns
// that a prefill process stored blocks with no TCP between them.
//
// Contract: a pool region holds announce_channels channels (layout.h
// AnnounceChannelHeader) of announce_slots one-line records. A channel is
// named (KeyHash(name) | 1, open addressing from hash % channels; names are
// never removed, so a probe stops at the first unnamed channel). One
// producer at a time owns it (owner_pid, CAS from 0, or from a dead pid of
// this machine); any number of readers follow it, each with a private
// cursor, so readers never write the channel except readers_waiting. The
// producer never waits for readers: record n overwrites record
// n - announce_slots, and a reader that fell that far behind gets kLapped
// (how many it lost) and resumes at the oldest record still held.
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
#include <memory>
#include <string_view>

#include "mooncake_cxl/common/error_code.h"
#include "mooncake_cxl/pool/pool.h"

namespace mcxl {

struct AnnounceMessage {
  uint64_t words[7] = {};
};

class AnnounceProducer {
 public:
  // Claims channel `name`: OBJECT_ALREADY_EXISTS while a live process owns it,
  // NO_AVAILABLE_HANDLE when every channel carries another name.
  static Result<std::unique_ptr<AnnounceProducer>> Open(std::shared_ptr<Pool> pool, std::string_view name);
  ~AnnounceProducer();
  // Publishes one record; returns its number.
  uint64_t Publish(const AnnounceMessage& m);
  // Releases the channel (the destructor does too).
  void Close();
  uint64_t head() const;

 private:
  AnnounceProducer(std::shared_ptr<Pool> pool, AnnounceChannelHeader* ch) : pool_(std::move(pool)), ch_(ch) {}
  std::shared_ptr<Pool> pool_;
  AnnounceChannelHeader* ch_;
  bool open_ = true;
};

class AnnounceReader {
 public:
  // Follows channel `name`, naming it if no producer has yet (so a reader may
  // start first). from_start: also the records still held; else only new ones.
  static Result<std::unique_ptr<AnnounceReader>> Open(std::shared_ptr<Pool> pool, std::string_view name,
                                                      bool from_start);
  enum class ReadResult { kOk, kEmpty, kLapped };
  // kOk: *m is record *number; kLapped: *number = records lost (cursor moved).
  ReadResult Next(AnnounceMessage* m, uint64_t* number);
  // Until a record past the cursor exists or timeout_ns passes; true if one does.
  bool Wait(uint64_t spin_ns, uint64_t timeout_ns);
  uint64_t cursor() const { return cursor_; }
  uint64_t head() const;
  // The producer's pid, 0 when none owns the channel.
  uint64_t producer_pid() const;
  // True when the channel's owner is a process of this machine that no
  // longer exists (its claim is left until another producer takes it over);
  // false while it lives, for another host's owner, or with no owner.
  bool producer_dead() const;
  // Counts producer claims of the channel: a new owner changes it.
  uint64_t epoch() const;

 private:
  AnnounceReader(std::shared_ptr<Pool> pool, AnnounceChannelHeader* ch) : pool_(std::move(pool)), ch_(ch) {}
  std::shared_ptr<Pool> pool_;
  AnnounceChannelHeader* ch_;
  uint64_t cursor_ = 0;
};

}  // namespace mcxl
