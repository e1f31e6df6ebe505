// Tenants: keys of one tenant are invisible to every other tenant of the pool.
//
// Contract: a key is stored in the pool under its tenant's namespace. The
// default tenant ("default", Mooncake's) stores keys unchanged, so pools and
// clients that never name a tenant see what they always saw; every other
// tenant T stores key K as  kTenantMark T kTenantMark K. A tenant id holds no
// control byte (so never kTenantMark), which makes the split unambiguous,
// and a default-tenant key may not begin with kTenantMark (it would name
// another tenant's key). The client maps keys (client.cc ScopeKey); the
// master learns a client's tenant at Attach and confines remove_all and
// remove_by_regex to it (the pattern sees the key without the prefix);
// /get_all_keys, /query_key and /metrics take or show the tenant.
// Stored keys are pool memory: the split is total (any bytes yield a tenant
// and a rest, in bounds) and never trusted for more than a comparison.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace mcxl {

constexpr char kTenantMark = '\x1d';  // ASCII group separator
constexpr std::string_view kDefaultTenant = "default";
constexpr size_t kMaxTenantBytes = 128;

// 1..kMaxTenantBytes bytes, none below 0x20 nor 0x7f.
inline bool ValidTenantId(std::string_view t) {
  if (t.empty() || t.size() > kMaxTenantBytes) return false;
  for (unsigned char c : t)
    if (c < 0x20 || c == 0x7f) return false;
  return true;
}

// What stored keys of tenant `t` begin with ("" for the default tenant).
inline std::string TenantPrefix(std::string_view t) {
  if (t.empty() || t == kDefaultTenant) return {};
  std::string p;
  p.reserve(t.size() + 2);
  p += kTenantMark;
  p += t;
  p += kTenantMark;
  return p;
}

// Splits a stored key into its tenant and the key the tenant sees. A key
// that starts with the mark but has no second one (no client of ours writes
// one) belongs to no tenant: *tenant is empty.
inline void SplitStoredKey(std::string_view stored, std::string_view* tenant, std::string_view* key) {
  if (stored.empty() || stored[0] != kTenantMark) {
    *tenant = kDefaultTenant;
    *key = stored;
    return;
  }
  size_t end = stored.find(kTenantMark, 1);
  if (end == std::string_view::npos || end == 1) {
    *tenant = {};
    *key = stored;
    return;
  }
  *tenant = stored.substr(1, end - 1);
  *key = stored.substr(end + 1);
}

}  // namespace mcxl
