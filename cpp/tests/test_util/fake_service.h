// FakeService: a Service (service.h) for the transport tests, with nothing
// of the master behind it.
//
// Contract: Handle echoes: the reply payload is the request's, except for
//   * kAttach: binds the connection to the slot named by the payload's
//     first 4 bytes (so that the transport reports its disconnect);
//   * kPutStart: a reply of reply_bytes (set by the test) bytes;
//   * a RunsInSlices type (kRemoveAll, kRemoveByRegex): waits until the
//     test calls Release(), then echoes (a long request on the worker).
// Every call is counted per payload; OnDisconnect records the slot. The
// ring side serves a Pool the test made (pool may be null for TCP): the
// slots whose bits the test set are attached, ServeRing answers each
// request frame with the echo frame of the same id, and IdleWork (while
// the test wants it) works until a request interrupts it. The Wait*
// methods give up at the guard (deadline.h) and then return false.
//
// Thread safety: every method, from any thread (the transports' threads
// and the test's).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "mooncake_cxl/control/rpc_protocol.h"
#include "mooncake_cxl/control/service.h"
#include "mooncake_cxl/control/shm_ring.h"
#include "deadline.h"
#include "mooncake_cxl/pool/pool.h"

namespace mcxl {
namespace testutil {

class FakeService : public Service {
 public:
  explicit FakeService(const Pool* pool = nullptr) : pool_(pool) {}

  // ---- what the test sets ----
  void SetAttached(uint32_t slot, bool on) {
    // Release: the ring's requests (pushed before) are visible with the bit.
    if (on) attached_[slot / 64].fetch_or(1ull << (slot % 64), std::memory_order_release);
    else attached_[slot / 64].fetch_and(~(1ull << (slot % 64)), std::memory_order_release);
  }
  void set_reply_bytes(size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    reply_bytes_ = n;
  }
  void set_idle_work_wanted(bool on) { idle_wanted_.store(on, std::memory_order_relaxed); }  // a hint, as the master's
  // Lets the sliced requests waiting in Handle (and later ones) finish.
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

  // ---- what the test reads ----
  int calls(const std::string& payload) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = calls_.find(payload);
    return it == calls_.end() ? 0 : it->second;
  }
  int handled() const {
    std::lock_guard<std::mutex> lock(mu_);
    return handled_;
  }
  std::set<uint32_t> served_slots() const {
    std::lock_guard<std::mutex> lock(mu_);
    return served_slots_;
  }
  std::thread::id sliced_thread() const {
    std::lock_guard<std::mutex> lock(mu_);
    return sliced_thread_;
  }
  std::thread::id plain_thread() const {
    std::lock_guard<std::mutex> lock(mu_);
    return plain_thread_;
  }
  uint64_t ticks() const { return ticks_.load(std::memory_order_relaxed); }  // a statistic
  // Waits until `slot`'s connection is gone (OnDisconnect), or the guard.
  bool WaitDisconnect(uint32_t slot) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kGuard, [&] { return disconnected_.count(slot) != 0; });
  }
  // Waits until `n` sliced requests are inside Handle, or the guard.
  bool WaitSlicedStarted(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kGuard, [&] { return sliced_started_ >= n; });
  }
  // Waits until IdleWork runs (it then works until interrupted), or the guard.
  bool WaitIdleWorkStarted() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kGuard, [&] { return idle_started_ > 0; });
  }
  // Waits until IdleWork saw its `interrupted` become true, or the guard.
  bool WaitIdleWorkInterrupted() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kGuard, [&] { return idle_interrupted_ > 0; });
  }

  // ---- Service ----
  std::string Handle(uint16_t type, std::string_view payload, uint32_t* conn_slot) override {
    std::unique_lock<std::mutex> lock(mu_);
    ++handled_;
    ++calls_[std::string(payload)];
    if (type == uint16_t(MessageType::kAttach) && payload.size() >= 4) {
      memcpy(conn_slot, payload.data(), 4);
      return std::string(payload);
    }
    if (type == uint16_t(MessageType::kPutStart)) return std::string(reply_bytes_, 'r');
    if (RunsInSlices(type)) {
      sliced_thread_ = std::this_thread::get_id();
      ++sliced_started_;
      cv_.notify_all();
      cv_.wait_for(lock, kGuard, [&] { return released_; });
      return std::string(payload);
    }
    plain_thread_ = std::this_thread::get_id();
    return std::string(payload);
  }
  uint64_t Tick() override {
    ticks_.fetch_add(1, std::memory_order_relaxed);
    return 10;
  }
  void OnDisconnect(uint32_t slot) override {
    std::lock_guard<std::mutex> lock(mu_);
    disconnected_.insert(slot);
    cv_.notify_all();
  }
  const Pool& pool() const override {
    if (pool_ == nullptr) std::abort();  // a TCP test: the transport must not ask
    return *pool_;
  }
  uint32_t client_slot_count() const override { return pool_ != nullptr ? pool_->geometry().client_slot_count : 0; }
  uint64_t AttachedWord(uint32_t word) const override {
    return word < kWords ? attached_[word].load(std::memory_order_acquire) : 0;  // pairs with SetAttached
  }
  void ServeRing(uint32_t slot) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      served_slots_.insert(slot);
    }
    uint32_t ring_bytes = pool_->geometry().ring_bytes;
    ShmRing requests(pool_->ring(slot, 0), ring_bytes), replies(pool_->ring(slot, 1), ring_bytes);
    std::string frame;
    while (requests.Pop(&frame) == ShmRing::PopResult::kOk) {
      FrameHeader h{};
      if (frame.size() < sizeof(h)) continue;
      memcpy(&h, frame.data(), sizeof(h));
      uint32_t conn = slot;
      std::string reply = Handle(h.type, std::string_view(frame).substr(sizeof(h)), &conn);
      (void)replies.Push(MakeFrame(MessageType(h.type), h.request_id, reply));
      replies.WakeConsumer();
    }
  }
  bool IdleWorkWanted() const override { return idle_wanted_.load(std::memory_order_relaxed); }
  void IdleWork(uint64_t budget_ns, const std::function<bool()>& interrupted) override {
    // Works until a request interrupts it: the slice's end is the doorbell's.
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++idle_started_;
      cv_.notify_all();
    }
    if (!WaitUntil(interrupted)) return;
    idle_wanted_.store(false, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mu_);
    ++idle_interrupted_;
    cv_.notify_all();
  }

 private:
  static constexpr uint32_t kWords = 4;  // 256 slots
  const Pool* pool_;
  std::atomic<uint64_t> attached_[kWords] = {};  // release by SetAttached, acquire by AttachedWord
  std::atomic<bool> idle_wanted_{false};         // relaxed: a hint the ring thread polls
  std::atomic<uint64_t> ticks_{0};               // relaxed: a count the test compares
  mutable std::mutex mu_;
  std::condition_variable cv_;
  size_t reply_bytes_ = 0;
  bool released_ = false;
  int handled_ = 0, sliced_started_ = 0, idle_started_ = 0, idle_interrupted_ = 0;
  std::map<std::string, int> calls_;
  std::set<uint32_t> served_slots_, disconnected_;
  std::thread::id sliced_thread_, plain_thread_;
};

}  // namespace testutil
}  // namespace mcxl
