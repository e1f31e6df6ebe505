#include "mooncake_cxl/tcp_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "mooncake_cxl/log.h"
#include "mooncake_cxl/message.h"
#include "mooncake_cxl/rpc_protocol.h"

namespace mcxl {
namespace {
constexpr size_t kReadChunk = 64 * 1024;

void SetNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }
}  // namespace

TcpServer::~TcpServer() {
  for (auto& [fd, c] : conns_) close(fd);
  if (listen_fd_ >= 0) close(listen_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

Status TcpServer::Listen(const std::string& address, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  if (inet_pton(AF_INET, address.c_str(), &addr.sin_addr) != 1) {
    MCXL_LOG(kError, "rpc", "--rpc_address '%s' is not an IPv4 address", address.c_str());
    return ErrorCode::INVALID_PARAMS;
  }
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listen_fd_, 256) != 0) {
    MCXL_LOG(kError, "rpc", "cannot listen on %s:%d: %s", address.c_str(), port, strerror(errno));
    return ErrorCode::RPC_FAIL;
  }
  socklen_t len = sizeof(addr);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  SetNonBlocking(listen_fd_);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listen_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  return ErrorCode::OK;
}

void TcpServer::Accept() {
  for (;;) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    conns_[fd] = Conn{};
  }
}

void TcpServer::Close(int fd) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  uint32_t slot = it->second.client_slot;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  close(fd);
  conns_.erase(it);
  if (slot != Master::kNoSlot) master_->OnDisconnect(slot);
}

void TcpServer::Flush(int fd, Conn& c) {
  while (!c.out.empty()) {
    ssize_t n = send(fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
    if (n > 0) {
      c.out.erase(0, size_t(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    c.closing = true;  // peer gone
    c.out.clear();
    return;
  }
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | (c.out.empty() ? 0u : uint32_t(EPOLLOUT));
  ev.data.fd = fd;
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev);
}

void TcpServer::OnReadable(int fd, Conn& c) {
  char buf[kReadChunk];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n > 0) {
      c.in.append(buf, size_t(n));
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) c.closing = true;
    break;
  }
  size_t pos = 0;
  while (c.in.size() - pos >= sizeof(FrameHeader)) {
    FrameHeader h;
    memcpy(&h, c.in.data() + pos, sizeof(h));
    FrameCheck check = CheckFrameHeader(h);
    if (check != FrameCheck::kOk) {
      MCXL_LOG(kWarn, "rpc", "frame rejected (%s: magic %08x version %u, %u payload bytes); closing connection",
               FrameCheckName(check), h.magic, h.version, h.payload_bytes);
      Encoder e;
      EncodeStatus(ErrorCode::INVALID_PARAMS, &e);
      c.out += MakeFrame(MessageType::kError, h.request_id, e.data());
      c.closing = true;
      pos = c.in.size();
      break;
    }
    if (c.in.size() - pos - sizeof(h) < h.payload_bytes) break;  // wait for the rest
    std::string_view payload(c.in.data() + pos + sizeof(h), h.payload_bytes);
    std::string reply = master_->Handle(h.type, payload, &c.client_slot);
    c.out += MakeFrame(MessageType(h.type), h.request_id, reply);
    pos += sizeof(h) + h.payload_bytes;
  }
  c.in.erase(0, pos);
  Flush(fd, c);
}

void TcpServer::Run(const std::atomic<bool>& stop) {
  epoll_event events[64];
  uint64_t delay_ms = master_->Tick();
  // Relaxed: a flag polled once per loop; set by a signal handler.
  while (!stop.load(std::memory_order_relaxed)) {
    int n = epoll_wait(epoll_fd_, events, 64, int(delay_ms));
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == listen_fd_) {
        Accept();
        continue;
      }
      auto it = conns_.find(fd);
      if (it == conns_.end()) continue;
      Conn& c = it->second;
      if (events[i].events & EPOLLOUT) Flush(fd, c);
      if (events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) OnReadable(fd, c);
      if (c.closing) Close(fd);
    }
    delay_ms = master_->Tick();
  }
}

}  // namespace mcxl
