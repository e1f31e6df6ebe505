#include "mooncake_cxl/common/access.h"

#include <arpa/inet.h>
#include <sys/stat.h>

#include <cstdio>

namespace mcxl {

bool TokensEqual(const uint8_t* a, const uint8_t* b) {
  uint8_t diff = 0;
  for (size_t i = 0; i < kAuthTokenBytes; ++i) diff |= uint8_t(a[i] ^ b[i]);
  return diff == 0;
}

bool IsLoopbackAddress(std::string_view address) {
  std::string a(address);
  if (a == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, a.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, a.c_str(), &v6) != 1) return false;
  if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
}

std::vector<std::string> ExposureWarnings(std::string_view rpc_address, bool rpc_address_set,
                                          std::string_view metrics_host, bool metrics_host_set) {
  std::vector<std::string> out;
  if (!rpc_address_set && !IsLoopbackAddress(rpc_address))
    out.push_back("RPC listens on " + std::string(rpc_address) +
                  " (the Mooncake default): any host that can reach the port can try requests "
                  "(they are refused without the pool's token); pass --rpc_address=127.0.0.1 to "
                  "keep it local, or give --rpc_address explicitly to silence this warning");
  if (!metrics_host_set && !IsLoopbackAddress(metrics_host))
    out.push_back("monitoring HTTP listens on " + std::string(metrics_host) +
                  " (the Mooncake default): any host that can reach the port reads the metrics "
                  "(key listing stays loopback-only without --enable_key_listing); pass "
                  "--metrics_host=127.0.0.1 to keep it local, or give --metrics_host explicitly "
                  "to silence this warning");
  return out;
}

bool KeyListingAllowed(bool enable_key_listing, std::string_view peer_address) {
  return enable_key_listing || IsLoopbackAddress(peer_address);
}

bool PoolModeAcceptable(mode_t mode, bool allow_world_readable, std::string* why) {
  if (allow_world_readable || (mode & (S_IROTH | S_IWOTH)) == 0) return true;
  char buf[160];
  snprintf(buf, sizeof(buf), "mode %04o lets every local user %s every value", unsigned(mode & 07777),
           (mode & S_IWOTH) ? "read and overwrite" : "read");
  *why = buf;
  return false;
}

}  // namespace mcxl
