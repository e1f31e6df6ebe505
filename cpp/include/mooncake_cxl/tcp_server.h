// TcpServer: the master's TCP transport. One thread, epoll, non-blocking
// sockets; frames in, Master::Handle, frames out.
//
// Contract: binds only the address it is given. A frame whose header is bad
// (magic, version, size over kMaxPayloadBytes) gets a kError reply with
// INVALID_PARAMS, a log line, and the connection is closed (the stream cannot
// be re-synchronised); a frame with a malformed payload gets the handler's
// error reply and the connection stays open. Nothing a peer sends can crash
// the master. Run() returns when `stop` becomes true.
//
// Thread safety: Run() on one thread; `stop` may be set from a signal handler.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "mooncake_cxl/error_code.h"
#include "mooncake_cxl/master.h"

namespace mcxl {

class TcpServer {
 public:
  TcpServer(Master* master) : master_(master) {}
  ~TcpServer();
  // Binds and listens; port 0 picks a free port (see port()).
  Status Listen(const std::string& address, int port);
  int port() const { return port_; }
  void Run(const std::atomic<bool>& stop);

 private:
  struct Conn {
    std::string in, out;
    uint32_t client_slot = Master::kNoSlot;
    bool closing = false;
  };
  void Accept();
  void OnReadable(int fd, Conn& c);
  void Flush(int fd, Conn& c);
  void Close(int fd);

  Master* master_;
  int listen_fd_ = -1, epoll_fd_ = -1, port_ = 0;
  std::unordered_map<int, Conn> conns_;
};

}  // namespace mcxl
