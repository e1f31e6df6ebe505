// Helpers shared by the tests that drive a Master in-process
// (master_test, access_test, stall_test, master_corruption_test): frame
// encoding, a reply's status, this machine's name, the pool's token.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "mooncake_cxl/pool/pool.h"
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

inline std::string Hostname() {
  char buf[256] = {};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

// The credential a client reads from the pool it maps (access control).
inline void SetToken(const Pool& pool, AttachRequest* req) {
  memcpy(req->token, pool.superblock()->auth_token, sizeof(req->token));
}

}  // namespace testutil
}  // namespace mcxl
