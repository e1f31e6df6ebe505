#include "mooncake_cxl/control/message.h"

namespace mcxl {

FrameCheck CheckFrameHeader(const FrameHeader& h) {
  if (h.magic != kFrameMagic) return FrameCheck::kBadMagic;
  if (h.version != kProtocolVersion) return FrameCheck::kBadVersion;
  if (h.payload_bytes > kMaxPayloadBytes) return FrameCheck::kTooLarge;
  return FrameCheck::kOk;
}

const char* FrameCheckName(FrameCheck c) {
  switch (c) {
    case FrameCheck::kOk: return "ok";
    case FrameCheck::kBadMagic: return "bad magic";
    case FrameCheck::kBadVersion: return "unsupported protocol version";
    case FrameCheck::kTooLarge: return "payload larger than the limit";
  }
  return "?";
}

}  // namespace mcxl
