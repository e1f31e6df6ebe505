// Service: what the master's transports (TcpServer, RingServer) need from
// the process that answers them. The master implements it; the transports
// know nothing else of it, so the control layer builds without the master.
//
// Contract: Handle answers one decoded frame and always returns a valid
// reply payload (status first), also for a malformed request. `conn_slot`
// is the client slot bound to the calling connection or ring (kNoSlot when
// none); Attach updates it. Tick does periodic work and returns how long the
// caller may sleep before calling it again. Every method is thread-safe: the
// TCP loop, its worker, the ring thread and the HTTP thread call in at once.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace mcxl {

class Pool;

class Service {
 public:
  static constexpr uint32_t kNoSlot = 0xffffffffu;
  virtual ~Service() = default;

  // ---- both transports ----
  virtual std::string Handle(uint16_t type, std::string_view payload, uint32_t* conn_slot) = 0;
  virtual uint64_t Tick() = 0;

  // ---- TCP ----
  // The connection that attached `slot` is gone.
  virtual void OnDisconnect(uint32_t slot) = 0;

  // ---- CXL RPC rings ----
  // The pool whose rings are served now (a replaced device swaps it; the
  // old one stays mapped long after a ring thread's round).
  virtual const Pool& pool() const = 0;
  // Client slots in use, and slots 64*word .. 64*word+63 attached as a bit
  // set (acquire: the rings of an attached slot were reset before its bit).
  virtual uint32_t client_slot_count() const = 0;
  virtual uint64_t AttachedWord(uint32_t word) const = 0;
  // Answers every request waiting in client `slot`'s request ring.
  virtual void ServeRing(uint32_t slot) = 0;
  // Work the ring thread does while no request waits (a relaxed hint), in
  // slices of about `budget_ns`; `interrupted` is polled between steps so a
  // request arriving ends the slice at once.
  virtual bool IdleWorkWanted() const = 0;
  virtual void IdleWork(uint64_t budget_ns, const std::function<bool()>& interrupted) = 0;
};

}  // namespace mcxl
