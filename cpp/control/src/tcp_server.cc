#include "mooncake_cxl/control/tcp_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/control/message.h"
#include "mooncake_cxl/control/rpc_protocol.h"

namespace mcxl {
namespace {
constexpr size_t kReadChunk = 64 * 1024;
constexpr size_t kReadPerEvent = 1 << 20;  // then other connections' turn (epoll is level-triggered)
constexpr uint64_t kAcceptPauseNs = 100'000'000;
constexpr uint64_t kSweepIntervalNs = 200'000'000;
constexpr uint64_t kNsPerMs = 1'000'000;
constexpr int kLogLinesPerSecond = 5;

void SetNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }
}  // namespace

TcpServer::~TcpServer() {
  {
    std::lock_guard<std::mutex> lock(jobs_mu_);
    worker_stop_ = true;
  }
  jobs_cv_.notify_all();
  if (worker_.joinable()) worker_.join();  // waits for a scan in progress
  for (auto& [fd, c] : conns_) close(fd);
  if (listen_fd_ >= 0) close(listen_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
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
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) {
    MCXL_LOG(kError, "rpc", "epoll/eventfd: %s", strerror(errno));
    return ErrorCode::RPC_FAIL;
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listen_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  ev.data.fd = wake_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  worker_ = std::thread([this] { WorkerLoop(); });
  return ErrorCode::OK;
}

bool TcpServer::LogBudget() {
  // A flood of connections must not flood the log: a few lines a second,
  // the rest counted and reported with the next line.
  uint64_t now = MonoNs();
  if (now - log_window_ns_ >= 1'000'000'000) {
    log_window_ns_ = now;
    if (log_suppressed_ > 0)
      MCXL_LOG(kWarn, "rpc", "%llu similar lines suppressed", (unsigned long long)log_suppressed_);
    log_used_ = 0;
    log_suppressed_ = 0;
  }
  if (log_used_ >= kLogLinesPerSecond) {
    ++log_suppressed_;
    return false;
  }
  ++log_used_;
  return true;
}

void TcpServer::Accept() {
  for (;;) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // The pending connection stays pending: level-triggered epoll would
        // report it again at once. Stop watching the socket for a while.
        if (LogBudget())
          MCXL_LOG(kError, "rpc", "accept: %s (%zu RPC connections open); pausing accepts for 100 ms",
                   strerror(errno), conns_.size());
        accept_paused_until_ns_ = MonoNs() + kAcceptPauseNs;
        epoll_event ev{};
        ev.data.fd = listen_fd_;
        epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
      }
      return;
    }
    if (conns_.size() >= size_t(std::max<int64_t>(options_.max_connections, 1))) {
      close(fd);
      if (LogBudget())
        MCXL_LOG(kWarn, "rpc", "connection refused: %zu RPC connections open (--max_rpc_connections)",
                 conns_.size());
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    Conn& c = conns_[fd];
    c = Conn{};
    c.id = next_conn_id_++;
    c.last_active_ns = MonoNs();
  }
}

void TcpServer::Close(int fd) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  uint32_t slot = it->second.client_slot;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  close(fd);
  conns_.erase(it);
  if (slot != Service::kNoSlot) service_->OnDisconnect(slot);
}

void TcpServer::UpdateInterest(int fd, Conn& c) {
  // Read only while there is room for replies and nothing in flight: a peer
  // that does not read its replies stops being read (its requests wait in
  // the socket, the kernel's window stops it sending).
  bool want_in = !c.busy && !c.closing && c.out.size() < options_.out_pause_bytes;
  uint32_t events = (want_in ? uint32_t(EPOLLIN | EPOLLRDHUP) : 0u) | (c.out.empty() ? 0u : uint32_t(EPOLLOUT));
  c.paused = !want_in;
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev);
}

void TcpServer::Flush(int fd, Conn& c) {
  size_t sent = 0;
  while (sent < c.out.size()) {
    ssize_t n = send(fd, c.out.data() + sent, c.out.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    c.closing = true;  // peer gone
    c.out.clear();
    sent = 0;
    break;
  }
  if (sent > 0) {
    c.out.erase(0, sent);
    c.last_active_ns = MonoNs();
  }
  UpdateInterest(fd, c);
}

void TcpServer::OnReadable(int fd, Conn& c) {
  char buf[kReadChunk];
  size_t got = 0;
  while (got < kReadPerEvent) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n > 0) {
      c.in.append(buf, size_t(n));
      got += size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) c.closing = true;
    break;
  }
  if (got > 0) c.last_active_ns = MonoNs();
  Process(fd, c);
}

void TcpServer::Process(int fd, Conn& c) {
  for (;;) {
    size_t pos = 0;
    while (!c.busy && c.out.size() < options_.out_pause_bytes && c.in.size() - pos >= sizeof(FrameHeader)) {
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
      pos += sizeof(h) + h.payload_bytes;
      if (RunsInSlices(h.type)) {
        // A whole-index scan: on the worker, so that this loop keeps serving.
        {
          std::lock_guard<std::mutex> lock(jobs_mu_);
          jobs_.push_back(Job{fd, c.id, h.request_id, h.type, std::string(payload), c.client_slot});
        }
        jobs_cv_.notify_one();
        c.busy = true;
        break;
      }
      std::string reply = service_->Handle(h.type, payload, &c.client_slot);
      c.out += MakeFrame(MessageType(h.type), h.request_id, reply);
    }
    const bool stopped_for_room = !c.busy && !c.closing && c.out.size() >= options_.out_pause_bytes;
    c.in.erase(0, pos);
    Flush(fd, c);
    // A flush the kernel takes whole arms no EPOLLOUT to come back on, so
    // the frames still in c.in would wait for the peer's next byte: answer
    // them now, as far as the room Flush made lets.
    if (!stopped_for_room || c.closing || c.out.size() >= options_.out_pause_bytes) return;
  }
}

void TcpServer::WorkerLoop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(jobs_mu_);
      jobs_cv_.wait(lock, [this] { return worker_stop_ || !jobs_.empty(); });
      if (worker_stop_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    uint32_t slot = job.client_slot;
    std::string reply = service_->Handle(job.type, job.payload, &slot);
    {
      std::lock_guard<std::mutex> lock(jobs_mu_);
      done_.push_back(Done{job.fd, job.conn_id, MakeFrame(MessageType(job.type), job.request_id, reply)});
    }
    uint64_t one = 1;
    ssize_t ignored = write(wake_fd_, &one, sizeof(one));  // an eventfd write cannot block here
    (void)ignored;
  }
}

void TcpServer::TakeDone() {
  uint64_t v;
  ssize_t ignored = read(wake_fd_, &v, sizeof(v));
  (void)ignored;
  std::deque<Done> done;
  {
    std::lock_guard<std::mutex> lock(jobs_mu_);
    done.swap(done_);
  }
  for (Done& d : done) {
    auto it = conns_.find(d.fd);
    if (it == conns_.end() || it->second.id != d.conn_id) continue;  // the peer left meanwhile
    Conn& c = it->second;
    c.busy = false;
    c.out += d.frame;
    c.last_active_ns = MonoNs();
    Process(d.fd, c);  // requests that waited behind it
    if (c.closing) Close(d.fd);
  }
}

void TcpServer::Sweep() {
  uint64_t now = MonoNs();
  if (accept_paused_until_ns_ != 0 && now >= accept_paused_until_ns_) {
    accept_paused_until_ns_ = 0;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = listen_fd_;
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
  }
  if (now - last_sweep_ns_ < kSweepIntervalNs) return;
  last_sweep_ns_ = now;
  uint64_t idle_ns = options_.idle_timeout_s * 1'000'000'000ull;
  std::vector<int> drop;
  for (auto& [fd, c] : conns_) {
    uint64_t quiet = now - c.last_active_ns;
    // Unsent replies mean the kernel's buffers towards the peer are full
    // (megabytes unread); a client that merely sleeps never gets there.
    if (!c.out.empty() && quiet > options_.stall_drop_ms * kNsPerMs) {
      if (LogBudget())
        MCXL_LOG(kWarn, "rpc", "connection dropped: its peer has read none of %zu bytes of replies for %llu ms",
                 c.out.size(), (unsigned long long)(quiet / kNsPerMs));
      drop.push_back(fd);
    } else if (idle_ns != 0 && !c.busy && c.in.empty() && c.out.empty() && quiet > idle_ns) {
      MCXL_LOG(kDebug, "rpc", "idle connection closed after %llu s (--rpc_conn_timeout_seconds)",
               (unsigned long long)options_.idle_timeout_s);
      drop.push_back(fd);
    }
  }
  for (int fd : drop) Close(fd);
}

void TcpServer::Run(const std::atomic<bool>& stop) {
  epoll_event events[64];
  uint64_t delay_ms = service_->Tick();
  // Relaxed: a flag polled once per loop; set by a signal handler.
  while (!stop.load(std::memory_order_relaxed)) {
    int n = epoll_wait(epoll_fd_, events, 64, int(std::min<uint64_t>(delay_ms, 100)));
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      uint32_t ev = events[i].events;
      if (fd == listen_fd_) {
        Accept();
        continue;
      }
      if (fd == wake_fd_) {
        TakeDone();
        continue;
      }
      auto it = conns_.find(fd);
      if (it == conns_.end()) continue;
      Conn& c = it->second;
      if (ev & EPOLLERR) c.closing = true;
      if (!c.closing && (ev & EPOLLOUT)) Flush(fd, c);
      if (!c.closing) {
        if (!c.paused && (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP))) OnReadable(fd, c);
        else if (ev & EPOLLHUP) c.closing = true;  // gone while we were not reading it
        else Process(fd, c);  // replies drained: answer what waited in c.in
      }
      if (c.closing) Close(fd);
    }
    Sweep();
    delay_ms = service_->Tick();
  }
}

}  // namespace mcxl
