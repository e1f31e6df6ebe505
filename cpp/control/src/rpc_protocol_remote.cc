// Codecs of the requests that have the master do what a client on a
// coherent pool does itself: kLocate, kPublish (remote clients, which reach
// the pool over the Transfer Engine instead of a mapping; kPublish also for
// every client of a non-coherent pool), kLeases (non-coherent pools) and
// kSegmentSession (in-pod readers of another client's DRAM segment).
#include "mooncake_cxl/control/rpc_protocol.h"

namespace mcxl {

// Smallest encodings of one item: a key (its length), a locate item, a
// publish item; Count() refuses a count the input cannot hold.
constexpr size_t kMinKeyBytes = 4;
constexpr size_t kLocateItemBytes = 4 + 6 * 8 + 4;
constexpr size_t kPublishItemBytes = 16;
constexpr size_t kLeaseItemBytes = 3 * 8 + 1;

void Encode(const LocateRequest& m, Encoder* e) {
  Encode(m.client, e);
  e->U64(m.lease_until_ns);
  e->U32(uint32_t(m.keys.size()));
  for (const auto& k : m.keys) e->Str(k);
}
bool Decode(Decoder* d, LocateRequest* m) {
  if (!Decode(d, &m->client)) return false;
  m->lease_until_ns = d->U64();
  uint32_t n = d->Count(kMinKeyBytes);
  m->keys.resize(n);
  for (uint32_t i = 0; i < n; ++i) m->keys[i] = std::string(d->Str());
  return !d->failed() && d->done();
}

void Encode(const LocateReply& m, Encoder* e) {
  e->I32(ToInt(m.status));
  e->U32(uint32_t(m.items.size()));
  for (const auto& it : m.items) {
    e->I32(ToInt(it.status));
    e->U64(it.entry_offset);
    e->U64(it.version);
    e->U64(it.state_gen);
    e->U64(it.value_offset);
    e->U64(it.value_size);
    e->U64(it.put_time_ns);
    e->Str(it.writer);
  }
}
bool Decode(Decoder* d, LocateReply* m) {
  m->status = ErrorCode(d->I32());
  uint32_t n = d->Count(kLocateItemBytes);
  m->items.resize(n);
  for (auto& it : m->items) {
    it.status = ErrorCode(d->I32());
    it.entry_offset = d->U64();
    it.version = d->U64();
    it.state_gen = d->U64();
    it.value_offset = d->U64();
    it.value_size = d->U64();
    it.put_time_ns = d->U64();
    it.writer = std::string(d->Str());
  }
  return !d->failed();
}

void Encode(const PublishRequest& m, Encoder* e) {
  Encode(m.client, e);
  e->U32(uint32_t(m.items.size()));
  for (const auto& [slot, gen] : m.items) {
    e->U64(slot);
    e->U64(gen);
  }
}
bool Decode(Decoder* d, PublishRequest* m) {
  if (!Decode(d, &m->client)) return false;
  uint32_t n = d->Count(kPublishItemBytes);
  m->items.resize(n);
  for (auto& [slot, gen] : m->items) {
    slot = d->U64();
    gen = d->U64();
  }
  return !d->failed() && d->done();
}

void Encode(const LeasesRequest& m, Encoder* e) {
  Encode(m.client, e);
  e->U32(uint32_t(m.items.size()));
  for (const auto& it : m.items) {
    e->U64(it.entry_slot);
    e->U64(it.state_gen);
    e->U64(it.until_ns);
    e->U8(it.lower ? 1 : 0);
  }
}
bool Decode(Decoder* d, LeasesRequest* m) {
  if (!Decode(d, &m->client)) return false;
  uint32_t n = d->Count(kLeaseItemBytes);
  m->items.resize(n);
  for (auto& it : m->items) {
    it.entry_slot = d->U64();
    it.state_gen = d->U64();
    it.until_ns = d->U64();
    it.lower = d->U8() != 0;
  }
  return !d->failed() && d->done();
}

void Encode(const PublishReply& m, Encoder* e) {
  e->I32(ToInt(m.status));
  e->U32(uint32_t(m.results.size()));
  for (int32_t r : m.results) e->I32(r);
  e->U64(m.tomb_ticket);
}
bool Decode(Decoder* d, PublishReply* m) {
  m->status = ErrorCode(d->I32());
  uint32_t n = d->Count(4);
  m->results.resize(n);
  for (auto& r : m->results) r = d->I32();
  m->tomb_ticket = d->U64();
  return !d->failed();
}

void Encode(const SegmentSessionRequest& m, Encoder* e) {
  Encode(m.client, e);
  e->U32(m.slot);
  e->U64(m.generation);
}
bool Decode(Decoder* d, SegmentSessionRequest* m) {
  if (!Decode(d, &m->client)) return false;
  m->slot = d->U32();
  m->generation = d->U64();
  return !d->failed() && d->done();
}

void Encode(const SegmentSessionReply& m, Encoder* e) {
  e->I32(ToInt(m.status));
  e->U64(m.segment_size);
  e->Str(m.session);
}
bool Decode(Decoder* d, SegmentSessionReply* m) {
  m->status = ErrorCode(d->I32());
  m->segment_size = d->U64();
  m->session = std::string(d->Str());
  return !d->failed();
}

}  // namespace mcxl
