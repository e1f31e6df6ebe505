// The master's requests and replies: types and their payload codecs.
//
// Contract: every request payload is decoded by one Decode* function that
// returns false on any malformed input; every reply begins with an i32
// ErrorCode. Adding a field to a message is a new kProtocolVersion.
//
// Access (access.h): Ping is the bootstrap (it tells where the pool is) and
// needs no credential; Attach carries the pool's token; every other request
// begins with the ClientRef of the slot bound to its connection or ring, and
// is refused with ILLEGAL_CLIENT otherwise.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mooncake_cxl/common/error_code.h"
#include "mooncake_cxl/control/message.h"

namespace mcxl {

enum class MessageType : uint16_t {
  kError = 0,  // reply to a frame the master could not decode
  kPing = 1,
  kAttach = 2,
  kDetach = 3,
  kPutStart = 4,
  kRemove = 5,
  kBatchRemove = 6,
  kRemoveByRegex = 7,
  kRemoveAll = 8,
  kHeartbeat = 9,
  kPromote = 10,  // SSD tier: a disk read (promotion on hit) or a stage request
  kSettle = 11,   // SSD tier: an upsert is published; its older values go now (durably)
  kAnnounceOpen = 12,   // announce.h: the tenant's channel of a name, named if need be, held open
  kAnnounceClose = 13,  // announce.h: one hold of a channel dropped
  kLocate = 14,   // remote clients: where keys' values lie (no pool mapping to probe)
  kPublish = 15,  // remote clients: the publishing CAS, done by the master
  kLeases = 16,   // non-coherent pools: a client's lease changes, folded in by the master
  kSegmentSession = 17,  // DRAM segments: where another client's segment is served (its TE session)
};
const char* MessageTypeName(uint16_t type);
// Requests whose handling scans the whole index in slices (RemoveByRegex,
// RemoveAll): they may take long, though never holding the master's lock for
// long, so a transport runs them off its main loop (TcpServer's worker).
// Over a ring they are refused with NOT_SUPPORTED: the client sends them
// over TCP.
bool RunsInSlices(uint16_t type);
// An upper bound of the reply payload's bytes to the request `payload` of
// `type`, for the one request whose reply can outgrow it (PutStart: 29 bytes
// per key, more than a short key costs in the request); 0 for the others
// (a fixed small reply, or one no larger than the request). A transport
// with a frame limit checks it before sending (client) and before serving
// (master): a reply that could not be pushed is never produced.
uint64_t ReplyBytesBound(uint16_t type, std::string_view payload);

// Per-request limits, so that one request's time under the master's lock is
// bounded; over a limit the master answers INVALID_PARAMS with a log line.
// The client never exceeds them: it splits a larger batch (Client::Put,
// BatchRemove) into requests of at most kMaxRequestKeys keys and
// kMaxRequestBytes of payload, and sends at most 64 abandoned put ids.
constexpr uint32_t kMaxRequestKeys = 4096;      // PutStart keys, BatchRemove keys
constexpr uint32_t kMaxAbandonedIds = 1024;     // PutStart abandoned put ids
constexpr uint32_t kMaxRequestBytes = 16u << 20;  // what the client packs in one request

struct AttachRequest {
  std::string local_hostname;  // the client's host:port identity
  std::string machine;         // gethostname(): tells the master a pid is local
  uint64_t pid = 0;
  uint32_t prev_slot = 0;      // re-attach: keep the slot if still ours
  uint64_t prev_generation = 0;
  uint8_t token[16] = {};      // Superblock::auth_token of the pool the client mapped
  std::string tenant = "default";  // the client's key namespace (tenant.h)
  // A client that cannot map the pool (remote, over the Transfer Engine)
  // has no token: it presents the operator's secret (--auth_token_file).
  std::string secret;
  // DRAM segment (MC_CXL_DRAM_SEGMENT=1 and global_segment_size > 0): bytes
  // of this client's segment (0 = none) and the Transfer Engine session
  // serving it ("" = none: only its owner reads it).
  uint64_t segment_size = 0;
  std::string segment_session;
};
struct AttachReply {
  ErrorCode status = ErrorCode::OK;
  uint32_t slot = 0;
  uint64_t slot_generation = 0;
  uint64_t incarnation = 0;
  std::string pool_path;
  uint64_t pool_size = 0;
  uint8_t uuid[16] = {};
  uint64_t lease_ttl_ms = 0;
  // For remote clients: the Transfer Engine serving the pool ("" = none),
  // and where the index and the tombstone word lie in it.
  std::string te_protocol;
  std::string te_session;
  uint64_t index_offset = 0;
  uint64_t index_capacity = 0;
  uint64_t tombs_word_offset = 0;
};

struct ClientRef {
  uint32_t slot = 0;
  uint64_t generation = 0;
};

struct PutConfigWire {
  uint32_t flags = 0;  // EntryFlags: hard/soft pin
  uint64_t soft_pin_ttl_ms = 0;
};
struct PutStartRequest {
  ClientRef client;
  // Client-chosen id of this PutStart, and ids of earlier ones the client gave
  // up on (timed out): the master revokes what those allocated, and refuses
  // them should they arrive late, so an abandoned put never leaves an
  // unfinished entry that makes a retry look like "key exists".
  uint64_t put_id = 0;
  std::vector<uint64_t> abandoned;
  bool upsert = false;
  PutConfigWire config;
  // DRAM segments: kPlaceSegment (the putter has a segment: only then may
  // the master place there, and the reply's items may carry a segment),
  // kPlaceSameNode (prefer_alloc_in_same_node: the putter's own), kPlaceNamed:
  // preferred_segment (a client's local_hostname) follows on the wire.
  // Without a segment the request and reply are those of a pool put.
  uint8_t placement = 0;
  std::string preferred_segment;  // meaningful with kPlaceNamed
  std::vector<std::string> keys;
  std::vector<uint64_t> sizes;
  std::vector<std::string> groups;  // per key; "" = no group
};
struct PutStartItem {
  // OK, or an error; OBJECT_REPLICA_BUSY means "no room now, but leased,
  // viewed or unfinished objects will free some": the client retries.
  ErrorCode status = ErrorCode::OK;
  uint64_t entry_slot = 0;
  uint64_t generation = 0;
  uint64_t value_offset = 0;  // in the pool, or in the segment below
  // Placed in a DRAM segment: the owner's slot and its generation (0 = in
  // the pool; on the wire only when nonzero). The putter writes value_offset
  // of that segment and publishes the entry kInSegment.
  uint32_t segment_slot = 0;
  uint64_t segment_generation = 0;
  // SSD tier: an older value of the key has a record on disk. After its
  // publishing CAS the client sends kSettle, so that the old record is
  // tombstoned before the upsert returns (else a --format rebuild could
  // bring the old value back).
  bool settle = false;
};
constexpr uint8_t kPlaceSameNode = 1;
constexpr uint8_t kPlaceNamed = 2;
constexpr uint8_t kPlaceSegment = 4;
struct PutStartReply {
  ErrorCode status = ErrorCode::OK;  // of the request as a whole
  std::vector<PutStartItem> items;
};

struct RemoveRequest {
  ClientRef client;
  std::vector<std::string> keys;  // kRemove carries one
  bool force = false;
};
struct RemoveReply {
  ErrorCode status = ErrorCode::OK;
  std::vector<int32_t> results;  // kBatchRemove: per key
  // SSD tier: nonzero when the removal queued tombstones; the client returns
  // once Superblock::tier_tombs_durable reaches it (Client::WaitTombstones).
  uint64_t tomb_ticket = 0;
};
struct RemoveByRegexRequest {
  ClientRef client;
  std::string pattern;  // empty for kRemoveAll
  bool force = false;
};
struct CountReply {
  ErrorCode status = ErrorCode::OK;
  uint64_t count = 0;
  uint64_t tomb_ticket = 0;  // as RemoveReply's (RemoveAll, RemoveByRegex)
};
// kSettle: the upserts (key, generation) the client just published. The
// master unlinks their older values now (as Tick would) and answers with the
// ticket of their tombstones.
struct SettleRequest {
  ClientRef client;
  std::vector<std::pair<std::string, uint64_t>> items;
};
struct TicketReply {
  ErrorCode status = ErrorCode::OK;
  uint64_t tomb_ticket = 0;
};
// Ping is also the bootstrap: where the pool is, so that a client can map it
// and read the token before it attaches.
struct PingReply {
  ErrorCode status = ErrorCode::OK;
  uint64_t incarnation = 0;
  std::string pool_path;
  uint64_t pool_size = 0;
  uint8_t uuid[16] = {};
};

// A reader of a kOnDisk object: a disk read to count toward promotion, or
// (stage) a request to copy it into the pool now (a reader that cannot
// open the tier's directory). Answered at once; the copy is asynchronous.
struct PromoteRequest {
  ClientRef client;
  std::string key;  // stored (tenant-scoped)
  uint64_t generation = 0;
  bool stage = false;
};

// kAnnounceOpen: the channel `name` of the client's tenant (named now if no
// channel carries it), held open by the client until kAnnounceClose or the
// end of its attachment. The reply's name_hash is what the channel header
// carries while the name is the channel's.
constexpr uint32_t kMaxChannelNameBytes = 4096;
struct AnnounceOpenRequest {
  ClientRef client;
  std::string name;  // as the client gave it (the master scopes it by tenant)
};
struct AnnounceOpenReply {
  ErrorCode status = ErrorCode::OK;
  uint32_t channel = 0;
  uint64_t name_hash = 0;
};
struct AnnounceCloseRequest {
  ClientRef client;
  uint32_t channel = 0;
  uint64_t name_hash = 0;
};

// kLocate: the newest readable entry of each (stored) key, as a local
// reader's FindComplete would find it, with a read's lease (until
// lease_until_ns when later: a hold). An object in the SSD tier is staged
// into the pool and answered REPLICA_IS_NOT_READY (locate again).
// lease_until_ns == kLocateToValidate: a re-check of a copy just made (the
// lease is extended, the read is not counted again as a hit or miss);
// kLocatePeek: where the key is, nothing more (no lease, not a read).
constexpr uint64_t kLocateToValidate = 1;
constexpr uint64_t kLocatePeek = 2;
struct LocateRequest {
  ClientRef client;
  std::vector<std::string> keys;
  uint64_t lease_until_ns = 0;
};
struct LocateItem {
  ErrorCode status = ErrorCode::OK;
  uint64_t entry_offset = 0;  // pool offset of the IndexEntry (re-read after the copy)
  uint64_t version = 0;       // the seqlock snapshot a copy is validated against
  uint64_t state_gen = 0;
  uint64_t value_offset = 0;  // pool offset of the value
  uint64_t value_size = 0;
  uint64_t put_time_ns = 0;
  std::string writer;  // the putting client's host (get_replica_desc)
};
struct LocateReply {
  ErrorCode status = ErrorCode::OK;
  std::vector<LocateItem> items;
};
// kPublish: puts (entry_slot, generation) of this client whose values it
// wrote; the master CASes each WRITING -> COMPLETE (and settles upserts).
struct PublishRequest {
  ClientRef client;
  std::vector<std::pair<uint64_t, uint64_t>> items;
};
struct PublishReply {
  ErrorCode status = ErrorCode::OK;
  std::vector<int32_t> results;  // per item: OK, or TRANSFER_FAIL (no longer this put)
  uint64_t tomb_ticket = 0;
};

// kLeases: on a non-coherent pool a client never writes an index entry; its
// read leases, holds and releases travel here and the master, the entry
// line's one writer, applies each to the entry if it still holds that
// state_gen (raise: a max; lower: down to until_ns, never below).
struct LeaseItem {
  uint64_t entry_slot = 0;
  uint64_t state_gen = 0;
  uint64_t until_ns = 0;
  bool lower = false;
};
struct LeasesRequest {
  ClientRef client;
  std::vector<LeaseItem> items;
};
// Reply: PublishReply's shape (per item OK, or OBJECT_NOT_FOUND: not that
// object any more); tomb_ticket unused.
// Items per kLeases or kPublish a client sends: request and reply stay
// well inside a ring frame.
constexpr uint32_t kMaxMasterFoldItems = 256;
// The furthest a lease or kv hold reaches ahead (Client::HoldLeases, the
// master's Locate and kLeases clamp to it).
constexpr uint64_t kMaxLeaseHoldNs = 3600ull * 1000000000ull;

// kSegmentSession: the Transfer Engine session serving the DRAM segment of
// the attachment (slot, generation) and the segment's size, so another
// in-pod reader can copy a stub's range over TE (client_segment.cc).
// OBJECT_NOT_FOUND: that attachment ended, or has no segment or session.
struct SegmentSessionRequest {
  ClientRef client;
  uint32_t slot = 0;
  uint64_t generation = 0;
};
struct SegmentSessionReply {
  ErrorCode status = ErrorCode::OK;
  uint64_t segment_size = 0;
  std::string session;
};

// Frame = header + payload.
std::string MakeFrame(MessageType type, uint64_t request_id, const std::string& payload);

void Encode(const AttachRequest& m, Encoder* e);
bool Decode(Decoder* d, AttachRequest* m);
void Encode(const AttachReply& m, Encoder* e);
bool Decode(Decoder* d, AttachReply* m);
void Encode(const ClientRef& m, Encoder* e);
bool Decode(Decoder* d, ClientRef* m);
void Encode(const PutStartRequest& m, Encoder* e);
bool Decode(Decoder* d, PutStartRequest* m);
// The bytes of Encode(m) for the n keys keys[i] (sizes[i], groups[i]; m's
// own vectors unused): a batch encoded from views, no per-key strings.
void EncodePutStartViews(const PutStartRequest& m, size_t n, const std::string_view* keys, const uint64_t* sizes,
                         const std::string_view* groups, Encoder* e);
void Encode(const PutStartReply& m, Encoder* e);
bool Decode(Decoder* d, PutStartReply* m);
void Encode(const RemoveRequest& m, Encoder* e);
bool Decode(Decoder* d, RemoveRequest* m);
void Encode(const RemoveReply& m, Encoder* e);
bool Decode(Decoder* d, RemoveReply* m);
void Encode(const RemoveByRegexRequest& m, Encoder* e);
bool Decode(Decoder* d, RemoveByRegexRequest* m);
void Encode(const CountReply& m, Encoder* e);
bool Decode(Decoder* d, CountReply* m);
void Encode(const SettleRequest& m, Encoder* e);
bool Decode(Decoder* d, SettleRequest* m);
void Encode(const TicketReply& m, Encoder* e);
bool Decode(Decoder* d, TicketReply* m);
void Encode(const PromoteRequest& m, Encoder* e);
bool Decode(Decoder* d, PromoteRequest* m);
void Encode(const AnnounceOpenRequest& m, Encoder* e);
bool Decode(Decoder* d, AnnounceOpenRequest* m);
void Encode(const AnnounceOpenReply& m, Encoder* e);
bool Decode(Decoder* d, AnnounceOpenReply* m);
void Encode(const AnnounceCloseRequest& m, Encoder* e);
bool Decode(Decoder* d, AnnounceCloseRequest* m);
void Encode(const PingReply& m, Encoder* e);
bool Decode(Decoder* d, PingReply* m);
void Encode(const LocateRequest& m, Encoder* e);
bool Decode(Decoder* d, LocateRequest* m);
void Encode(const LocateReply& m, Encoder* e);
bool Decode(Decoder* d, LocateReply* m);
void Encode(const PublishRequest& m, Encoder* e);
bool Decode(Decoder* d, PublishRequest* m);
void Encode(const LeasesRequest& m, Encoder* e);
bool Decode(Decoder* d, LeasesRequest* m);
void Encode(const PublishReply& m, Encoder* e);
bool Decode(Decoder* d, PublishReply* m);
void Encode(const SegmentSessionRequest& m, Encoder* e);
bool Decode(Decoder* d, SegmentSessionRequest* m);
void Encode(const SegmentSessionReply& m, Encoder* e);
bool Decode(Decoder* d, SegmentSessionReply* m);
// Reply carrying only a status (Detach, Heartbeat, kError).
void EncodeStatus(ErrorCode status, Encoder* e);
bool DecodeStatus(Decoder* d, ErrorCode* status);

}  // namespace mcxl
