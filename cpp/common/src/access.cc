#include "mooncake_cxl/common/access.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace mcxl {

bool TokensEqual(const uint8_t* a, const uint8_t* b) {
  uint8_t diff = 0;
  for (size_t i = 0; i < kAuthTokenBytes; ++i) diff |= uint8_t(a[i] ^ b[i]);
  return diff == 0;
}

bool SecretsEqual(std::string_view a, std::string_view b) {
  uint8_t diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= uint8_t(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

bool LoadOrCreateSecret(const std::string& path, std::string* secret, std::string* why) {
  constexpr size_t kMaxSecretBytes = 4096;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0 && errno == ENOENT) {
    uint8_t raw[16];
    if (getrandom(raw, sizeof(raw), 0) != ssize_t(sizeof(raw))) {
      *why = "getrandom failed";
      return false;
    }
    char hex[33];
    for (int i = 0; i < 16; ++i) snprintf(hex + 2 * i, 3, "%02x", raw[i]);
    int w = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (w >= 0) {
      bool ok = fchmod(w, 0600) == 0 && write(w, hex, 32) == 32 && write(w, "\n", 1) == 1;
      close(w);
      if (!ok) {
        *why = std::string("cannot write ") + path;
        unlink(path.c_str());
        return false;
      }
    }
    fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  }
  if (fd < 0) {
    *why = std::string("cannot open ") + path + ": " + strerror(errno);
    return false;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || (st.st_mode & 0077) != 0) {
    close(fd);
    *why = path + " may be read by others (chmod 600 it)";
    return false;
  }
  char buf[kMaxSecretBytes + 1];
  ssize_t n = read(fd, buf, sizeof(buf));
  close(fd);
  if (n < 0 || size_t(n) > kMaxSecretBytes) {
    *why = path + ": unreadable or over 4 KiB";
    return false;
  }
  std::string_view v(buf, size_t(n));
  while (!v.empty() && (v.back() == '\n' || v.back() == '\r' || v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t' || v.front() == '\n')) v.remove_prefix(1);
  if (v.empty()) {
    *why = path + " is empty";
    return false;
  }
  *secret = std::string(v);
  return true;
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
