// Message codec: Encoder/Decoder primitives, a round trip of every message
// of rpc_protocol.h, every truncation (each prefix length) of each valid
// payload is rejected without reading out of bounds, huge counts are
// rejected before anything is reserved, and CheckFrameHeader / MakeFrame.
#include "mooncake_cxl/control/message.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "mooncake_cxl/control/rpc_protocol.h"

namespace mcxl {
namespace {

template <typename M>
std::string Enc(const M& m) {
  Encoder e;
  Encode(m, &e);
  return e.data();
}

template <typename M>
bool Dec(std::string_view bytes, M* m) {
  Decoder d(bytes);
  return Decode(&d, m);
}

// Decodes every strict prefix of `payload` from an exactly-sized heap copy
// (so a read past the end would touch unowned memory) and expects failure.
template <typename M>
void ExpectEveryTruncationFails(const std::string& payload) {
  for (size_t n = 0; n < payload.size(); ++n) {
    std::unique_ptr<char[]> copy(new char[n + 1]);
    memcpy(copy.get(), payload.data(), n);
    Decoder d(copy.get(), n);
    M m;
    bool ok = Decode(&d, &m);
    EXPECT_TRUE(!ok && d.failed()) << "prefix of " << n << " of " << payload.size() << " bytes";
  }
}

TEST(DecoderTest, PrimitivesRoundTrip) {
  Encoder e;
  e.U8(0xab);
  e.U32(0xdeadbeef);
  e.I32(-706);
  e.U64(0x0123456789abcdefull);
  e.Str("");
  e.Str(std::string("a\0b", 3));
  e.Raw("xyz", 3);
  EXPECT_EQ(e.data().size(), 1u + 4 + 4 + 8 + 4 + 7 + 3);
  Decoder d(e.data());
  EXPECT_EQ(d.U8(), 0xab);
  EXPECT_EQ(d.U32(), 0xdeadbeefu);
  EXPECT_EQ(d.I32(), -706);
  EXPECT_EQ(d.U64(), 0x0123456789abcdefull);
  EXPECT_EQ(d.Str(), "");
  EXPECT_EQ(d.Str(), std::string_view("a\0b", 3));
  char raw[3];
  EXPECT_TRUE(d.Raw(raw, 3));
  EXPECT_EQ(std::string(raw, 3), "xyz");
  EXPECT_FALSE(d.failed());
  EXPECT_TRUE(d.done());
  // Little-endian on the wire.
  EXPECT_EQ(uint8_t(e.data()[1]), 0xef);
}

TEST(DecoderTest, FailureIsStickyAndYieldsZeros) {
  Encoder e;
  e.U32(100);  // a string length with no bytes behind it
  e.U64(42);
  Decoder d(e.data());
  EXPECT_EQ(d.Str(), "");
  EXPECT_TRUE(d.failed());
  EXPECT_TRUE(d.done());
  EXPECT_EQ(d.U64(), 0u);  // later reads yield zero, never the 42
  EXPECT_EQ(d.U8(), 0u);
  char c = 'q';
  EXPECT_FALSE(d.Raw(&c, 1));
  EXPECT_EQ(c, 'q');
  EXPECT_EQ(d.Count(1), 0u);
  EXPECT_TRUE(d.failed());

  Decoder empty(nullptr, 0);
  EXPECT_EQ(empty.U32(), 0u);
  EXPECT_TRUE(empty.failed());
}

TEST(DecoderTest, CountRejectsWhatTheInputCannotHold) {
  Encoder e;
  e.U32(3);
  e.Raw("abcdefghijkl", 12);
  {
    Decoder d(e.data());
    EXPECT_EQ(d.Count(4), 3u);  // exactly fits
    EXPECT_FALSE(d.failed());
  }
  {
    Decoder d(e.data());
    EXPECT_EQ(d.Count(5), 0u);  // 15 bytes needed, 12 left
    EXPECT_TRUE(d.failed());
  }
  Encoder huge;
  huge.U32(0xffffffffu);
  Decoder d(huge.data());
  EXPECT_EQ(d.Count(1), 0u);
  EXPECT_TRUE(d.failed());
}

AttachRequest SampleAttach() {
  AttachRequest m;
  m.local_hostname = "10.0.0.1:12345";
  m.machine = "host-a";
  m.pid = 4242;
  m.prev_slot = 3;
  m.prev_generation = 0x100000007ull;
  for (int i = 0; i < 16; ++i) m.token[i] = uint8_t(0xA0 + i);
  m.segment_size = 64ull << 20;
  m.segment_session = "10.0.0.1:15123";
  return m;
}
AttachReply SampleAttachReply() {
  AttachReply m;
  m.status = ErrorCode::OK;
  m.slot = 5;
  m.slot_generation = 77;
  m.incarnation = 2;
  m.pool_path = "/dev/shm/pool";
  m.pool_size = 64ull << 20;
  for (int i = 0; i < 16; ++i) m.uuid[i] = uint8_t(i * 17);
  m.lease_ttl_ms = 10000;
  return m;
}
PutStartRequest SamplePutStart() {
  PutStartRequest m;
  m.client = {9, 123456789};
  m.upsert = true;
  m.config.flags = 3;
  m.config.soft_pin_ttl_ms = 60000;
  m.keys = {"k1", "", std::string(300, 'x')};
  m.sizes = {1, 0, ~uint64_t(0)};
  m.groups = {"group", "", "g3"};
  m.placement = kPlaceSegment | kPlaceSameNode | kPlaceNamed;
  m.preferred_segment = "10.0.0.1:12345";
  return m;
}
PutStartReply SamplePutStartReply() {
  PutStartReply m;
  m.items.push_back({ErrorCode::OK, 11, 22, 33, 6, 0x700000001ull});
  m.items.push_back({ErrorCode::OBJECT_ALREADY_EXISTS, 0, 0, 0});
  return m;
}
RemoveRequest SampleRemove() {
  RemoveRequest m;
  m.client = {4, 0x300000009ull};
  m.keys = {"a", "bb", ""};
  m.force = true;
  return m;
}
RemoveReply SampleRemoveReply() {
  RemoveReply m;
  m.status = ErrorCode::OBJECT_HAS_LEASE;
  m.results = {0, -704, -706};
  return m;
}

TEST(RpcProtocolTest, AttachRoundTrip) {
  AttachRequest in = SampleAttach(), out;
  ASSERT_TRUE(Dec(Enc(in), &out));
  EXPECT_EQ(out.local_hostname, in.local_hostname);
  EXPECT_EQ(out.machine, in.machine);
  EXPECT_EQ(out.pid, in.pid);
  EXPECT_EQ(out.prev_slot, in.prev_slot);
  EXPECT_EQ(out.prev_generation, in.prev_generation);
  EXPECT_EQ(memcmp(out.token, in.token, 16), 0);
  EXPECT_EQ(out.segment_size, in.segment_size);
  EXPECT_EQ(out.segment_session, in.segment_session);

  AttachReply rin = SampleAttachReply(), rout;
  ASSERT_TRUE(Dec(Enc(rin), &rout));
  EXPECT_EQ(rout.status, rin.status);
  EXPECT_EQ(rout.slot, rin.slot);
  EXPECT_EQ(rout.slot_generation, rin.slot_generation);
  EXPECT_EQ(rout.incarnation, rin.incarnation);
  EXPECT_EQ(rout.pool_path, rin.pool_path);
  EXPECT_EQ(rout.pool_size, rin.pool_size);
  EXPECT_EQ(memcmp(rout.uuid, rin.uuid, 16), 0);
  EXPECT_EQ(rout.lease_ttl_ms, rin.lease_ttl_ms);
}

TEST(RpcProtocolTest, ClientRefRoundTrip) {
  ClientRef in{7, 0xfedcba9876543210ull}, out;
  ASSERT_TRUE(Dec(Enc(in), &out));
  EXPECT_EQ(out.slot, 7u);
  EXPECT_EQ(out.generation, in.generation);
}

TEST(RpcProtocolTest, PutStartRoundTrip) {
  PutStartRequest in = SamplePutStart(), out;
  ASSERT_TRUE(Dec(Enc(in), &out));
  EXPECT_EQ(out.client.slot, in.client.slot);
  EXPECT_EQ(out.client.generation, in.client.generation);
  EXPECT_EQ(out.upsert, in.upsert);
  EXPECT_EQ(out.config.flags, in.config.flags);
  EXPECT_EQ(out.config.soft_pin_ttl_ms, in.config.soft_pin_ttl_ms);
  EXPECT_EQ(out.keys, in.keys);
  EXPECT_EQ(out.sizes, in.sizes);
  EXPECT_EQ(out.groups, in.groups);
  EXPECT_EQ(out.placement, kPlaceSegment | kPlaceSameNode | kPlaceNamed);
  EXPECT_EQ(out.preferred_segment, in.preferred_segment);

  // Missing group entries are sent as "" (no group).
  PutStartRequest short_groups = in, padded;
  short_groups.groups = {"only-first"};
  ASSERT_TRUE(Dec(Enc(short_groups), &padded));
  EXPECT_EQ(padded.groups, (std::vector<std::string>{"only-first", "", ""}));

  PutStartRequest empty_in, empty_out;
  ASSERT_TRUE(Dec(Enc(empty_in), &empty_out));
  EXPECT_FALSE(empty_out.upsert);
  EXPECT_TRUE(empty_out.keys.empty());

  PutStartReply rin = SamplePutStartReply(), rout;
  ASSERT_TRUE(Dec(Enc(rin), &rout));
  EXPECT_EQ(rout.status, ErrorCode::OK);
  ASSERT_EQ(rout.items.size(), 2u);
  EXPECT_EQ(rout.items[0].entry_slot, 11u);
  EXPECT_EQ(rout.items[0].generation, 22u);
  EXPECT_EQ(rout.items[0].value_offset, 33u);
  EXPECT_EQ(rout.items[0].segment_slot, 6u);
  EXPECT_EQ(rout.items[0].segment_generation, 0x700000001ull);
  EXPECT_EQ(rout.items[1].segment_generation, 0u);  // in the pool
  EXPECT_EQ(rout.items[1].status, ErrorCode::OBJECT_ALREADY_EXISTS);
}

TEST(RpcProtocolTest, ReplyBytesBoundIsThePutStartReplysSize) {
  // Exact for a reply of every key (what the master would encode), whatever
  // the abandoned ids; 0 for requests whose reply cannot outgrow them.
  for (uint32_t n : {0u, 1u, 600u, 4096u}) {
    PutStartRequest req;
    req.abandoned = {1, 2, 3};
    PutStartReply reply;
    for (uint32_t i = 0; i < n; ++i) {
      req.keys.push_back("k" + std::to_string(i));
      req.sizes.push_back(64);
      req.groups.emplace_back();
      reply.items.push_back({ErrorCode::OK, i, i, i, 0, 0, true});
    }
    EXPECT_EQ(ReplyBytesBound(uint16_t(MessageType::kPutStart), Enc(req)), Enc(reply).size()) << n;
    // A client with a DRAM segment: every item may name the segment.
    req.placement = kPlaceSegment;
    for (auto& it : reply.items) it.segment_slot = 1, it.segment_generation = 2;
    EXPECT_EQ(ReplyBytesBound(uint16_t(MessageType::kPutStart), Enc(req)), Enc(reply).size()) << n;
    // Short keys: the reply outgrows the request (a record that holds the
    // request need not hold the reply).
    if (n >= 600) EXPECT_LT(Enc(req).size(), Enc(reply).size());
  }
  EXPECT_EQ(ReplyBytesBound(uint16_t(MessageType::kPutStart), "\x01\x02"), 0u);  // undecodable
  EXPECT_EQ(ReplyBytesBound(uint16_t(MessageType::kBatchRemove), Enc(SampleRemove())), 0u);
}

TEST(RpcProtocolTest, RemoveRoundTrip) {
  RemoveRequest in = SampleRemove(), out;
  ASSERT_TRUE(Dec(Enc(in), &out));
  EXPECT_EQ(out.keys, in.keys);
  EXPECT_EQ(out.client.slot, 4u);
  EXPECT_EQ(out.client.generation, 0x300000009ull);
  EXPECT_TRUE(out.force);

  RemoveReply rin = SampleRemoveReply(), rout;
  ASSERT_TRUE(Dec(Enc(rin), &rout));
  EXPECT_EQ(rout.status, ErrorCode::OBJECT_HAS_LEASE);
  EXPECT_EQ(rout.results, rin.results);

  RemoveByRegexRequest xin{{7, 8}, "^prefix/.*$", true}, xout;
  ASSERT_TRUE(Dec(Enc(xin), &xout));
  EXPECT_EQ(xout.pattern, xin.pattern);
  EXPECT_EQ(xout.client.slot, 7u);
  EXPECT_EQ(xout.client.generation, 8u);
  EXPECT_TRUE(xout.force);
}

TEST(RpcProtocolTest, SmallRepliesRoundTrip) {
  CountReply cin{ErrorCode::INVALID_PARAMS, 99}, cout_;
  ASSERT_TRUE(Dec(Enc(cin), &cout_));
  EXPECT_EQ(cout_.status, ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(cout_.count, 99u);

  PingReply pin{ErrorCode::OK, 12, "/dev/shm/p", 1ull << 30, {}}, pout;
  pin.uuid[3] = 0x5a;
  ASSERT_TRUE(Dec(Enc(pin), &pout));
  EXPECT_EQ(pout.incarnation, 12u);
  EXPECT_EQ(pout.pool_path, "/dev/shm/p");
  EXPECT_EQ(pout.pool_size, 1ull << 30);
  EXPECT_EQ(pout.uuid[3], 0x5a);

  Encoder e;
  EncodeStatus(ErrorCode::ILLEGAL_CLIENT, &e);
  ErrorCode st = ErrorCode::OK;
  Decoder d(e.data());
  ASSERT_TRUE(DecodeStatus(&d, &st));
  EXPECT_EQ(st, ErrorCode::ILLEGAL_CLIENT);
}

TEST(RpcProtocolTest, RemoteClientMessagesRoundTrip) {
  AttachRequest a = SampleAttach(), aout;
  a.secret = "s3cret";
  ASSERT_TRUE(Dec(Enc(a), &aout));
  EXPECT_EQ(aout.secret, "s3cret");
  AttachReply r = SampleAttachReply(), rout;
  r.te_protocol = "tcp";
  r.te_session = "127.0.0.1:15001";
  r.index_offset = 4096;
  r.index_capacity = 1024;
  r.tombs_word_offset = 320;
  ASSERT_TRUE(Dec(Enc(r), &rout));
  EXPECT_EQ(rout.te_session, "127.0.0.1:15001");
  EXPECT_EQ(rout.index_capacity, 1024u);
  EXPECT_EQ(rout.tombs_word_offset, 320u);

  LocateRequest lin{{3, 4}, {"a", "bb"}, 77}, lout;
  ASSERT_TRUE(Dec(Enc(lin), &lout));
  EXPECT_EQ(lout.keys, lin.keys);
  EXPECT_EQ(lout.lease_until_ns, 77u);
  LocateReply lr{ErrorCode::OK, {{ErrorCode::OK, 1, 2, 3, 4, 5, 6, "host:1"}, {ErrorCode::OBJECT_NOT_FOUND}}}, lrout;
  ASSERT_TRUE(Dec(Enc(lr), &lrout));
  ASSERT_EQ(lrout.items.size(), 2u);
  EXPECT_EQ(lrout.items[0].value_offset, 4u);
  EXPECT_EQ(lrout.items[0].writer, "host:1");
  EXPECT_EQ(lrout.items[1].status, ErrorCode::OBJECT_NOT_FOUND);

  PublishRequest pin{{5, 6}, {{10, 20}, {11, 21}}}, pout;
  ASSERT_TRUE(Dec(Enc(pin), &pout));
  EXPECT_EQ(pout.items, pin.items);
  PublishReply prin{ErrorCode::OK, {0, -800}, 9}, prout;
  ASSERT_TRUE(Dec(Enc(prin), &prout));
  EXPECT_EQ(prout.results, prin.results);
  EXPECT_EQ(prout.tomb_ticket, 9u);

  ExpectEveryTruncationFails<LocateRequest>(Enc(lin));
  ExpectEveryTruncationFails<LocateReply>(Enc(lr));
  ExpectEveryTruncationFails<PublishRequest>(Enc(pin));
  ExpectEveryTruncationFails<PublishReply>(Enc(prin));
  Encoder huge;  // a Locate naming 4 billion keys with none behind
  Encode(ClientRef{0, 1}, &huge);
  huge.U64(0);
  huge.U32(0xffffffffu);
  LocateRequest hm;
  EXPECT_FALSE(Dec(huge.data(), &hm));
  EXPECT_LT(hm.keys.capacity(), 16u);
}

TEST(RpcProtocolTest, SegmentSessionRoundTrip) {
  SegmentSessionRequest q{{3, 4}, 7, 0x500000002ull}, qout;
  ASSERT_TRUE(Dec(Enc(q), &qout));
  EXPECT_EQ(qout.client.slot, 3u);
  EXPECT_EQ(qout.slot, 7u);
  EXPECT_EQ(qout.generation, 0x500000002ull);
  SegmentSessionReply r{ErrorCode::OK, 64u << 20, "127.0.0.1:15123"}, rout;
  ASSERT_TRUE(Dec(Enc(r), &rout));
  EXPECT_EQ(rout.segment_size, 64u << 20);
  EXPECT_EQ(rout.session, "127.0.0.1:15123");
  ExpectEveryTruncationFails<SegmentSessionRequest>(Enc(q));
  ExpectEveryTruncationFails<SegmentSessionReply>(Enc(r));
  EXPECT_STREQ(MessageTypeName(uint16_t(MessageType::kSegmentSession)), "SegmentSession");
}

TEST(RpcProtocolTest, AnnounceOpenAndCloseRoundTrip) {
  AnnounceOpenRequest oin{{7, 0x200000003ull}, "prefill-0"}, oout;
  ASSERT_TRUE(Dec(Enc(oin), &oout));
  EXPECT_EQ(oout.client.slot, 7u);
  EXPECT_EQ(oout.client.generation, 0x200000003ull);
  EXPECT_EQ(oout.name, "prefill-0");
  AnnounceOpenReply rin{ErrorCode::NO_AVAILABLE_HANDLE, 41, 0xabcdef01ull}, rout;
  ASSERT_TRUE(Dec(Enc(rin), &rout));
  EXPECT_EQ(rout.status, ErrorCode::NO_AVAILABLE_HANDLE);
  EXPECT_EQ(rout.channel, 41u);
  EXPECT_EQ(rout.name_hash, 0xabcdef01ull);
  AnnounceCloseRequest cin{{2, 9}, 41, 0xabcdef01ull}, cout_;
  ASSERT_TRUE(Dec(Enc(cin), &cout_));
  EXPECT_EQ(cout_.client.slot, 2u);
  EXPECT_EQ(cout_.channel, 41u);
  EXPECT_EQ(cout_.name_hash, 0xabcdef01ull);
  ExpectEveryTruncationFails<AnnounceOpenRequest>(Enc(oin));
  ExpectEveryTruncationFails<AnnounceOpenReply>(Enc(rin));
  ExpectEveryTruncationFails<AnnounceCloseRequest>(Enc(cin));
  AnnounceOpenRequest om;
  EXPECT_FALSE(Dec(Enc(oin) + "x", &om));
  AnnounceCloseRequest cm;
  EXPECT_FALSE(Dec(Enc(cin) + "x", &cm));
  EXPECT_STREQ(MessageTypeName(uint16_t(MessageType::kAnnounceOpen)), "AnnounceOpen");
  EXPECT_STREQ(MessageTypeName(uint16_t(MessageType::kAnnounceClose)), "AnnounceClose");
}

TEST(RpcProtocolTest, RequestsRejectTrailingBytes) {
  std::string a = Enc(SampleAttach()) + "x";
  AttachRequest am;
  EXPECT_FALSE(Dec(a, &am));
  std::string p = Enc(SamplePutStart()) + "x";
  PutStartRequest pm;
  EXPECT_FALSE(Dec(p, &pm));
  std::string r = Enc(SampleRemove()) + "x";
  RemoveRequest rm;
  EXPECT_FALSE(Dec(r, &rm));
  std::string x = Enc(RemoveByRegexRequest{{}, "a", false}) + "x";
  RemoveByRegexRequest xm;
  EXPECT_FALSE(Dec(x, &xm));
}

TEST(RpcProtocolTest, EveryTruncationIsRejected) {
  ExpectEveryTruncationFails<AttachRequest>(Enc(SampleAttach()));
  ExpectEveryTruncationFails<AttachReply>(Enc(SampleAttachReply()));
  ExpectEveryTruncationFails<ClientRef>(Enc(ClientRef{1, 2}));
  ExpectEveryTruncationFails<PutStartRequest>(Enc(SamplePutStart()));
  ExpectEveryTruncationFails<PutStartReply>(Enc(SamplePutStartReply()));
  ExpectEveryTruncationFails<RemoveRequest>(Enc(SampleRemove()));
  ExpectEveryTruncationFails<RemoveReply>(Enc(SampleRemoveReply()));
  ExpectEveryTruncationFails<RemoveByRegexRequest>(Enc(RemoveByRegexRequest{{1, 2}, "abc", true}));
  ExpectEveryTruncationFails<CountReply>(Enc(CountReply{ErrorCode::OK, 5}));
  ExpectEveryTruncationFails<PingReply>(Enc(PingReply{ErrorCode::OK, 5, "/p", 9, {}}));
}

TEST(RpcProtocolTest, HugeCountsAreRejected) {
  {
    Encoder e;  // PutStart header, then 4 billion keys and nothing behind them
    Encode(ClientRef{0, 1}, &e);
    e.U8(0);
    e.U32(0);
    e.U64(0);
    e.U32(0xffffffffu);
    PutStartRequest m;
    EXPECT_FALSE(Dec(e.data(), &m));
    EXPECT_LT(m.keys.capacity(), 16u);
  }
  {
    Encoder e;
    Encode(ClientRef{0, 1}, &e);
    e.U8(1);
    e.U32(0x40000000u);
    e.Str("one");
    RemoveRequest m;
    EXPECT_FALSE(Dec(e.data(), &m));
  }
  {
    Encoder e;
    e.I32(0);
    e.U32(0xffffffffu);
    PutStartReply m;
    EXPECT_FALSE(Dec(e.data(), &m));
    EXPECT_TRUE(m.items.empty());
  }
  {
    Encoder e;
    e.I32(0);
    e.U32(0xffffffffu);
    e.I32(5);
    RemoveReply m;
    EXPECT_FALSE(Dec(e.data(), &m));
    EXPECT_TRUE(m.results.empty());
  }
}

TEST(FrameTest, MakeFrameAndCheckHeader) {
  std::string payload = Enc(SampleRemove());
  std::string frame = MakeFrame(MessageType::kBatchRemove, 77, payload);
  ASSERT_EQ(frame.size(), sizeof(FrameHeader) + payload.size());
  FrameHeader h;
  memcpy(&h, frame.data(), sizeof(h));
  EXPECT_EQ(CheckFrameHeader(h), FrameCheck::kOk);
  EXPECT_EQ(h.magic, kFrameMagic);
  EXPECT_EQ(h.version, kProtocolVersion);
  EXPECT_EQ(h.type, uint16_t(MessageType::kBatchRemove));
  EXPECT_EQ(h.payload_bytes, payload.size());
  EXPECT_EQ(h.request_id, 77u);
  EXPECT_EQ(frame.substr(sizeof(h)), payload);

  FrameHeader bad = h;
  bad.magic ^= 1;
  EXPECT_EQ(CheckFrameHeader(bad), FrameCheck::kBadMagic);
  bad = h;
  bad.version = kProtocolVersion + 1;
  EXPECT_EQ(CheckFrameHeader(bad), FrameCheck::kBadVersion);
  bad.version = 0;
  EXPECT_EQ(CheckFrameHeader(bad), FrameCheck::kBadVersion);
  bad = h;
  bad.payload_bytes = kMaxPayloadBytes;
  EXPECT_EQ(CheckFrameHeader(bad), FrameCheck::kOk);
  bad.payload_bytes = kMaxPayloadBytes + 1;
  EXPECT_EQ(CheckFrameHeader(bad), FrameCheck::kTooLarge);
  bad.payload_bytes = 0xffffffffu;
  EXPECT_EQ(CheckFrameHeader(bad), FrameCheck::kTooLarge);
  for (FrameCheck c : {FrameCheck::kOk, FrameCheck::kBadMagic, FrameCheck::kBadVersion,
                       FrameCheck::kTooLarge})
    EXPECT_STRNE(FrameCheckName(c), "?");
}

TEST(FrameTest, MessageTypeNames) {
  EXPECT_STREQ(MessageTypeName(uint16_t(MessageType::kPutStart)), "PutStart");
  EXPECT_STREQ(MessageTypeName(uint16_t(MessageType::kRemoveAll)), "RemoveAll");
  EXPECT_STREQ(MessageTypeName(999), "Unknown");
}

}  // namespace
}  // namespace mcxl
