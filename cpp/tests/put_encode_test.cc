// The PutStart encoding from views (EncodePutStartViews, the client's) is
// byte for byte Encode of the same request, for one key and for a batch, and
// a PutStartRequest reused across decodes (the master's per-thread one) ends
// up equal to a fresh decode.
#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

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
    std::string_view key_view = key, group_view = group;
    uint64_t size = 4096;
    Encoder one;
    EncodePutStartViews(r, 1, &key_view, &size, &group_view, &one);
    r.keys = {key};
    r.sizes = {size};
    r.groups = {group};
    Encoder all;
    Encode(r, &all);
    EXPECT_EQ(one.data(), all.data());
  }
}

TEST(PutEncode, BatchFromViewsMatchesGeneralEncode) {
  PutStartRequest r = Base();
  r.keys = {"a-long-key-of-many-bytes-0000000000", "b", "c"};
  r.sizes = {1, 2, 3};
  r.groups = {"g", "", "h"};
  std::vector<std::string_view> keys(r.keys.begin(), r.keys.end()), groups(r.groups.begin(), r.groups.end());
  Encoder views;
  EncodePutStartViews(Base(), keys.size(), keys.data(), r.sizes.data(), groups.data(), &views);
  Encoder all;
  Encode(r, &all);
  EXPECT_EQ(views.data(), all.data());
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
