// The binary message format of the master's RPC, shared by every transport.
//
// Contract: a frame is a 24-byte little-endian FrameHeader followed by
// `payload_bytes` of payload. Payloads are sequences of fixed-width
// little-endian integers and length-prefixed strings, written by Encoder and
// read by Decoder. Decoder never reads past its input: a short or malformed
// payload sets failed() and every later read yields zero/empty, so a handler
// can decode a whole request and check failed() once at the end.
// kMaxPayloadBytes bounds every frame; a larger one is rejected unread.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace mcxl {

constexpr uint32_t kFrameMagic = 0x4D43584Cu;  // "LXCM"
constexpr uint16_t kProtocolVersion = 8;  // 2: Attach token, ClientRef in removes, Ping bootstrap; 3: Attach tenant;
                                          // 4: tombstone tickets, PutStartItem.settle, Settle;
                                          // 5: RingHeader of four lines, doorbell rung only when needed;
                                          // 6: AnnounceOpen, AnnounceClose;
                                          // 7: remote clients (Attach secret, TE session, Locate, Publish);
                                          // 8: DRAM segments (Attach segment, PutStart placement, items' segment)
constexpr uint32_t kMaxPayloadBytes = 64u << 20;

struct FrameHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t type;  // MessageType
  uint32_t payload_bytes;
  uint32_t reserved;
  uint64_t request_id;
};
static_assert(sizeof(FrameHeader) == 24);

enum class FrameCheck { kOk, kBadMagic, kBadVersion, kTooLarge };
FrameCheck CheckFrameHeader(const FrameHeader& h);
const char* FrameCheckName(FrameCheck c);

class Encoder {
 public:
  void U8(uint8_t v) { Raw(&v, 1); }
  void U32(uint32_t v) { Raw(&v, 4); }
  void I32(int32_t v) { Raw(&v, 4); }
  void U64(uint64_t v) { Raw(&v, 8); }
  void Str(std::string_view s) {
    U32(uint32_t(s.size()));
    Raw(s.data(), s.size());
  }
  void Raw(const void* p, size_t n) { buf_.append(static_cast<const char*>(p), n); }
  const std::string& data() const { return buf_; }
  std::string& mutable_data() { return buf_; }

 private:
  std::string buf_;
};

class Decoder {
 public:
  Decoder(const char* p, size_t n) : p_(p), end_(p + n) {}
  explicit Decoder(std::string_view s) : Decoder(s.data(), s.size()) {}
  uint8_t U8() { return Fixed<uint8_t>(); }
  uint32_t U32() { return Fixed<uint32_t>(); }
  int32_t I32() { return Fixed<int32_t>(); }
  uint64_t U64() { return Fixed<uint64_t>(); }
  std::string_view Str() {
    uint32_t n = U32();
    if (failed_ || size_t(end_ - p_) < n) return Fail();
    std::string_view s(p_, n);
    p_ += n;
    return s;
  }
  bool Raw(void* out, size_t n) {
    if (failed_ || size_t(end_ - p_) < n) {
      Fail();
      return false;
    }
    memcpy(out, p_, n);
    p_ += n;
    return true;
  }
  // A count of items that each take at least `min_item_bytes`: rejects counts
  // the remaining input cannot hold, so callers may reserve() safely.
  uint32_t Count(size_t min_item_bytes) {
    uint32_t n = U32();
    if (!failed_ && min_item_bytes > 0 && n > size_t(end_ - p_) / min_item_bytes) Fail();
    return failed_ ? 0 : n;
  }
  bool failed() const { return failed_; }
  bool done() const { return p_ == end_; }

 private:
  template <typename T>
  T Fixed() {
    T v{};
    if (failed_ || size_t(end_ - p_) < sizeof(T)) {
      Fail();
      return T{};
    }
    memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  std::string_view Fail() {
    failed_ = true;
    p_ = end_;
    return {};
  }
  const char* p_;
  const char* end_;
  bool failed_ = false;
};

}  // namespace mcxl
