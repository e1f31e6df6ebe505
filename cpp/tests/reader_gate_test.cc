// ReaderGate (reader_gate.h): threads entering and leaving while another
// closes. Once CloseAndWait returns no call is inside and none enters.
#include "mooncake_cxl/common/reader_gate.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace mcxl {
namespace {

TEST(ReaderGate, EntersUntilClosedAndExitsBalance) {
  ReaderGate gate;
  EXPECT_FALSE(gate.closed());
  {
    GateScope a(gate), b(gate);
    EXPECT_TRUE(a.ok());
    EXPECT_TRUE(b.ok());
  }
  gate.CloseAndWait();  // nobody inside: returns at once
  EXPECT_TRUE(gate.closed());
  GateScope late(gate);
  EXPECT_FALSE(late.ok());
  gate.CloseAndWait();  // twice is fine
}

TEST(ReaderGate, CloseWaitsForEveryCallInsideAndAdmitsNoneAfter) {
  constexpr int kThreads = 4;
  constexpr uint64_t kEntriesBeforeClose = 2000;  // per thread
  ReaderGate gate;
  // seq_cst (the default) throughout: test bookkeeping, not under test.
  std::atomic<int> inside{0};
  std::atomic<bool> close_returned{false};
  std::atomic<uint64_t> violations{0};
  std::vector<std::atomic<uint64_t>> entered(kThreads);
  std::vector<std::thread> readers;
  for (int t = 0; t < kThreads; ++t) {
    readers.emplace_back([&, t] {
      for (;;) {
        GateScope in(gate);
        if (!in.ok()) break;
        inside.fetch_add(1);
        // Close has returned while this call is inside: the gate let it in late
        // or did not wait for it.
        for (int spin = 0; spin < 50; ++spin)
          if (close_returned.load()) violations.fetch_add(1);
        inside.fetch_sub(1);
        entered[t].fetch_add(1);
      }
    });
  }
  // Close only once every reader is in its loop (a condition, not a sleep).
  for (int t = 0; t < kThreads; ++t)
    while (entered[t].load() < kEntriesBeforeClose) std::this_thread::yield();
  gate.CloseAndWait();
  EXPECT_EQ(inside.load(), 0);
  close_returned.store(true);
  uint64_t at_close = 0;
  for (auto& e : entered) at_close += e.load();
  for (auto& r : readers) r.join();
  uint64_t at_end = 0;
  for (auto& e : entered) at_end += e.load();
  EXPECT_EQ(violations.load(), 0u);
  EXPECT_EQ(at_end, at_close);  // nothing entered after the close returned
}

}  // namespace
}  // namespace mcxl
