// Client: one process's handle on the store: maps the pool, attaches to the
// master, writes values into the pool and reads them one-sidedly.
//
// Contract (docs/architecture.md §3):
//   * A put costs one master round trip for any number of keys (PutStart),
//     then a copy straight into the pool and a CAS that publishes each entry.
//     A key that already exists is not overwritten and counts as success;
//     Upsert replaces it.
//   * Get, IsExist, GetSize cost no master round trip: a seqlock-validated
//     probe of the index in the pool, a copy, a re-check; a copy that raced
//     with a remove or an eviction is retried, never returned.
//   * Every method after Close (or on a client whose Connect failed) returns
//     UNAVAILABLE_IN_CURRENT_STATUS.
//   * Keys are the tenant's (ClientOptions::tenant, tenant.h): every method
//     maps them into the tenant's namespace, so another tenant's keys are
//     never seen, replaced or removed.
//   * A lost master connection is re-established on the next call; if the
//     master restarted, the client re-attaches and a put is retried once.
//     With an etcd:// address the client looks the elected master up in
//     etcd, at Connect and at each re-attach (which then retries for up to
//     put_wait_ms while no leader serves); a reply is refused once the
//     pool names a newer term than the master that attached us.
//
// Thread safety: every method may be called from any thread concurrently;
// Close waits for calls in flight.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "mooncake_cxl/common/error_code.h"
#include "mooncake_cxl/common/reader_gate.h"
#include "mooncake_cxl/pool/object_index.h"
#include "mooncake_cxl/pool/pool.h"
#include "mooncake_cxl/pool/populate.h"
#include "mooncake_cxl/pool/publish.h"
#include "mooncake_cxl/control/etcd_client.h"
#include "mooncake_cxl/control/rpc_client.h"
#include "mooncake_cxl/control/shm_ring.h"

namespace mcxl {

struct ClientOptions {
  std::string local_hostname;
  // "host:port", or "etcd://h1:2379;h2:2379" (or ','): the master elected
  // in etcd (--enable_ha), followed across takeovers.
  std::string master_addr;
  std::string cluster_id;           // with etcd://; "" = MC_STORE_CLUSTER_ID or "mooncake"
  std::string pool_path_override;   // MC_CXL_DEV_PATH: this host's name for the pool
  uint64_t pool_size_override = 0;  // MC_CXL_DEV_SIZE
  int connect_timeout_ms = 3000;
  int rpc_timeout_ms = 10000;
  int heartbeat_interval_ms = 1000;
  // How long a put refused for space keeps retrying (eviction runs in the
  // master meanwhile) before it returns NO_AVAILABLE_HANDLE.
  int put_wait_ms = 2000;
  // Control path: the CXL RPC rings in the pool (default), or TCP only.
  bool use_rings = true;
  // Map the pool's pages after setup on a background thread (populate.h;
  // env MC_CXL_PREFAULT=0 turns it off): puts and reads then do not fault on
  // a first touch. Setup does not wait for it.
  bool prefault_pool = true;
  // Key namespace (tenant.h): "" or "default" = keys stored unchanged.
  std::string tenant = "default";
  // SSD tier. The client reads records of disk-resident objects
  // itself when it can open the tier's directory (the master's --root_fs_dir,
  // or this host's path for it: MOONCAKE_OFFLOAD_FILE_STORAGE_PATH), unless
  // tier_direct_read is off (MC_CXL_TIER_DIRECT_READ=0); otherwise it asks
  // the master to stage them into the pool.
  std::string offload_path_override;
  bool tier_direct_read = true;
  bool enable_ssd_offload = false;  // accepted as in the reference; reads of the tier work either way
  // Zero-copy calls accept only ranges inside a registered buffer
  // (MC_CXL_STRICT_BUFFERS=1, setup(strict_buffers=True)): Mooncake's
  // contract. Off: unregistered memory is accepted too.
  bool strict_buffers = false;
  // A DRAM segment of this many bytes beside the pool (client_segment.cc;
  // 0 = none): a MAP_SHARED memfd named at Attach, where the master may
  // place this client's puts. The Python setup sets it from
  // global_segment_size when MC_CXL_DRAM_SEGMENT=1.
  uint64_t dram_segment_size = 0;
  // DRAM segments over the Transfer Engine (unset: none; the binding sets
  // them to its Python engine, segment_te.py). serve_segment registers this
  // client's segment and returns its session ("" = not served: only the
  // owner reads it); read_peer_segment copies n bytes at `offset` of the
  // segment served at `session` into dst (false: the transfer failed).
  std::function<std::string(char* base, uint64_t size)> serve_segment;
  std::function<bool(const std::string& session, uint64_t offset, char* dst, uint64_t n)> read_peer_segment;
};

struct PutOptions {
  uint32_t flags = 0;  // EntryFlags: kFlagHardPin, kFlagSoftPin
  uint64_t soft_pin_ttl_ms = 0;  // 0 = the master's default
  // Eviction groups: one per key, or one for every key, or none.
  std::vector<std::string> group_ids;
  // DRAM segments: the segment asked for (a client's local_hostname), and
  // prefer_alloc_in_same_node (this client's own).
  std::string preferred_segment;
  bool same_node = false;
};

struct ConstSlice {
  const void* data;
  uint64_t size;
};
struct MutSlice {
  void* data;
  uint64_t size;
};

// The parts of one value to put: concatenated in order.
using PutParts = std::vector<ConstSlice>;

// One range of get_into_ranges: `size` bytes at `src_offset` of the value.
struct RangeCopy {
  uint64_t src_offset;
  void* dst;
  uint64_t size;
};

// Where a read puts the value it located: the whole value scattered over
// `slices` in order (together at least the value's size, else the read
// fails with INVALID_PARAMS), or, when `ranges` is set, only those ranges of
// it (a range outside the value is skipped).
struct ReadDest {
  const MutSlice* slices = nullptr;
  size_t nslices = 0;
  const RangeCopy* ranges = nullptr;
  size_t nranges = 0;
};

// The caller's side of a read (Client::Get): told the size of the value once
// its key is located, says where the bytes go. Place is called again on each
// retry (the entry changed under the copy; the new version may differ in
// size), with the client's life lock held shared: it may block (the binding
// takes the GIL there to allocate), but must not call into the client. An
// error it returns ends the read with that error.
class ReadSink {
 public:
  virtual Status Place(uint64_t size, ReadDest* dest) = 0;

 protected:
  ~ReadSink() = default;
};

// A zero-copy view of a value in the pool, pinned: the master keeps its
// extent (and refuses unforced removes) until Unpin, also past this client's
// close(), a reclaim of its slot while it lives, or a master restart (the
// slot is retired with its pin table; see master_pins.cc).
struct PinnedView {
  const char* data = nullptr;
  uint64_t size = 0;
  uint32_t record = 0;           // index in the pin table of `slot`
  uint32_t slot = 0;             // client slot whose table holds the record
  uint64_t slot_generation = 0;  // the attachment that pinned it
  uint64_t object_offset = 0;    // what the record names
  uint64_t generation = 0;
};

class Client {
 public:
  static Result<std::shared_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();

  Status Close();
  // 0 healthy, 1 closed, 2 master unreachable.
  int HealthCheck();
  // Sends the queued leases now and waits for a send in flight (this
  // client's removes do it first; a test does before it asks the master
  // whether leases lapsed); nothing on a coherent pool.
  void FlushLeases();
  bool closed() const;

  // Per-key results (OK or an error), one master round trip for all keys.
  std::vector<ErrorCode> Put(const std::vector<std::string_view>& keys,
                             const std::vector<PutParts>& values, const PutOptions& options,
                             bool upsert);
  // The same, the values as one flat list: key i's parts are
  // parts[first[i] .. first[i+1]) (first: keys.size() + 1 entries).
  std::vector<ErrorCode> Put(const std::vector<std::string_view>& keys, const std::vector<ConstSlice>& parts,
                             const std::vector<size_t>& first, const PutOptions& options, bool upsert);
  // Put of one key whose value is `parts` (same results), without per-key
  // vectors: the small-put fast path.
  ErrorCode PutOne(std::string_view key, const ConstSlice* parts, size_t nparts, const PutOptions& options,
                   bool upsert);

  // One-sided reads. Locate finds the newest COMPLETE entry (no copy, no
  // lease). Get locates the key, asks `sink` where the value goes, copies it
  // and re-checks the entry, retrying (a bounded number of times) a copy
  // that raced with a writer; a read extends the object's lease and counts
  // as a hit or a miss (RecordRead). Result: the value's size, or
  // OBJECT_NOT_FOUND, or the sink's error.
  Result<EntrySnapshot> Locate(std::string_view key);
  Result<uint64_t> Get(std::string_view key, ReadSink& sink);
  // Get into caller slices: INVALID_PARAMS (logged) when the value does not
  // fit them.
  Result<uint64_t> GetInto(std::string_view key, const MutSlice* dsts, size_t ndsts);
  // Reads served from the SSD tier by this client (get_offload_rpc_read_count).
  uint64_t offload_read_count() const { return offload_reads_.load(std::memory_order_relaxed); }
  // True once the background population of this client's mapping (setup
  // with MC_CXL_PREFAULT) mapped the whole plan; false while it runs or when
  // none was started.
  bool populated() const { return populator_.done(); }
  // Where the tier is for this client ("" = no tier) and whether it reads it itself.
  std::string tier_root() const;
  uint64_t dram_segment_size() const { return segment_size_; }  // 0: no DRAM segment
  // The TE session this client reads a kInSegment snapshot's value from:
  // "" when it is in this client's own segment (or the owner serves none,
  // or there is no engine here); get_replica_desc's read_by. *owner_slot:
  // the slot whose segment holds it (kNoSlot when the stub is unreadable).
  std::string PeerSegmentSession(const EntrySnapshot& snap, std::string_view key, uint32_t* owner_slot);
  bool tier_direct() const;
  // Counts a data read (get, get_into, get_buffer, ranges) as a hit or a
  // miss in this client's slot, where the master sums them for /metrics.
  void RecordRead(bool hit);
  void RecordReads(uint64_t hits, uint64_t misses);
  // GetInto of many keys in one call: key i's value goes to dsts[first[i],
  // first[i+1]); (*out)[i] (preset: non-zero skips the key) becomes the bytes
  // read or an error. Every key is looked up before any is copied (their
  // cache misses overlap); each copy is validated as GetInto's is, and a key
  // that changed meanwhile is looked up again.
  void BatchGetInto(const std::vector<std::string_view>& keys, const std::vector<MutSlice>& dsts,
                    const std::vector<size_t>& first, std::vector<int64_t>* out);
  // 1 present, 0 absent, negative on error. Grants a lease like Mooncake's.
  int IsExist(std::string_view key);
  // IsExist of many keys, every key's lookup started before any is probed
  // (their cache misses overlap), one lease deadline for the batch.
  std::vector<int> BatchIsExist(const std::vector<std::string_view>& keys);
  Result<uint64_t> GetSize(std::string_view key);
  // Per range: bytes copied, INVALID_PARAMS (range outside the value) or the
  // lookup's error; the ranges are copied from one consistent version.
  std::vector<int64_t> GetRanges(std::string_view key, const std::vector<RangeCopy>& ranges);

  // Holds (client_hold.cc; the kv hand-off's "hold until consumed"): a hold
  // is a lease. HoldLeases raises each key's lease to until_ns (clamped to
  // now + kMaxHoldNs), so eviction and unforced removes leave the object
  // until then, also when the holder dies. ReleaseLeases lowers a lease that
  // reaches past a read's (now + the lease ttl) back to that, so a released
  // object is evictable once a reader's lease would have lapsed. Per key: OK,
  // or the lookup's error. One-sided: no master round trip.
  static constexpr uint64_t kMaxHoldNs = kMaxLeaseHoldNs;
  std::vector<ErrorCode> HoldLeases(const std::vector<std::string_view>& keys, uint64_t until_ns);
  std::vector<ErrorCode> ReleaseLeases(const std::vector<std::string_view>& keys);

  // Zero-copy views. PinValue costs no master round trip (unless the slot
  // was lost: it re-attaches first): it claims a record in this client's pin
  // table and re-validates the entry. Unpin works after Close too (the
  // master keeps a closed client's table while it holds views).
  Result<PinnedView> PinValue(std::string_view key);
  void Unpin(const PinnedView& view);
  // True while the view's pin record still names its object: the master
  // has not dropped it (the one case: another host's retired client past
  // --put_start_release_timeout_sec). Checked by BufferHandle on each access.
  bool PinHeld(const PinnedView& view) const;

  // Registered caller memory (register_buffer). Registration validates
  // ranges and pre-faults pages; unregistered memory works too.
  Status RegisterBuffer(uintptr_t ptr, uint64_t size);
  Status UnregisterBuffer(uintptr_t ptr);
  // INVALID_PARAMS (logged) when [ptr, ptr+size) is null, wraps, or overlaps a
  // registered buffer without lying inside it (with strict_buffers: or lies
  // inside none).
  Status CheckRange(uintptr_t ptr, uint64_t size, const char* op) const;
  // CheckRange of [base+offset, +size), a range given relative to `base`
  // (get_into_ranges): when base lies inside a registered buffer, the range
  // must lie inside that same buffer; an offset that wraps is refused.
  Status CheckRangeFrom(uintptr_t base, uint64_t offset, uint64_t size, const char* op) const;

  // Announcement channels (announce.h): the tenant's channel `name`, held
  // open by this attachment until AnnounceClose (or the attachment's end).
  // NO_AVAILABLE_HANDLE: this client holds its cap, or every channel is held.
  struct AnnounceChannel {
    uint32_t channel = 0;
    uint64_t name_hash = 0;
  };
  Result<AnnounceChannel> AnnounceOpen(std::string_view name);
  void AnnounceClose(const AnnounceChannel& ch);

  ErrorCode Remove(std::string_view key, bool force);
  std::vector<int32_t> BatchRemove(const std::vector<std::string_view>& keys, bool force);
  Result<uint64_t> RemoveByRegex(const std::string& pattern, bool force);
  Result<uint64_t> RemoveAll(bool force);

  const std::string& local_hostname() const { return options_.local_hostname; }
  std::shared_ptr<Pool> pool() const { return pool_; }

 private:
  // Locates each key and applies `act` to its entry (HoldLeases,
  // ReleaseLeases, BatchIsExist), with life_mu_ held shared: the per-key
  // result is the lookup's error or act's. Every key is scoped and its home
  // entry's load started (BatchKey) before the first lookup.
  std::vector<ErrorCode> ForEachLocated(const std::vector<std::string_view>& keys,
                                        const std::function<ErrorCode(const EntrySnapshot&)>& act);
  // A key of a batch lookup: as stored, its hash, and whether ScopeKey took it.
  struct BatchKey {
    std::string buf;
    std::string_view stored;
    uint64_t hash = 0;
    bool ok = false;
  };
  // Scopes and hashes `key` into *k and starts loading its home index entry,
  // so that a batch's lookups overlap their cache misses; k->ok as ScopeKey.
  void PrepareLookup(std::string_view key, const char* op, BatchKey* k) const;
  explicit Client(const ClientOptions& options);
  Status Attach(bool initial);
  // One master call; re-attaches after a lost connection or a reclaimed slot
  // and retries once when that is safe (idempotent, or the master restarted).
  Result<std::string> MasterCall(MessageType type, const std::function<std::string()>& build,
                                 bool idempotent);
  // One MasterCall per chunk of at most `chunk` of `items` (a Request with
  // .client and .items; a Reply with .status; definition in
  // client_internal.h): take(begin, end, st, reply) merges a chunk's per-item
  // results, where st is the call's error, RPC_FAIL for a reply that does not
  // decode, or the reply's status. take's error ends the walk and is returned.
  // RemoveByRegex and RemoveAll (kRemoveAll's pattern is empty): one master call.
  Result<uint64_t> RemoveMatching(MessageType type, const std::string& pattern, bool force);
  template <class Request, class Reply, class Items, class Take>
  Status MasterCallInChunks(MessageType type, const Items& items, size_t chunk, bool idempotent, Take&& take);
  void HeartbeatLoop();
  // One request over this client's rings: the reply payload, NOT_SUPPORTED
  // when the frame is too big for a ring (the caller uses TCP), RPC_FAIL when
  // the master died or restarted meanwhile, RPC_TIMEOUT.
  Result<std::string> RingCall(MessageType type, const std::string& payload);
  Result<std::string> CallOnce(MessageType type, const std::string& payload);
  // The same with caller buffers (the put path keeps them per thread, so a
  // call allocates nothing): `build` writes the request into *req, the
  // reply payload lands in *reply.
  Status MasterCallInto(MessageType type, const std::function<void(std::string*)>& build, bool idempotent,
                        std::string* req, std::string* reply);
  Status CallOnceInto(MessageType type, const std::string& payload, std::string* reply);
  Status RingCallInto(MessageType type, std::string_view payload, std::string* reply);
  // Checks a caller's key (not empty, not in another namespace, short enough
  // once scoped) and returns it as stored (tenant.h), in *buf when scoped.
  // Each call scopes its keys once, here; everything below takes stored keys.
  bool ScopeKey(std::string_view key, const char* op, std::string* buf, std::string_view* stored) const;
  // The same for keys already scoped (internal calls).
  bool ValidKey(std::string_view key, const char* op) const;
  Result<EntrySnapshot> LocateStored(std::string_view stored);
  // ---- the read loop (read_loop.h), with life_mu_ held shared or read_gate_ entered ----
  struct ReadTally {
    uint64_t hits = 0, misses = 0;
  };
  // Locates `stored` (or starts from *first), applies `step` to the entry
  // (true: done; false: the entry changed, locate again; an error ends the
  // read), then extends the lease (to lease_until_ns, 0 = now + the ttl)
  // and counts the hit or miss in *tally. The value's size, or the error.
  template <class Step>
  Result<uint64_t> ReadLoop(std::string_view stored, uint64_t hash, const EntrySnapshot* first,
                            uint64_t lease_until_ns, ReadTally* tally, Step&& step);
  // ReadLoop's step for copies: sink.Place, then CopyLocked.
  Result<bool> CopyStep(const EntrySnapshot& snap, std::string_view stored, ReadSink& sink);
  // Copies the entry's value to `dest` and re-checks the entry (false: changed).
  Result<bool> CopyLocked(const EntrySnapshot& snap, std::string_view stored, const ReadDest& dest);
  // Get of a caller's key, `op` naming the call in log lines.
  Result<uint64_t> GetScoped(std::string_view key, const char* op, ReadSink& sink);
  // PinValue's claim of a record in this client's pin table for `snap`
  // (filling *v): *slot_lost when the slot is no longer ours (nothing claimed).
  Status ClaimPin(const EntrySnapshot& snap, std::string_view stored, PinnedView* v, bool* slot_lost);
  std::string tenant_prefix_;  // TenantPrefix(options_.tenant)
  // ---- SSD tier (client_tier.cc) ----
  struct TierView {
    std::string root;        // "" = no tier
    bool direct = false;     // this process can open root: reads records itself
    bool promotion = false;  // the master counts disk reads (--promotion_on_hit)
  };
  std::shared_ptr<const TierView> Tier() const;
  void LoadTier();  // at attach: from the superblock the master wrote
  // Copies the value of a kOnDisk snapshot: from the record, or by staging
  // it into the pool (false: Locate again, as for a torn pool copy).
  Result<bool> CopyFromDisk(const EntrySnapshot& snap, std::string_view key, const ReadDest& dest);
  // Asks the master to copy a kOnDisk object into the pool and waits (up to
  // a few seconds) until the entry changed: OK, or an error (a miss).
  Status StageAndWait(const EntrySnapshot& snap, std::string_view key);
  void SendPromote(std::string_view key, uint64_t generation, bool stage);
  mutable std::mutex tier_mu_;
  // ---- DRAM segment (client_segment.cc) ----
  Status MapSegment();  // at Connect, when options_.dram_segment_size > 0
  void UnmapSegment();
  // Copies the value of a kInSegment snapshot from this client's own
  // segment and re-checks the entry (false: changed, locate again); another
  // client's segment, or a stub that does not fit the segment, is a miss.
  Result<bool> CopyFromSegment(const EntrySnapshot& snap, std::string_view key, const ReadDest& dest);
  // Where a put the master placed in a segment goes in this process, or
  // nullptr (logged) when the reply does not name a range of our segment.
  char* SegmentTarget(const PutStartItem& it, uint64_t size) const;
  // Another client's segment: its session and size from the master
  // (kSegmentSession, cached per attachment), a range check, a TE copy into
  // a scratch buffer, the entry's re-check, then the caller's bytes.
  struct PeerSegment {
    ErrorCode status = ErrorCode::OBJECT_NOT_FOUND;
    uint64_t size = 0;
    std::string session;
  };
  Result<bool> CopyFromPeerSegment(const EntrySnapshot& snap, std::string_view key, const SegmentStub& stub,
                                   const ReadDest& dest);
  PeerSegment FindPeerSegment(uint32_t slot, uint64_t generation, bool fresh);
  std::mutex peer_mu_;  // guards peers_ (never held across a call)
  std::map<std::pair<uint32_t, uint64_t>, PeerSegment> peers_;
  std::string segment_session_;  // this client's segment's TE session ("" = not served)
  char* segment_base_ = nullptr;
  uint64_t segment_size_ = 0;
  int segment_fd_ = -1;
  std::shared_ptr<const TierView> tier_view_;
  // Relaxed: a statistic.
  std::atomic<uint64_t> offload_reads_{0};
  // One PutStart round trip for the n keys keys[i] (sizes[i], groups[i]),
  // encoded from views into per-thread buffers. The whole request's status;
  // *reply (per thread: valid until this thread's next PutStart) holds n
  // items when it is OK.
  ErrorCode PutStartCall(PutStartRequest* req, size_t n, const std::string_view* keys, const uint64_t* sizes,
                         const std::string_view* groups, const PutStartReply** reply);
  // One PutStart for the keys `todo`, then the copies and publishes. Keys
  // refused for space go to *no_room; every other result into *out.
  void PutOnce(const std::vector<std::string_view>& keys, const std::vector<ConstSlice>& parts,
               const std::vector<size_t>& first, const std::vector<uint64_t>& sizes, const PutOptions& options, bool upsert,
               const std::vector<size_t>& todo, std::vector<ErrorCode>* out, std::vector<size_t>* no_room);
  uint64_t LeaseTtlNs() const;
  // SSD tier: waits until Superblock::tier_tombs_durable reaches `ticket`
  // (0: at once): the tombstones of a remove / settled put are written, so a
  // master SIGKILL and a --format rebuild cannot bring the old value back.
  // Spins briefly, then sleeps in short steps; at most kTombWaitNs (then
  // RPC_TIMEOUT, logged); RPC_FAIL when the master restarted meanwhile.
  static constexpr uint64_t kTombWaitNs = 10ull * 1000000000ull;
  Status WaitTombstones(uint64_t ticket);
  // kSettle for the puts (key, generation) just published whose PutStart
  // asked for it, then WaitTombstones.
  Status Settle(const std::vector<std::pair<std::string, uint64_t>>& items);
  // The value's copy for one granted item, in chunks with PutStillOurs
  // before each; false (copy stopped) once the put is no longer ours.
  bool CopyValueChecked(const ConstSlice* parts, size_t nparts, char* dst, const PutStartItem& it,
                        const ClientRef& owner);
  // PutOnce of one key (PutOne): its result, or *no_room set for a retry.
  ErrorCode PutOnceOne(std::string_view key, const ConstSlice* parts, size_t nparts, uint64_t size,
                       std::string_view group, const PutOptions& options, bool upsert, bool* no_room);
  // After a PutStart: forget the abandoned ids it carried (answered), or
  // remember this put_id as abandoned (no answer).
  // A PutStart's id, the abandoned ids to resend, upsert and the config.
  void FillPutStartHead(const PutOptions& options, bool upsert, PutStartRequest* req);
  void NoteAbandoned(bool answered, const std::vector<uint64_t>& sent, uint64_t put_id);
  // Copy and publish of one granted item: the key's result, or *no_room.
  // With `deferred` (a non-coherent pool) the publish is left to the
  // master: the item is appended there and OK returned after the copy.
  ErrorCode FinishPutItem(std::string_view key, const ConstSlice* parts, size_t nparts, uint64_t size,
                          const PutStartItem& it, const ClientRef& owner, bool* no_room,
                          std::vector<std::pair<uint64_t, uint64_t>>* deferred = nullptr);
  bool PutStillOurs(const PutStartItem& it, const ClientRef& owner) const;

  // ---- a non-coherent pool (client_noncoherent.cc): the master writes ----
  // True when the pool was formatted --coherence=noncoherent.
  static bool NonCoherent() { return NonCoherentMode(); }
  // A read's lease: the entry CAS on a coherent pool, else queued for the
  // master (kLeases, sent by the lease thread).
  void RaiseLease(const EntrySnapshot& s, uint64_t until_ns);
  // kLeases for the items now (per item OK, OBJECT_NOT_FOUND or the error).
  std::vector<int32_t> SendLeases(const std::vector<LeaseItem>& items);
  void LeaseLoop();
  void StopLeaseThread();
  // At setup on a non-coherent pool: an empty kLeases, which a master
  // without the discipline answers "unknown type" (INVALID_VERSION then).
  Status CheckMasterFoldsLeases();
  // HoldLeases / ReleaseLeases (lower) on a non-coherent pool: one kLeases.
  std::vector<ErrorCode> HoldByMaster(const std::vector<std::string_view>& keys, uint64_t until_ns, bool lower);
  // kPublish of (entry_slot, generation) items whose values this client
  // wrote and wrote back; per item OK or TRANSFER_FAIL in *results, or the
  // call's error. Waits for an upsert's tombstones as Settle does.
  ErrorCode PublishByMaster(const std::vector<std::pair<uint64_t, uint64_t>>& items,
                            std::vector<ErrorCode>* results);
  // True while `slot` in the pool still has generation `gen` (the master has
  // not reclaimed it): a stale client must not touch that slot's rings.
  bool SlotCurrent(uint32_t slot, uint64_t gen) const;

  // etcd:// (--enable_ha): the leader's "host:port" from its record in
  // etcd, waiting until `deadline_mono_ns` for one that serves.
  Status FindLeader(uint64_t deadline_mono_ns, std::string* host, int* port);
  std::unique_ptr<EtcdClient> etcd_;  // null: a fixed master address
  std::string leader_key_;
  // The pool's term when we attached (0 without HA). Relaxed: written under
  // attach_mu_, compared with the superblock's on each reply; a stale value
  // only costs a re-attach.
  std::atomic<uint64_t> term_{0};
  bool TermSuperseded() const;

  ClientOptions options_;
  std::shared_ptr<Pool> pool_;
  std::unique_ptr<ObjectIndex> index_;
  std::unique_ptr<RpcClient> rpc_;
  std::mutex attach_mu_;
  // Relaxed: read together with attach_mu_-protected updates; a stale pair
  // only yields ILLEGAL_CLIENT from the master, which triggers a re-attach.
  std::atomic<uint32_t> slot_{0};
  std::atomic<uint64_t> slot_generation_{0};
  std::atomic<uint64_t> incarnation_{0};
  uint8_t uuid_[16] = {};
  uint8_t token_[16] = {};     // the pool's credential (access.h), read from the mapped pool
  uint64_t machine_hash_ = 0;  // KeyHash(gethostname())
  // The slot this client holds, as requests name it (relaxed, see above).
  ClientRef Ref() const {
    return {slot_.load(std::memory_order_relaxed), slot_generation_.load(std::memory_order_relaxed)};
  }
  // Bootstrap: asks the master where its pool is (Ping), maps it, checks its
  // uuid and reads the token that Attach presents.
  Status MapPool();

  // PutStart ids, and those that got no answer (sent with the next PutStart).
  std::atomic<uint64_t> next_put_id_{1};
  std::mutex abandoned_mu_;
  std::vector<uint64_t> abandoned_puts_;

  // CXL RPC: this slot's request (we produce) and reply (we consume) rings.
  // ring_slot_/ring_generation_: the attachment the rings belong to (set
  // with them under ring_mu_, so a call never pairs new ids with old rings).
  std::mutex ring_mu_;
  ShmRing ring_requests_, ring_replies_;
  uint32_t ring_slot_ = 0;
  uint64_t ring_generation_ = 0;
  uint64_t ring_next_id_ = 1;
  // MonoNs of the last kill(pid, 0) probe of the master (under ring_mu_): a
  // syscall, so made at most every kMasterPidProbeNs on the call path.
  uint64_t ring_pid_probe_ns_ = 0;
  SpinWait ring_spin_{true};  // polling policy of reply waits (under ring_mu_); no yields to a hog

  // Pin records of the table of slot pin_slot_: free list and high-water
  // mark. A re-attach to the same slot keeps the table (and so these).
  std::mutex pin_mu_;
  std::vector<uint32_t> free_pins_;
  uint32_t pin_high_water_ = 0;
  uint32_t pin_slot_ = UINT32_MAX;

  mutable std::shared_mutex registry_mu_;
  std::map<uintptr_t, uint64_t> registered_;  // start -> size

  mutable std::shared_mutex life_mu_;  // shared: calls in flight; unique: Close
  bool closed_ = false;                // under life_mu_
  // The single-key reads (GetScoped, LocateStored) and closed() use this
  // instead of life_mu_ (its two rwlock passes were ~160 of a 4 KiB get's
  // ~3,800 instructions); Close shuts it, under life_mu_, after closed_.
  ReaderGate read_gate_;
  std::mutex hb_mu_;
  std::condition_variable hb_cv_;
  bool hb_stop_ = false;
  std::thread hb_thread_;
  // Leases queued for the master on a non-coherent pool, by entry slot; the
  // thread that sends them starts with the first.
  std::mutex lease_mu_;
  std::mutex lease_send_mu_;  // held while queued leases are sent (FlushLeases)
  std::condition_variable lease_cv_;
  std::unordered_map<uint64_t, LeaseItem> pending_leases_;
  bool lease_stop_ = false;
  std::thread lease_thread_;
  // Bumped per ring call and per read: the populator defers while the
  // store is in use (populate.h).
  ActivityCounter calls_seen_;
  // The end of the latest extent a put was handed: the populator maps just
  // ahead of it while puts keep coming (populate.h). Relaxed: a hint read
  // by the populating thread of this process; nothing is published by it.
  std::atomic<uint64_t> put_frontier_{0};
  BackgroundPopulator populator_;  // reads pool_; stopped by Close
};

}  // namespace mcxl
