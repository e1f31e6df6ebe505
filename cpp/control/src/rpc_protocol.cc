#include "mooncake_cxl/control/rpc_protocol.h"

namespace mcxl {

bool RunsInSlices(uint16_t type) {
  return type == uint16_t(MessageType::kRemoveByRegex) || type == uint16_t(MessageType::kRemoveAll);
}
namespace {
ErrorCode ReadStatus(Decoder* d) { return ErrorCode(d->I32()); }
constexpr uint64_t kPutStartReplyHead = 4 + 4;           // status, item count
constexpr uint64_t kPutStartReplyItem = 4 + 8 + 8 + 8 + 1;  // Encode(PutStartReply), in the pool
constexpr uint64_t kPutStartSegmentFields = 4 + 8;         // an item placed in a segment adds these
constexpr uint8_t kItemSettle = 1, kItemInSegment = 2;     // an item's flag byte
}  // namespace

uint64_t ReplyBytesBound(uint16_t type, std::string_view payload) {
  if (type != uint16_t(MessageType::kPutStart)) return 0;
  // The key count, read past the head as Decode(PutStartRequest) does; an
  // undecodable request gets a status-only reply.
  Decoder d(payload);
  ClientRef c;
  Decode(&d, &c);
  (void)d.U64();  // put_id
  for (uint32_t i = 0, n = d.Count(8); i < n; ++i) (void)d.U64();
  (void)d.U8();
  (void)d.U32();
  (void)d.U64();
  uint8_t placement = d.U8();
  if (placement & kPlaceNamed) (void)d.Str();
  uint32_t keys = d.Count(4 + 8 + 4);
  uint64_t item = kPutStartReplyItem + ((placement & kPlaceSegment) ? kPutStartSegmentFields : 0);
  return d.failed() ? 0 : kPutStartReplyHead + item * uint64_t(keys);
}

const char* MessageTypeName(uint16_t type) {
  switch (MessageType(type)) {
    case MessageType::kError: return "Error";
    case MessageType::kPing: return "Ping";
    case MessageType::kAttach: return "Attach";
    case MessageType::kDetach: return "Detach";
    case MessageType::kPutStart: return "PutStart";
    case MessageType::kRemove: return "Remove";
    case MessageType::kBatchRemove: return "BatchRemove";
    case MessageType::kRemoveByRegex: return "RemoveByRegex";
    case MessageType::kRemoveAll: return "RemoveAll";
    case MessageType::kHeartbeat: return "Heartbeat";
    case MessageType::kPromote: return "Promote";
    case MessageType::kSettle: return "Settle";
    case MessageType::kAnnounceOpen: return "AnnounceOpen";
    case MessageType::kAnnounceClose: return "AnnounceClose";
    case MessageType::kLocate: return "Locate";
    case MessageType::kPublish: return "Publish";
    case MessageType::kLeases: return "Leases";
    case MessageType::kSegmentSession: return "SegmentSession";
  }
  return "Unknown";
}

std::string MakeFrame(MessageType type, uint64_t request_id, const std::string& payload) {
  FrameHeader h{kFrameMagic, kProtocolVersion, uint16_t(type), uint32_t(payload.size()), 0,
                request_id};
  std::string out;
  out.reserve(sizeof(h) + payload.size());  // one allocation per frame
  out.append(reinterpret_cast<const char*>(&h), sizeof(h));
  out += payload;
  return out;
}

void Encode(const AttachRequest& m, Encoder* e) {
  e->Str(m.local_hostname);
  e->Str(m.machine);
  e->U64(m.pid);
  e->U32(m.prev_slot);
  e->U64(m.prev_generation);
  e->Raw(m.token, sizeof(m.token));
  e->Str(m.tenant);
  e->Str(m.secret);
  e->U64(m.segment_size);
  e->Str(m.segment_session);
}
bool Decode(Decoder* d, AttachRequest* m) {
  m->local_hostname = d->Str();
  m->machine = d->Str();
  m->pid = d->U64();
  m->prev_slot = d->U32();
  m->prev_generation = d->U64();
  d->Raw(m->token, sizeof(m->token));
  m->tenant = d->Str();
  m->secret = d->Str();
  m->segment_size = d->U64();
  m->segment_session = d->Str();
  return !d->failed() && d->done();
}

void Encode(const AttachReply& m, Encoder* e) {
  e->I32(ToInt(m.status));
  e->U32(m.slot);
  e->U64(m.slot_generation);
  e->U64(m.incarnation);
  e->Str(m.pool_path);
  e->U64(m.pool_size);
  e->Raw(m.uuid, 16);
  e->U64(m.lease_ttl_ms);
  e->Str(m.te_protocol);
  e->Str(m.te_session);
  e->U64(m.index_offset);
  e->U64(m.index_capacity);
  e->U64(m.tombs_word_offset);
}
bool Decode(Decoder* d, AttachReply* m) {
  m->status = ReadStatus(d);
  m->slot = d->U32();
  m->slot_generation = d->U64();
  m->incarnation = d->U64();
  m->pool_path = d->Str();
  m->pool_size = d->U64();
  d->Raw(m->uuid, 16);
  m->lease_ttl_ms = d->U64();
  m->te_protocol = d->Str();
  m->te_session = d->Str();
  m->index_offset = d->U64();
  m->index_capacity = d->U64();
  m->tombs_word_offset = d->U64();
  return !d->failed();
}

void Encode(const ClientRef& m, Encoder* e) {
  e->U32(m.slot);
  e->U64(m.generation);
}
bool Decode(Decoder* d, ClientRef* m) {
  m->slot = d->U32();
  m->generation = d->U64();
  return !d->failed();
}

namespace {
void EncodePutStartHead(const PutStartRequest& m, Encoder* e) {  // everything before the key count
  Encode(m.client, e);
  e->U64(m.put_id);
  e->U32(uint32_t(m.abandoned.size()));
  for (uint64_t id : m.abandoned) e->U64(id);
  e->U8(m.upsert ? 1 : 0);
  e->U32(m.config.flags);
  e->U64(m.config.soft_pin_ttl_ms);
  e->U8(m.placement);
  if (m.placement & kPlaceNamed) e->Str(m.preferred_segment);
}
}  // namespace

void Encode(const PutStartRequest& m, Encoder* e) {
  EncodePutStartHead(m, e);
  e->U32(uint32_t(m.keys.size()));
  for (size_t i = 0; i < m.keys.size(); ++i) {
    e->Str(m.keys[i]);
    e->U64(m.sizes[i]);
    e->Str(i < m.groups.size() ? m.groups[i] : std::string());
  }
}
void EncodePutStartViews(const PutStartRequest& m, size_t n, const std::string_view* keys, const uint64_t* sizes,
                         const std::string_view* groups, Encoder* e) {
  EncodePutStartHead(m, e);
  e->U32(uint32_t(n));
  for (size_t i = 0; i < n; ++i) {
    e->Str(keys[i]);
    e->U64(sizes[i]);
    e->Str(groups[i]);
  }
}
bool Decode(Decoder* d, PutStartRequest* m) {
  Decode(d, &m->client);
  m->put_id = d->U64();
  uint32_t na = d->Count(8);
  m->abandoned.resize(na);
  for (auto& id : m->abandoned) id = d->U64();
  m->upsert = d->U8() != 0;
  m->config.flags = d->U32();
  m->config.soft_pin_ttl_ms = d->U64();
  m->placement = d->U8();
  if (m->placement & kPlaceNamed) m->preferred_segment.assign(d->Str());
  else m->preferred_segment.clear();
  uint32_t n = d->Count(4 + 8 + 4);
  // Assigned in place: a request reused for the next decode keeps its
  // strings' capacity (the master's put path allocates nothing here).
  m->keys.resize(n);
  m->sizes.resize(n);
  m->groups.resize(n);
  for (uint32_t i = 0; i < n && !d->failed(); ++i) {
    m->keys[i].assign(d->Str());
    m->sizes[i] = d->U64();
    m->groups[i].assign(d->Str());
  }
  return !d->failed() && d->done();
}

void Encode(const PutStartReply& m, Encoder* e) {
  e->I32(ToInt(m.status));
  e->U32(uint32_t(m.items.size()));
  for (const auto& it : m.items) {
    e->I32(ToInt(it.status));
    e->U64(it.entry_slot);
    e->U64(it.generation);
    e->U64(it.value_offset);
    e->U8((it.settle ? kItemSettle : 0) | (it.segment_generation != 0 ? kItemInSegment : 0));
    if (it.segment_generation != 0) {
      e->U32(it.segment_slot);
      e->U64(it.segment_generation);
    }
  }
}
bool Decode(Decoder* d, PutStartReply* m) {
  m->status = ReadStatus(d);
  uint32_t n = d->Count(4 + 24 + 1);
  m->items.resize(n);
  for (auto& it : m->items) {
    it.status = ReadStatus(d);
    it.entry_slot = d->U64();
    it.generation = d->U64();
    it.value_offset = d->U64();
    uint8_t flags = d->U8();
    it.settle = (flags & kItemSettle) != 0;
    it.segment_slot = 0;
    it.segment_generation = 0;
    if (flags & kItemInSegment) {
      it.segment_slot = d->U32();
      it.segment_generation = d->U64();
    }
  }
  return !d->failed();
}

void Encode(const RemoveRequest& m, Encoder* e) {
  Encode(m.client, e);
  e->U8(m.force ? 1 : 0);
  e->U32(uint32_t(m.keys.size()));
  for (const auto& k : m.keys) e->Str(k);
}
bool Decode(Decoder* d, RemoveRequest* m) {
  Decode(d, &m->client);
  m->force = d->U8() != 0;
  uint32_t n = d->Count(4);
  m->keys.reserve(n);
  for (uint32_t i = 0; i < n && !d->failed(); ++i) m->keys.emplace_back(d->Str());
  return !d->failed() && d->done();
}

void Encode(const RemoveReply& m, Encoder* e) {
  e->I32(ToInt(m.status));
  e->U32(uint32_t(m.results.size()));
  for (int32_t r : m.results) e->I32(r);
  e->U64(m.tomb_ticket);
}
bool Decode(Decoder* d, RemoveReply* m) {
  m->status = ReadStatus(d);
  uint32_t n = d->Count(4);
  m->results.resize(n);
  for (auto& r : m->results) r = d->I32();
  m->tomb_ticket = d->U64();
  return !d->failed();
}

void Encode(const RemoveByRegexRequest& m, Encoder* e) {
  Encode(m.client, e);
  e->U8(m.force ? 1 : 0);
  e->Str(m.pattern);
}
bool Decode(Decoder* d, RemoveByRegexRequest* m) {
  Decode(d, &m->client);
  m->force = d->U8() != 0;
  m->pattern = d->Str();
  return !d->failed() && d->done();
}

void Encode(const CountReply& m, Encoder* e) {
  e->I32(ToInt(m.status));
  e->U64(m.count);
  e->U64(m.tomb_ticket);
}
bool Decode(Decoder* d, CountReply* m) {
  m->status = ReadStatus(d);
  m->count = d->U64();
  m->tomb_ticket = d->U64();
  return !d->failed();
}

void Encode(const SettleRequest& m, Encoder* e) {
  Encode(m.client, e);
  e->U32(uint32_t(m.items.size()));
  for (const auto& [k, g] : m.items) {
    e->Str(k);
    e->U64(g);
  }
}
bool Decode(Decoder* d, SettleRequest* m) {
  Decode(d, &m->client);
  uint32_t n = d->Count(4 + 8);
  m->items.reserve(n);
  for (uint32_t i = 0; i < n && !d->failed(); ++i) {
    std::string k(d->Str());
    uint64_t g = d->U64();
    m->items.emplace_back(std::move(k), g);
  }
  return !d->failed() && d->done();
}

void Encode(const TicketReply& m, Encoder* e) {
  e->I32(ToInt(m.status));
  e->U64(m.tomb_ticket);
}
bool Decode(Decoder* d, TicketReply* m) {
  m->status = ReadStatus(d);
  m->tomb_ticket = d->U64();
  return !d->failed();
}

void Encode(const PromoteRequest& m, Encoder* e) {
  Encode(m.client, e);
  e->Str(m.key);
  e->U64(m.generation);
  e->U8(m.stage ? 1 : 0);
}
bool Decode(Decoder* d, PromoteRequest* m) {
  if (!Decode(d, &m->client)) return false;
  m->key = std::string(d->Str());
  m->generation = d->U64();
  m->stage = d->U8() != 0;
  return !d->failed() && d->done();
}

void Encode(const AnnounceOpenRequest& m, Encoder* e) {
  Encode(m.client, e);
  e->Str(m.name);
}
bool Decode(Decoder* d, AnnounceOpenRequest* m) {
  Decode(d, &m->client);
  m->name = d->Str();
  return !d->failed() && d->done();
}

void Encode(const AnnounceOpenReply& m, Encoder* e) {
  e->I32(ToInt(m.status));
  e->U32(m.channel);
  e->U64(m.name_hash);
}
bool Decode(Decoder* d, AnnounceOpenReply* m) {
  m->status = ReadStatus(d);
  m->channel = d->U32();
  m->name_hash = d->U64();
  return !d->failed();
}

void Encode(const AnnounceCloseRequest& m, Encoder* e) {
  Encode(m.client, e);
  e->U32(m.channel);
  e->U64(m.name_hash);
}
bool Decode(Decoder* d, AnnounceCloseRequest* m) {
  Decode(d, &m->client);
  m->channel = d->U32();
  m->name_hash = d->U64();
  return !d->failed() && d->done();
}

void Encode(const PingReply& m, Encoder* e) {
  e->I32(ToInt(m.status));
  e->U64(m.incarnation);
  e->Str(m.pool_path);
  e->U64(m.pool_size);
  e->Raw(m.uuid, 16);
}
bool Decode(Decoder* d, PingReply* m) {
  m->status = ReadStatus(d);
  m->incarnation = d->U64();
  m->pool_path = d->Str();
  m->pool_size = d->U64();
  d->Raw(m->uuid, 16);
  return !d->failed();
}

void EncodeStatus(ErrorCode status, Encoder* e) { e->I32(ToInt(status)); }
bool DecodeStatus(Decoder* d, ErrorCode* status) {
  *status = ReadStatus(d);
  return !d->failed();
}

}  // namespace mcxl
