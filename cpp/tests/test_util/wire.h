// Frames and payloads as the tests build and read them: a message's
// encoding, a reply's status, a frame split into header and payload.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "mooncake_cxl/control/message.h"
#include "mooncake_cxl/control/rpc_protocol.h"

namespace mcxl {
namespace testutil {

constexpr uint64_t kMiB = 1024 * 1024;

template <typename M>
std::string Enc(const M& m) {
  Encoder e;
  Encode(m, &e);
  return e.data();
}

// The status at the front of a reply payload.
inline ErrorCode StatusOf(const std::string& reply) {
  Decoder d(reply);
  ErrorCode st = ErrorCode::RPC_FAIL;
  EXPECT_TRUE(DecodeStatus(&d, &st));
  return st;
}

// A whole frame (header and payload) as one transport delivered it.
struct Frame {
  FrameHeader header{};
  std::string payload;
};
// False when `bytes` is shorter than a header or disagrees with its length.
inline bool SplitFrame(const std::string& bytes, Frame* out) {
  if (bytes.size() < sizeof(FrameHeader)) return false;
  memcpy(&out->header, bytes.data(), sizeof(FrameHeader));
  out->payload = bytes.substr(sizeof(FrameHeader));
  return out->header.payload_bytes == out->payload.size();
}

}  // namespace testutil
}  // namespace mcxl
