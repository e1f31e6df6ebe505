// TcpServer: the master's TCP transport. One thread, epoll, non-blocking
// sockets; frames in, Service::Handle, frames out. Requests that scan the
// whole index (RunsInSlices, rpc_protocol.h: remove_by_regex, remove_all) run on one
// worker thread, so the loop keeps serving other connections meanwhile.
//
// Contract: binds only the address it is given. A frame whose header is bad
// (magic, version, size over kMaxPayloadBytes) gets a kError reply with
// INVALID_PARAMS, a log line, and the connection is closed (the stream cannot
// be re-synchronised); a frame with a malformed payload gets the handler's
// error reply and the connection stays open. Nothing a peer sends can crash
// the master or make it spin:
//  * Replies of one connection go out in request order; a connection with a
//    sliced request in flight reads nothing more until its reply is queued.
//  * Backpressure: a peer whose unread replies exceed out_pause_bytes is not
//    read from (its requests wait in its socket) until they drain; one with
//    replies queued that takes no byte for stall_drop_ms is dropped. A
//    connection's memory is thus at most one frame (kMaxPayloadBytes) plus
//    out_pause_bytes plus one reply.
//  * At most max_connections connections: a connection beyond is accepted and
//    closed at once (log line, rate-limited). When accept fails for want of
//    file descriptors (EMFILE, ENFILE, ...), accepting pauses for 100 ms
//    instead of spinning on the pending connection.
//  * A connection idle (nothing buffered, nothing in flight) for
//    idle_timeout_s is closed; clients reconnect transparently (RpcClient).
// Run() returns when `stop` becomes true.
//
// Thread safety: Run() on one thread; `stop` may be set from a signal handler.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "mooncake_cxl/common/error_code.h"
#include "mooncake_cxl/control/service.h"

namespace mcxl {

struct TcpServerOptions {
  int64_t max_connections = 1024;    // --max_rpc_connections
  uint64_t idle_timeout_s = 300;     // --rpc_conn_timeout_seconds; 0 = never
  size_t out_pause_bytes = 1 << 20;  // unread replies above this: stop reading the peer
  uint64_t stall_drop_ms = 5000;     // replies queued and none taken this long: drop
};

class TcpServer {
 public:
  explicit TcpServer(Service* service, TcpServerOptions options = {}) : service_(service), options_(options) {}
  ~TcpServer();
  // Binds and listens; port 0 picks a free port (see port()).
  Status Listen(const std::string& address, int port);
  int port() const { return port_; }
  void Run(const std::atomic<bool>& stop);

 private:
  struct Conn {
    uint64_t id = 0;  // unique: fds are reused, a worker reply names its connection by id
    std::string in, out;
    uint32_t client_slot = Service::kNoSlot;
    bool closing = false;
    bool busy = false;    // a sliced request is on the worker
    bool paused = false;  // not polled for input (backpressure or busy)
    uint64_t last_active_ns = 0;  // last byte in or out
  };
  struct Job {
    int fd;
    uint64_t conn_id, request_id;
    uint16_t type;
    std::string payload;
    uint32_t client_slot;
  };
  struct Done {
    int fd;
    uint64_t conn_id;
    std::string frame;
  };
  void Accept();
  void OnReadable(int fd, Conn& c);
  // Answers the complete frames buffered in c.in, as far as backpressure lets.
  void Process(int fd, Conn& c);
  void Flush(int fd, Conn& c);
  void UpdateInterest(int fd, Conn& c);
  void Close(int fd);
  void Sweep();  // idle and stalled connections, accept pause
  void WorkerLoop();
  void TakeDone();
  bool LogBudget();

  Service* service_;
  TcpServerOptions options_;
  int listen_fd_ = -1, epoll_fd_ = -1, wake_fd_ = -1, port_ = 0;
  std::unordered_map<int, Conn> conns_;
  uint64_t next_conn_id_ = 1;
  uint64_t accept_paused_until_ns_ = 0;  // 0: accepting
  uint64_t last_sweep_ns_ = 0;
  uint64_t log_window_ns_ = 0, log_suppressed_ = 0;
  int log_used_ = 0;
  // The worker: sliced requests in, reply frames out (wake_fd_ tells the loop).
  std::mutex jobs_mu_;
  std::condition_variable jobs_cv_;
  std::deque<Job> jobs_;
  std::deque<Done> done_;
  bool worker_stop_ = false;
  std::thread worker_;
};

}  // namespace mcxl
