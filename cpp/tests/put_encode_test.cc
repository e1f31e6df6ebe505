// The single-key PutStart encoding (EncodePutStartOne) is byte for byte
// Encode of the same one-key request, and a PutStartRequest reused across
// decodes (the master's per-thread one) ends up equal to a fresh decode.
#include <gtest/gtest.h>

#include <string>

#include "mooncake_cxl/control/rpc_protocol.h"

namespace mcxl {
namespace {

PutStartRequest Base() {
  PutStartRequest r;
  r.client = {7, 0x1234567890ull};
  r.put_id = 42;
  r.abandoned = {3, 5};
  r.upsert = true;
  r.config.flags = 3;
  r.config.soft_pin_ttl_ms = 900;
  return r;
}

TEST(PutEncode, OneKeyMatchesGeneralEncode) {
  for (std::string group : {std::string(), std::string("g1")}) {
    PutStartRequest r = Base();
    std::string key(40, 'k');
    Encoder one;
    EncodePutStartOne(r, key, 4096, group, &one);
    r.keys = {key};
    r.sizes = {4096};
    r.groups = {group};
    Encoder all;
    Encode(r, &all);
    EXPECT_EQ(one.data(), all.data());
  }
}

TEST(PutEncode, ReusedRequestDecodesLikeAFreshOne) {
  PutStartRequest big = Base();
  big.keys = {"a-long-key-of-many-bytes-0000000000", "b", "c"};
  big.sizes = {1, 2, 3};
  big.groups = {"g", "", "h"};
  PutStartRequest small = Base();
  small.abandoned.clear();
  small.upsert = false;
  small.keys = {"x"};
  small.sizes = {9};
  small.groups = {""};
  PutStartRequest reused;
  for (const PutStartRequest* m : {&big, &small, &big}) {
    Encoder e;
    Encode(*m, &e);
    Decoder d(e.data());
    ASSERT_TRUE(Decode(&d, &reused));
    EXPECT_EQ(reused.keys, m->keys);
    EXPECT_EQ(reused.sizes, m->sizes);
    EXPECT_EQ(reused.groups, m->groups);
    EXPECT_EQ(reused.abandoned, m->abandoned);
    EXPECT_EQ(reused.upsert, m->upsert);
    EXPECT_EQ(reused.put_id, m->put_id);
  }
}

}  // namespace
}  // namespace mcxl
