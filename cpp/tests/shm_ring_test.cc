// ShmRing (shm_ring.h) on plain memory: records come out whole and in
// order; a record that would cross the end is preceded by a wrap marker
// (or, with less than a record header left, by nothing: the consumer skips
// that end); a full ring refuses a push until a pop makes room; the largest
// frame fits, one byte more never; bytes at the tail that the producer could
// not have written (another sequence number, a bad ~len, a length beyond
// head) are refused and SkipAll resynchronises on the producer's next
// record; Peek leaves a record until Consume; the producer's tail copy; ids
// that tag an attachment; and two processes streaming through shared memory.
#include "mooncake_cxl/control/shm_ring.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "mooncake_cxl/common/clock.h"

namespace mcxl {
namespace {

constexpr uint32_t kWrapLen = 0xFFFFFFFFu;  // a wrap marker's len (shm_ring.h)
constexpr uint64_t kRecordHeader = 16;      // [u64 seq][u32 len][u32 ~len]

// A ring's memory outside any pool: its header, then `data_bytes`, aligned
// as the pool aligns rings. The data area starts filled with 0xAB so that
// bytes a push skipped can be told from bytes it wrote.
class RingMemory {
 public:
  explicit RingMemory(uint64_t data_bytes)
      : bytes_(sizeof(RingHeader) + data_bytes),
        mem_(static_cast<char*>(aligned_alloc(kCacheLine, bytes_))) {
    memset(mem_, 0, sizeof(RingHeader));
    memset(mem_ + sizeof(RingHeader), 0xAB, data_bytes);
  }
  ~RingMemory() { free(mem_); }
  RingMemory(const RingMemory&) = delete;
  RingMemory& operator=(const RingMemory&) = delete;

  RingHeader* header() const { return reinterpret_cast<RingHeader*>(mem_); }
  char* data() const { return mem_ + sizeof(RingHeader); }
  uint64_t bytes() const { return bytes_; }

 private:
  uint64_t bytes_;
  char* mem_;
};

// The record header at data offset `pos`.
struct RawRecord {
  uint64_t seq;
  uint32_t len, check;
};
RawRecord RecordAt(const RingMemory& m, uint64_t pos) {
  RawRecord r;
  memcpy(&r.seq, m.data() + pos, 8);
  memcpy(&r.len, m.data() + pos + 8, 4);
  memcpy(&r.check, m.data() + pos + 12, 4);
  return r;
}

// Bytes a record of `len` payload bytes takes in the ring.
uint64_t RecordBytes(uint64_t len) { return kRecordHeader + (len + 7) / 8 * 8; }

// The n-th test record: its size and bytes follow from n.
std::string Record(uint64_t n, size_t size) {
  std::string r(size, '\0');
  for (size_t i = 0; i < size; ++i) r[i] = char(n * 131 + i * 7);
  if (size >= 8) memcpy(r.data(), &n, 8);
  return r;
}

std::string PopOk(ShmRing& ring) {
  std::string f;
  EXPECT_EQ(ring.Pop(&f), ShmRing::PopResult::kOk);
  return f;
}

TEST(ShmRingTest, RecordsComeOutWholeAndInOrder) {
  RingMemory m(1024);
  ShmRing producer(m.header(), m.bytes()), consumer(m.header(), m.bytes());
  std::string f;
  EXPECT_EQ(consumer.Pop(&f), ShmRing::PopResult::kEmpty);
  EXPECT_FALSE(consumer.HasData());
  for (uint64_t round = 0; round < 50; ++round) {  // many times round the ring
    std::vector<std::string> sent;
    for (uint64_t i = 0; i < 3; ++i) {  // 3 x 216 bytes, and what a wrap skips: room for all
      sent.push_back(Record(round * 3 + i, size_t(1 + (round * 37 + i * 53) % 200)));
      ASSERT_TRUE(producer.Push(sent.back())) << round << " " << i;
    }
    EXPECT_TRUE(consumer.HasData());
    for (const std::string& s : sent) EXPECT_EQ(PopOk(consumer), s);
    EXPECT_EQ(consumer.Pop(&f), ShmRing::PopResult::kEmpty);
  }
  // A frame given as a header and a body comes out joined.
  const char front[] = "head:";
  ASSERT_TRUE(producer.Push(front, 5, "body"));
  EXPECT_EQ(PopOk(consumer), "head:body");
}

TEST(ShmRingTest, RecordThatWouldCrossTheEndIsPrecededByAWrapMarker) {
  RingMemory m(1024);
  ShmRing producer(m.header(), m.bytes()), consumer(m.header(), m.bytes());
  // Records of 496 and 504 bytes end at 1000: 24 bytes are left.
  ASSERT_EQ(RecordBytes(480) + RecordBytes(488), 1000u);
  ASSERT_TRUE(producer.Push(Record(0, 480)));
  ASSERT_TRUE(producer.Push(Record(1, 488)));
  PopOk(consumer);
  PopOk(consumer);
  ASSERT_TRUE(producer.Push(Record(2, 100)));  // 120 bytes: not before the end
  RawRecord marker = RecordAt(m, 1000);
  EXPECT_EQ(marker.seq, 2u);  // the marker carries the next record's number
  EXPECT_EQ(marker.len, kWrapLen);
  EXPECT_EQ(marker.check, ~kWrapLen);
  RawRecord rec = RecordAt(m, 0);
  EXPECT_EQ(rec.seq, 2u);
  EXPECT_EQ(rec.len, 100u);
  EXPECT_EQ(rec.check, ~100u);
  EXPECT_EQ(m.header()->head.load(), 1024u + RecordBytes(100));
  EXPECT_EQ(PopOk(consumer), Record(2, 100));
  EXPECT_EQ(m.header()->tail.load(), 1024u + RecordBytes(100));
}

TEST(ShmRingTest, LessThanARecordHeaderBeforeTheEndIsSkippedWithoutAMarker) {
  RingMemory m(1024);
  ShmRing producer(m.header(), m.bytes()), consumer(m.header(), m.bytes());
  // Records of 504 and 512 bytes end at 1016: 8 bytes are left, no room for a marker.
  ASSERT_EQ(RecordBytes(488) + RecordBytes(496), 1016u);
  ASSERT_TRUE(producer.Push(Record(0, 488)));
  ASSERT_TRUE(producer.Push(Record(1, 496)));
  PopOk(consumer);
  PopOk(consumer);
  ASSERT_TRUE(producer.Push(Record(2, 40)));
  for (int i = 1016; i < 1024; ++i) EXPECT_EQ(uint8_t(m.data()[i]), 0xABu) << i;  // untouched
  EXPECT_EQ(RecordAt(m, 0).seq, 2u);
  EXPECT_EQ(PopOk(consumer), Record(2, 40));
  std::string f;
  EXPECT_EQ(consumer.Pop(&f), ShmRing::PopResult::kEmpty);
}

TEST(ShmRingTest, FullRingRefusesAPushUntilAPopMakesRoom) {
  RingMemory m(1024);
  ShmRing producer(m.header(), m.bytes()), consumer(m.header(), m.bytes());
  ASSERT_EQ(RecordBytes(112), 128u);  // 8 of them fill the ring exactly
  uint64_t pushed = 0;
  while (producer.Push(Record(pushed, 112))) ++pushed;
  EXPECT_EQ(pushed, 8u);
  EXPECT_FALSE(producer.Push(Record(pushed, 1))) << "even the smallest record: no room";
  EXPECT_EQ(PopOk(consumer), Record(0, 112));
  ASSERT_TRUE(producer.Push(Record(pushed, 112)));  // the pop made room for one
  EXPECT_FALSE(producer.Push(Record(pushed + 1, 1)));
  for (uint64_t i = 1; i <= pushed; ++i) EXPECT_EQ(PopOk(consumer), Record(i, 112)) << i;
  std::string f;
  EXPECT_EQ(consumer.Pop(&f), ShmRing::PopResult::kEmpty);
}

TEST(ShmRingTest, LargestFrameFitsAndOneByteMoreNever) {
  RingMemory m(1024);
  ShmRing producer(m.header(), m.bytes()), consumer(m.header(), m.bytes());
  const uint64_t max = producer.max_frame();
  ASSERT_EQ(max, 1024u / 2 - 16);
  EXPECT_FALSE(producer.Push(Record(0, max + 1)));  // also on an empty ring
  EXPECT_FALSE(producer.Push("x", 1, std::string(max, 'y')));
  // Two of the largest fill the ring exactly, round and round.
  for (uint64_t i = 0; i < 20; i += 2) {
    ASSERT_TRUE(producer.Push(Record(i, max)));
    ASSERT_TRUE(producer.Push(Record(i + 1, max)));
    EXPECT_FALSE(producer.Push(Record(99, 1)));
    EXPECT_EQ(PopOk(consumer), Record(i, max));
    EXPECT_EQ(PopOk(consumer), Record(i + 1, max));
  }
  // After a small record, the second largest one would wrap: it waits for
  // both the small one and the first large one to go.
  ASSERT_TRUE(producer.Push(Record(100, 8)));    // at 0, 24 bytes
  ASSERT_TRUE(producer.Push(Record(101, max)));  // at 24, up to 536
  EXPECT_EQ(PopOk(consumer), Record(100, 8));
  EXPECT_FALSE(producer.Push(Record(102, max)));  // 488 before the end + 512
  EXPECT_EQ(PopOk(consumer), Record(101, max));
  ASSERT_TRUE(producer.Push(Record(102, max)));
  EXPECT_EQ(RecordAt(m, 536).len, kWrapLen);
  EXPECT_EQ(PopOk(consumer), Record(102, max));
}

TEST(ShmRingTest, RecordWithAnotherSequenceNumberIsRefusedAndTheRingResynchronised) {
  RingMemory m(1024);
  ShmRing producer(m.header(), m.bytes()), consumer(m.header(), m.bytes());
  ASSERT_TRUE(producer.Push("first"));
  std::string old(m.data(), RecordBytes(5));  // record 0, as a stale writer would replay it
  EXPECT_EQ(PopOk(consumer), "first");
  // The stale bytes at the tail, and a head that covers them.
  memcpy(m.data() + RecordBytes(5), old.data(), old.size());
  m.header()->head.store(2 * RecordBytes(5));
  std::string f;
  ShmRing::Position at;
  EXPECT_EQ(consumer.Peek(&f, &at), ShmRing::PopResult::kCorrupt);
  EXPECT_EQ(consumer.Pop(&f), ShmRing::PopResult::kCorrupt);  // refused again: nothing consumed
  consumer.SkipAll();
  EXPECT_FALSE(consumer.HasData());
  // The producer's next record (number 1) is read again.
  ASSERT_TRUE(producer.Push("second"));
  EXPECT_EQ(PopOk(consumer), "second");
}

TEST(ShmRingTest, RecordWithABadLengthCheckIsRefused) {
  RingMemory m(1024);
  ShmRing producer(m.header(), m.bytes()), consumer(m.header(), m.bytes());
  ASSERT_TRUE(producer.Push("torn"));
  uint32_t bad = 0x12345678;
  memcpy(m.data() + 12, &bad, 4);  // ~len
  std::string f;
  EXPECT_EQ(consumer.Pop(&f), ShmRing::PopResult::kCorrupt);
  consumer.SkipAll();
  EXPECT_EQ(consumer.Pop(&f), ShmRing::PopResult::kEmpty);
  ASSERT_TRUE(producer.Push("next"));
  EXPECT_EQ(PopOk(consumer), "next");
}

TEST(ShmRingTest, LengthBeyondHeadOrEndAndImpossibleCountersAreRefused) {
  RingMemory m(1024);
  ShmRing producer(m.header(), m.bytes()), consumer(m.header(), m.bytes());
  ASSERT_TRUE(producer.Push("short"));
  // A consistent (len, ~len) pair naming more bytes than head covers.
  uint32_t len = 600, check = ~len;
  memcpy(m.data() + 8, &len, 4);
  memcpy(m.data() + 12, &check, 4);
  std::string f;
  EXPECT_EQ(consumer.Pop(&f), ShmRing::PopResult::kCorrupt);
  // ... and one that runs past the end of the ring.
  len = 2000;
  check = ~len;
  memcpy(m.data() + 8, &len, 4);
  memcpy(m.data() + 12, &check, 4);
  m.header()->head.store(1024);
  EXPECT_EQ(consumer.Pop(&f), ShmRing::PopResult::kCorrupt);
  // A head more than the ring's size ahead of the tail.
  m.header()->head.store(1024 + 8);
  EXPECT_EQ(consumer.Pop(&f), ShmRing::PopResult::kCorrupt);
  m.header()->head.store(1024);
  consumer.SkipAll();
  EXPECT_EQ(consumer.Pop(&f), ShmRing::PopResult::kEmpty);
}

TEST(ShmRingTest, PeekLeavesTheRecordUntilConsumed) {
  RingMemory m(4096 - sizeof(RingHeader));
  ShmRing producer(m.header(), m.bytes()), consumer(m.header(), m.bytes());
  ASSERT_TRUE(producer.Push("first"));
  ASSERT_TRUE(producer.Push("second"));
  std::string f;
  ShmRing::Position at;
  ASSERT_EQ(consumer.Peek(&f, &at), ShmRing::PopResult::kOk);
  EXPECT_EQ(f, "first");
  ASSERT_EQ(consumer.Peek(&f, &at), ShmRing::PopResult::kOk);  // still there
  EXPECT_EQ(f, "first");
  consumer.Consume(at);
  ASSERT_EQ(consumer.Pop(&f), ShmRing::PopResult::kOk);
  EXPECT_EQ(f, "second");
  EXPECT_EQ(consumer.Peek(&f, &at), ShmRing::PopResult::kEmpty);
}

TEST(ShmRingTest, ProducerRereadsTheTailOnlyWhenItsCopySaysFull) {
  RingMemory m(4096 - sizeof(RingHeader));
  RingHeader* h = m.header();
  uint64_t copy = 0;  // the producer's tail copy, kept outside (as the master keeps one per slot)
  ShmRing producer(h, m.bytes(), &copy), consumer(h, m.bytes());
  const std::string rec(200, 'r');
  int pushed = 0;
  while (producer.Push(rec)) ++pushed;  // fills the ring: the copy (0) is the real tail
  ASSERT_GT(pushed, 5);
  EXPECT_EQ(copy, 0u);
  std::string f;
  for (int i = 0; i < pushed; ++i) ASSERT_EQ(consumer.Pop(&f), ShmRing::PopResult::kOk);
  ASSERT_TRUE(producer.Push(rec));  // full by the copy: re-read, room again
  EXPECT_EQ(copy, h->tail.load());
  // A reset ring (both counters 0) with a copy from before: the copy is
  // ahead of head, so it is re-read, and the ring still never over-fills.
  ShmRing::Reset(h);
  int again = 0;
  while (producer.Push(rec)) ++again;
  EXPECT_EQ(again, pushed);
  for (int i = 0; i < again; ++i) {
    ASSERT_EQ(consumer.Pop(&f), ShmRing::PopResult::kOk);
    EXPECT_EQ(f, rec);
  }
  EXPECT_EQ(consumer.Pop(&f), ShmRing::PopResult::kEmpty);
}

TEST(ShmRingTest, RequestIdsTagTheAttachment) {
  uint64_t g1 = (uint64_t(3) << 32) + 17, g2 = (uint64_t(3) << 32) + 18, g3 = (uint64_t(4) << 32) + 17;
  EXPECT_TRUE(RingRequestOf(RingRequestId(g1, 5), g1));
  EXPECT_FALSE(RingRequestOf(RingRequestId(g1, 5), g2));  // a request of an earlier attachment
  EXPECT_FALSE(RingRequestOf(RingRequestId(g1, 5), g3));  // or of another master incarnation
  EXPECT_NE(RingRequestId(g1, 5), RingRequestId(g1, 6));
}

// The producer in a child process, the consumer here, the ring in a
// MAP_SHARED mapping: every record arrives whole and in order across many
// wraps, and a consumer that sleeps on the futex is woken across processes.
TEST(SpinWaitTest, AYieldThatRanAnotherTaskForASliceStopsYieldsOnlyWhereAsked) {
  SpinWait peer;  // a short long yield, then data: the peer shares our core
  peer.NoteYield(5000);
  peer.Found();
  EXPECT_EQ(peer.pause_ns(), 0u);
  EXPECT_TRUE(peer.yields());
  SpinWait server;  // not asked: keeps yielding after a hogged yield
  server.NoteYield(SpinWait::kThirdPartyNs + 1);
  EXPECT_TRUE(server.yields());
  SpinWait client(true);
  client.NoteYield(SpinWait::kThirdPartyNs + 1);
  EXPECT_FALSE(client.yields());
  for (uint32_t i = 0; i + 1 < SpinWait::kNoYieldWaits; ++i) client.Found();
  EXPECT_FALSE(client.yields());
  client.Found();  // kNoYieldWaits waits later: yields may find the core free again
  EXPECT_TRUE(client.yields());
  EXPECT_NE(client.pause_ns(), 0u);  // a hogged yield does not say the peer shares our core
}

TEST(ShmRingTest, TwoProcessesStreamThroughSharedMemory) {
  constexpr uint64_t kRingBytes = sizeof(RingHeader) + 4096;
  constexpr uint64_t kRecords = 20000;
  void* mem = mmap(nullptr, kRingBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* h = static_cast<RingHeader*>(mem);
  ShmRing::Reset(h);
  const uint64_t max = ShmRing(h, kRingBytes).max_frame();
  auto size_of = [max](uint64_t n) { return size_t(1 + (n * 2654435761u) % max); };

  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the producer: no gtest here, only an exit code
    ShmRing producer(h, kRingBytes);
    const uint64_t give_up = MonoNs() + 120ull * 1000000000ull;  // a don't-hang guard
    for (uint64_t n = 0; n < kRecords; ++n) {
      const std::string rec = Record(n, size_of(n));
      while (!producer.Push(rec)) {
        if (MonoNs() > give_up) _exit(2);
        sched_yield();  // full: the consumer frees room
      }
      producer.WakeConsumer();
    }
    _exit(0);
  }
  ShmRing consumer(h, kRingBytes);
  SpinWait spin;
  uint64_t n = 0;
  for (; n < kRecords; ++n) {
    // Odd records: sleep on the futex at once (no polling window).
    const uint64_t spin_ns = n % 2 ? 0 : 20000;
    if (!consumer.WaitForData(spin_ns, 60ull * 1000000000ull, &spin)) {
      ADD_FAILURE() << "no record " << n << " within the guard";
      break;
    }
    std::string f;
    ShmRing::PopResult r = consumer.Pop(&f);
    if (r != ShmRing::PopResult::kOk || f != Record(n, size_of(n))) {
      ADD_FAILURE() << "record " << n << (r == ShmRing::PopResult::kOk ? " differs" : " not popped");
      break;
    }
  }
  if (n < kRecords) kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(n, kRecords);
  std::string f;
  EXPECT_EQ(consumer.Pop(&f), ShmRing::PopResult::kEmpty);
  munmap(mem, kRingBytes);
}

}  // namespace
}  // namespace mcxl
