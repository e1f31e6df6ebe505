// The pool layout: every structure that lives in the shared CXL pool.
//
// Contract: the pool is mapped at a different address in every process, so no
// structure here holds a pointer; everything is a byte offset from the pool's
// start. Each field says who writes it. All multi-process fields are
// std::atomic of a lock-free width (same layout as the plain integer on every
// supported ABI). A change to anything in this file is a new kLayoutVersion.
//
//   [Superblock 4 KiB][client table][pin tables][control rings][announce channels]
//   [object index][data]
//
// Invariants:
//   * Superblock::magic is written last by Format, so a crash while formatting
//     leaves an unformatted pool, never a half-formatted one that attaches.
//   * Only the master changes an IndexEntry's structure (all fields but
//     `lease_until_ns`, and the WRITING->COMPLETE/ABORTED transitions of
//     `state_gen` that the putting client makes with a CAS that names the
//     generation, so a stale client can never touch a reused entry).
//   * A value's bytes are stable while its entry's version is unchanged and
//     even: the master bumps the version before it frees or reuses an extent.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace mcxl {

constexpr uint64_t kPoolMagic = 0x314C58434B4F4F4DULL;  // "MOOKCXL1"
// 2: Superblock::auth_token; 3: pin records name the object's offset; 4: announce channels;
// 5: RingHeader::caller, and the SSD tier (EntryState::kOnDisk, DiskStub, Superblock::tier_*)
// 6: Superblock::master_term and master_writing (the fence of --enable_ha)
// 7: announcement channels named by the master, with their holders
// 8: DRAM segments (EntryState::kInSegment, SegmentStub, kFlagSegmentStub)
constexpr uint32_t kLayoutVersion = 8;
constexpr uint64_t kCacheLine = 64;
constexpr uint64_t kSuperblockSize = 4096;
constexpr uint32_t kMaxKeyLength = 65535;
constexpr uint64_t kObjectMagic = 0x4A424F4C5843434DULL;  // "MCCXLOBJ"

constexpr uint64_t RoundUp(uint64_t v, uint64_t align) {
  return (v + align - 1) / align * align;
}

enum class CoherenceMode : uint32_t {
  kCoherent = 0,     // one host, or CXL 3.x back-invalidate: atomics suffice
  kNonCoherent = 1,  // CXL 2.0 multi-host: flush + fence around publishes
};

struct Superblock {
  // Written once by Format (before `magic`), read-only afterwards.
  uint64_t magic;
  uint32_t layout_version;
  uint32_t coherence_mode;
  uint8_t uuid[16];
  uint64_t pool_size;
  uint64_t format_time_ns;
  uint64_t client_table_offset;
  uint32_t client_slot_count;
  uint32_t client_slot_size;
  uint64_t pin_table_offset;  // client_slot_count tables of pins_per_client
  uint32_t pins_per_client;
  uint32_t ring_bytes;  // of each ring: per client one request, one response ring
  uint64_t ring_region_offset;
  uint64_t ring_region_size;
  uint64_t index_offset;
  uint64_t index_capacity;  // entries, a power of two
  uint64_t data_offset;
  uint64_t data_size;
  // The pool's credential (access.h): 128 random bits from getrandom(2).
  // Clients read it from the pool they map and present it at Attach, so only
  // a process that can read the pool can use the master's RPC.
  uint8_t auth_token[16];
  // Announcement channels (announce.h): announce_channels channels of
  // announce_slots records each, from announce_offset.
  uint64_t announce_offset;
  uint32_t announce_channels;
  uint32_t announce_slots;

  // Written by the running master only (one writer per line).
  alignas(kCacheLine) std::atomic<uint64_t> master_incarnation;  // +1 per start
  std::atomic<uint64_t> master_heartbeat_ns;
  std::atomic<uint64_t> lease_ttl_ns;  // granted by readers on get/exist
  // Longest probe distance any insert has used; readers stop probing after it.
  std::atomic<uint64_t> max_probe;
  std::atomic<uint64_t> master_pid;
  std::atomic<uint64_t> master_machine_hash;  // KeyHash(gethostname()): pid checks are local

  // The fence of elected masters (master_fence.h). master_term: the
  // leader's term (0 without HA), raised by a new leader before its first
  // structural write; clients compare it on every reply. master_writing: a
  // leader's term while it is inside a write batch, else 0; its own line,
  // written at every batch, so that clients' reads of the term stay hits.
  alignas(kCacheLine) std::atomic<uint64_t> master_term;
  alignas(kCacheLine) std::atomic<uint64_t> master_writing;

  // The ring server's doorbell (CXL RPC). After each request a client reads
  // ring_server_sleeping; only when the server is not polling (asleep, or in
  // an eviction slice) does it add 1 to the doorbell (and wake the server
  // when asleep): a write to this line per request would cost every put a
  // miss on a line the polling server reads. Its own line: many writers.
  alignas(kCacheLine) std::atomic<uint32_t> ring_doorbell;  // futex word
  std::atomic<uint32_t> ring_server_sleeping;               // ring server: kRingServer* below

  // The SSD tier (disk_tier.h), written by the master at start, before it
  // bumps master_incarnation; clients read them at attach. tier_config: 0 =
  // no tier, else kTierEnabled | kTierPromotion... | threshold << 32.
  // tier_root: --root_fs_dir, NUL-terminated (a client that can open it
  // reads records itself; else it asks the master to stage them).
  alignas(kCacheLine) std::atomic<uint64_t> tier_config;
  char tier_root[1024];
  // The SSD tier's durable tombstones (tier_manager.h): every tombstone the
  // master queued with a sequence number <= this one is written (survives a
  // SIGKILL). A remove or upsert whose reply carries a ticket returns once it
  // reaches the ticket. Written by the master's tier thread only; never
  // decreases within a master incarnation.
  alignas(kCacheLine) std::atomic<uint64_t> tier_tombs_durable;
};
static_assert(sizeof(Superblock) <= kSuperblockSize);
// Superblock::ring_server_sleeping: 0 = polling the rings.
constexpr uint32_t kRingServerAsleep = 1;    // on the doorbell futex: ring and wake it
constexpr uint32_t kRingServerEvicting = 2;  // in an eviction slice: ring (ends the slice early)
constexpr uint64_t kTierEnabled = 1ull << 0;
constexpr uint64_t kTierPromotionOnHit = 1ull << 1;

// Header of one single-producer/single-consumer ring of the CXL RPC; the
// bytes of the ring follow it. head and tail count bytes ever produced and
// consumed; each record carries a sequence number so that a stale or torn
// record is detected rather than decoded.
//
// One writer per line, and a line the peer reads on every record is written
// once per record: the consumer polls line 0 (one transfer per record is the
// price of polling); the caller word, CASed twice per call, has line 1 to
// itself (on line 0 each CAS would pull the line back from the polling
// master); the producer reads line 2 (tail) only when its cached copy says
// the ring is full; consumer_waiting, which the producer reads after every
// push, has line 3, written only when the consumer goes to sleep (beside
// tail it would cost the producer a miss per record).
//
// The rings hold no state across attachments (the master resets a slot's
// rings before handing it out), so this header's shape is part of the wire
// protocol (kProtocolVersion), not of the pool layout.
struct RingHeader {
  std::atomic<uint64_t> head;      // producer; its low 32 bits are the consumer's futex word
  std::atomic<uint64_t> next_seq;  // producer: sequence number of the next record
  // Request ring only: the slot generation of the attachment inside a ring
  // call (claimed with a CAS before its slot check, cleared after its reply),
  // 0 = none. The master does not hand the rings to another client while an
  // earlier attachment holds them (a stopped process could resume mid-push).
  alignas(kCacheLine) std::atomic<uint64_t> caller;
  alignas(kCacheLine) std::atomic<uint64_t> tail;  // consumer
  std::atomic<uint64_t> expected_seq;              // consumer
  alignas(kCacheLine) std::atomic<uint32_t> consumer_waiting;  // consumer: asleep on head
};
static_assert(sizeof(RingHeader) == 4 * kCacheLine);

// One announcement channel (announce.h): one producer at a time, any number
// of readers, each with its own cursor (not in the pool). Line 0 is the
// claim (name_hash written by the master, which names and frees channels;
// owner_pid CASed by producers), line 1 the producer's, lines 2..9 the
// master's record of which client slots hold it open (read back only by a
// restarted master); announce_slots AnnounceRecords follow the header.
constexpr uint32_t kAnnounceHolderWords = 64;  // one bit per client slot (kMaxClientSlots)
struct AnnounceChannelHeader {
  std::atomic<uint64_t> name_hash;      // master: 0 = free, else KeyHash(tenant-scoped name) | 1
  std::atomic<uint64_t> owner_pid;      // producers: 0 = no producer; CAS to claim
  std::atomic<uint64_t> owner_machine;  // producer: KeyHash(hostname), for pid liveness checks
  std::atomic<uint64_t> epoch;          // producers: +1 per claim
  alignas(kCacheLine) std::atomic<uint64_t> head;  // producer: records ever published; low 32 bits: futex word
  std::atomic<uint32_t> readers_waiting;           // readers: how many sleep on head (atomic add/sub)
  alignas(kCacheLine) std::atomic<uint64_t> holders[kAnnounceHolderWords];  // master: bit s = slot s holds it
};
static_assert(sizeof(AnnounceChannelHeader) == 10 * kCacheLine);

// One record, seqlocked: seq is 2n+1 while record n is written, 2n+2 once it
// is complete; record n lives in slot n % announce_slots.
struct alignas(kCacheLine) AnnounceRecord {
  std::atomic<uint64_t> seq;
  std::atomic<uint64_t> words[7];  // payload (announce.h: AnnounceMessage)
};
static_assert(sizeof(AnnounceRecord) == kCacheLine);

// A slot whose attachment ended (reclaimed, detached, or a master restart)
// while its process may still hold BufferHandles: `generation` is the ended
// generation | kSlotRetired, and its pin table is honoured until that process
// re-attaches (and takes the slot back), drops its views, or is known dead.
constexpr uint64_t kSlotRetired = 1ull << 63;

// One attached client. Line 0 is the master's, line 1 the client's.
struct ClientSlot {
  std::atomic<uint64_t> generation;  // master: 0 = free, else bumped per attach (or kSlotRetired)
  std::atomic<uint64_t> pid;         // master: the attached process
  std::atomic<uint64_t> machine_hash;  // master: KeyHash(gethostname()) of it
  char host[40];                     // master: local_hostname, NUL-terminated
  alignas(kCacheLine) std::atomic<uint64_t> heartbeat_ns;  // client: liveness
  std::atomic<uint64_t> heartbeat_generation;  // client: slot generation it holds
  // client (atomic add/sub, paired with its record CASes): records claimed
  // and not released; 0 lets the master skip the table. Never below the truth:
  // the master resets it only for a dead owner.
  std::atomic<uint64_t> pins_in_use;
  // client: raised (never lowered) to cover every record it claims, so
  // records [0, this) may be live; the master resets it only for a dead owner.
  std::atomic<uint64_t> pin_high_water;
  std::atomic<uint64_t> get_hits;        // client: reads that found the key
  std::atomic<uint64_t> get_misses;      // client: reads that did not
  std::atomic<uint64_t> disk_hits;       // client: reads served from the SSD tier
  std::atomic<uint64_t> disk_checksum_failures;  // client: tier records found bad (misses)
};
static_assert(sizeof(ClientSlot) == 2 * kCacheLine);

// A zero-copy view (BufferHandle) held by a client: while a record names an
// object, the master neither frees its extent nor removes it unforced. Named
// by where it lives and its generation (unique over the pool's life), so a
// restarted master can keep the extent of an object unlinked while viewed.
// Written by its client (claimed and released with a CAS of object_offset);
// cleared by the master only when the owner is known dead (or, for another
// host's client, its retired table expired).
struct PinRecord {
  std::atomic<uint64_t> object_offset;  // ObjectHeader's pool offset; 0 = free record
  std::atomic<uint64_t> generation;     // of the pinned object
};
static_assert(sizeof(PinRecord) == 16);

enum class EntryState : uint8_t {
  kEmpty = 0,      // never used: ends a probe sequence
  kTombstone = 1,  // removed: probing continues past it
  kWriting = 2,    // put in progress, invisible to readers
  kComplete = 3,   // readable
  kAborted = 4,    // put given up by its client; the master reclaims it
  // Readable, value in the SSD tier: object_offset names a small stub extent
  // (ObjectHeader + key + DiskStub at the value offset) saying where the
  // record lives. value_size is the value's. Only the master sets or leaves it.
  kOnDisk = 5,
  // Readable, value in a client's DRAM segment: object_offset names a stub
  // extent (ObjectHeader + key + SegmentStub at the value offset) naming the
  // segment and the range in it. Set by the owning putter's publishing CAS;
  // the master tombstones every one of a segment before its slot is reused.
  kInSegment = 6,
};
// A state readers return a value for (from the pool, the tier or a segment).
constexpr bool Readable(EntryState s) {
  return s == EntryState::kComplete || s == EntryState::kOnDisk || s == EntryState::kInSegment;
}

constexpr uint64_t PackStateGen(uint64_t generation, EntryState s) {
  return (generation << 8) | uint64_t(s);
}
constexpr EntryState StateOf(uint64_t state_gen) {
  return EntryState(state_gen & 0xff);
}
constexpr uint64_t GenOf(uint64_t state_gen) { return state_gen >> 8; }

enum EntryFlags : uint32_t {
  kFlagHardPin = 1u << 0,
  kFlagSoftPin = 1u << 1,
  // An upsert of this key is in flight: a newer COMPLETE entry may follow in
  // the probe sequence, so readers keep probing and take the newest.
  kFlagSuperseded = 1u << 2,
  // ObjectHeader::flags of a stub extent (kOnDisk): its "value" is a DiskStub.
  kFlagDiskStub = 1u << 3,
  // ObjectHeader::flags of a stub extent of a DRAM segment object: its
  // "value" is a SegmentStub.
  kFlagSegmentStub = 1u << 4,
};

// One object in the index: exactly one cache line.
struct alignas(kCacheLine) IndexEntry {
  std::atomic<uint64_t> version;    // master: seqlock, odd while rewriting
  std::atomic<uint64_t> state_gen;  // master; client CAS WRITING->COMPLETE
  std::atomic<uint64_t> key_hash;   // master
  std::atomic<uint64_t> object_offset;  // master: ObjectHeader's pool offset
  std::atomic<uint64_t> value_size;     // master
  std::atomic<uint64_t> lease_until_ns;  // readers: atomic max (not seqlocked)
  std::atomic<uint32_t> flags;           // master: EntryFlags
  std::atomic<uint32_t> owner_slot;      // master: client slot of the putter
  std::atomic<uint64_t> put_time_ns;     // master
};
static_assert(sizeof(IndexEntry) == kCacheLine);

// Start of every extent in the data region; written by the master at
// PutStart, before the entry that points at it is inserted. The key follows
// the header, the value starts at the next 64-byte boundary.
struct ObjectHeader {
  uint64_t magic;
  uint64_t key_hash;
  uint64_t generation;
  uint64_t value_size;
  uint64_t extent_size;
  uint64_t put_time_ns;
  uint64_t group_hash;       // 0 = no group
  uint64_t soft_pin_ttl_ms;  // meaningful with kFlagSoftPin
  uint32_t key_len;
  uint32_t flags;            // EntryFlags at put time
  uint32_t header_checksum;  // over the fields above and the key
  uint32_t reserved;
  // char key[key_len] follows.
};
static_assert(sizeof(ObjectHeader) == 80);

// Where the record of a kOnDisk entry lives in the tier (disk_tier.h's
// RecordLocation), at the value offset of its stub extent. Written by the
// master before the entry turns kOnDisk (under the entry's seqlock); a
// reader copies it, re-checks the entry, and trusts nothing in it without
// the record's own checks (key, length, crc32c: ReadRecord).
constexpr uint64_t kDiskStubMagic = 0x425453444C58434DULL;  // "MCXLDSTB"
struct DiskStub {
  uint64_t magic;
  uint32_t segment_id;
  uint32_t crc32c;  // of the value
  uint64_t record_offset;
  uint64_t value_len;
  uint64_t generation;
  uint32_t key_len;
  uint32_t reserved;
  // Readers (atomic add): reads served from the tier, for promotion on hit.
  std::atomic<uint64_t> disk_reads;
};
static_assert(sizeof(DiskStub) == 56);

// Where the value of a kInSegment entry lives: `length` bytes at `offset` of
// the DRAM segment of client slot `slot` while that slot has generation
// `slot_generation`. Written by the master at PutStart, before the entry is
// inserted; a reader copies it, bounds-checks it against the segment it
// knows (the owner: its own mapping; others: the size the master recorded
// at Attach), copies the value and re-checks the entry's version.
constexpr uint64_t kSegmentStubMagic = 0x4753444C58434DULL;  // "MCXLDSG"
struct SegmentStub {
  uint64_t magic;
  uint32_t slot;
  uint32_t reserved;
  uint64_t slot_generation;
  uint64_t offset;
  uint64_t length;
};
static_assert(sizeof(SegmentStub) == 40);

constexpr uint64_t ObjectHeaderBytes(uint64_t key_len) {
  return RoundUp(sizeof(ObjectHeader) + key_len, kCacheLine);
}
constexpr uint64_t ExtentBytes(uint64_t key_len, uint64_t value_size) {
  return ObjectHeaderBytes(key_len) + RoundUp(value_size, kCacheLine);
}

}  // namespace mcxl
