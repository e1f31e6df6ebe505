#include "mooncake_cxl/control/rpc_client.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/common/log.h"

namespace mcxl {

bool SplitHostPort(const std::string& addr, std::string* host, int* port) {
  size_t colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= addr.size()) return false;
  char* end = nullptr;
  long p = strtol(addr.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || p <= 0 || p > 65535) return false;
  *host = addr.substr(0, colon);
  *port = int(p);
  return true;
}

RpcClient::~RpcClient() { Disconnect(); }

bool RpcClient::PeerClosed() const {
  // Nothing is unread between calls, so a readable socket means EOF or an
  // error: the peer is gone and a request sent now would be lost.
  pollfd pfd{fd_, POLLIN, 0};
  if (poll(&pfd, 1, 0) <= 0) return false;
  char c;
  ssize_t n = recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n <= 0;
}

bool RpcClient::SetTarget(const std::string& host, int port) {
  std::lock_guard<std::mutex> lock(mu_);
  if (host == host_ && port == port_) return false;
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  host_ = host, port_ = port;
  return true;
}

void RpcClient::Disconnect() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

Status RpcClient::ConnectLocked() {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  std::string port = std::to_string(port_);
  if (getaddrinfo(host_.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr) {
    MCXL_LOG(kWarn, "rpc", "cannot resolve master address %s", host_.c_str());
    return ErrorCode::RPC_FAIL;
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  int rc = connect(fd, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd pfd{fd, POLLOUT, 0};
    rc = poll(&pfd, 1, connect_timeout_ms_) == 1 ? 0 : -1;
    int err = 0;
    socklen_t len = sizeof(err);
    if (rc == 0) getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (rc != 0 || err != 0) {
      errno = rc != 0 ? ETIMEDOUT : err;
      rc = -1;
    }
  }
  if (rc != 0) {
    // At most one line a second: a client following a takeover retries every few ms.
    uint64_t now = MonoNs();
    if (last_unreachable_log_ns_ == 0 || now - last_unreachable_log_ns_ > 1000000000ull) {
      last_unreachable_log_ns_ = now;
      MCXL_LOG(kWarn, "rpc", "cannot reach the master at %s:%d: %s", host_.c_str(), port_, strerror(errno));
    }
    close(fd);
    return ErrorCode::RPC_FAIL;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  timeval tv{reply_timeout_ms_ / 1000, (reply_timeout_ms_ % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  fd_ = fd;
  return ErrorCode::OK;
}

Status RpcClient::SendAll(const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += size_t(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) ? ErrorCode::RPC_TIMEOUT
                                                                  : ErrorCode::RPC_FAIL;
    }
  }
  return ErrorCode::OK;
}

Status RpcClient::RecvAll(char* p, size_t n, size_t* received) {
  size_t off = 0;
  if (received != nullptr) *received = 0;
  while (off < n) {
    if (received != nullptr) *received = off;
    ssize_t r = recv(fd_, p + off, n - off, 0);
    if (r > 0) {
      off += size_t(r);
    } else if (r < 0 && errno == EINTR) {
      continue;
    } else {
      return (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) ? ErrorCode::RPC_TIMEOUT
                                                                  : ErrorCode::RPC_FAIL;
    }
  }
  return ErrorCode::OK;
}

Result<std::string> RpcClient::Call(MessageType type, const std::string& payload, bool* reconnected) {
  std::lock_guard<std::mutex> lock(mu_);
  if (reconnected != nullptr) *reconnected = false;
  if (fd_ >= 0 && PeerClosed()) Disconnect();  // e.g. the master restarted since the last call
  FrameHeader h{};
  Status s = ErrorCode::OK;
  uint64_t id = 0;
  for (int attempt = 0;; ++attempt) {
    bool fresh = fd_ < 0;
    if (fresh) {
      s = ConnectLocked();
      if (!s.ok()) return s.error();
      if (reconnected != nullptr) *reconnected = true;
    }
    id = next_id_++;
    s = SendAll(MakeFrame(type, id, payload));
    size_t got = 0;
    if (s.ok()) s = RecvAll(reinterpret_cast<char*>(&h), sizeof(h), &got);
    // The master closes connections idle past --rpc_conn_timeout_seconds;
    // when that crossed our request (an old connection, closed before any
    // reply byte: the master never read it), send it once more on a new one.
    if (s.ok() || fresh || attempt > 0 || got > 0 || s.error() != ErrorCode::RPC_FAIL) break;
    Disconnect();
  }
  if (s.ok() && (CheckFrameHeader(h) != FrameCheck::kOk || h.request_id != id)) {
    MCXL_LOG(kWarn, "rpc", "bad reply frame from the master (%s)", FrameCheckName(CheckFrameHeader(h)));
    s = ErrorCode::RPC_FAIL;
  }
  std::string reply;
  if (s.ok()) {
    reply.resize(h.payload_bytes);
    s = RecvAll(reply.data(), reply.size());
  }
  if (!s.ok()) {
    MCXL_LOG(kDebug, "rpc", "%s to %s:%d failed: %s", MessageTypeName(uint16_t(type)), host_.c_str(),
             port_, ErrorCodeName(s.error()));
    Disconnect();
    return s.error();
  }
  if (h.type == uint16_t(MessageType::kError)) {
    Decoder d(reply);
    ErrorCode st = ErrorCode::RPC_FAIL;
    DecodeStatus(&d, &st);
    Disconnect();  // the master closes its side after a kError
    return st;
  }
  return reply;
}

}  // namespace mcxl
