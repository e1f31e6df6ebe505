// MasterFixture: a Master in-process on a fresh pool file in /dev/shm,
// driven through Handle() with encoded payloads, as a transport would.
//
// Contract: SetUp makes the pool's directory and a default config (a 64 MiB
// pool, formatted); a test adjusts config_ and calls StartMaster(), which
// (re)creates the master, the old one destroyed first (a restart when
// config_.format is false); StartedMasterFixture starts it in SetUp.
// TearDown destroys the master and removes the directory. Calls go over
// "connection" conn_slot_ unless given another; Attach binds it as a
// transport's connection would be bound.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/control/rpc_protocol.h"
#include "mooncake_cxl/master/master.h"
#include "mooncake_cxl/pool/key_hash.h"
#include "mooncake_cxl/pool/object_index.h"
#include "mooncake_cxl/pool/pool.h"
#include "shm_dir.h"
#include "wire.h"

namespace mcxl {
namespace testutil {

inline std::string Hostname() {
  char buf[256] = {};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

// The credential a client reads from the pool it maps (access control).
inline void SetToken(const Pool& pool, AttachRequest* req) {
  memcpy(req->token, pool.superblock()->auth_token, sizeof(req->token));
}

// Value bytes derived from the key, so that a read can be checked.
// What Client::PinValue leaves in the pool: a claimed record.
inline void PinInTable(const Pool& pool, uint32_t slot, uint32_t record, const EntrySnapshot& s) {
  ClientSlot* cs = pool.client_slot(slot);
  PinRecord& rec = pool.pin_table(slot)[record];
  rec.object_offset.store(s.object_offset);
  rec.generation.store(s.generation());
  cs->pins_in_use.fetch_add(1);
  if (cs->pin_high_water.load() < record + 1) cs->pin_high_water.store(record + 1);
}

inline std::string ValueFor(const std::string& key, size_t size) {
  std::string v(size, '\0');
  for (size_t i = 0; i < size; ++i) v[i] = char(KeyHash(key) >> (i % 8 * 8)) ^ char(i);
  return v;
}

class MasterFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLogLevel(LogLevel::kError);
    dir_ = std::make_unique<ShmDir>(::testing::UnitTest::GetInstance()->current_test_suite()->name());
    ASSERT_FALSE(dir_->path().empty());
    config_.cxl_path = dir_->File("pool");
    config_.cxl_size = 64 * kMiB;
    config_.format = true;
  }
  void TearDown() override {
    index_.reset();
    master_.reset();
    dir_.reset();
    SetLogLevel(LogLevel::kInfo);
  }
  void StartMaster() {
    index_.reset();
    master_.reset();
    conn_slot_ = Master::kNoSlot;
    auto m = Master::Create(config_);
    ASSERT_TRUE(m.ok()) << ErrorCodeName(m.error());
    master_ = std::move(m.value());
    index_ = std::make_unique<ObjectIndex>(&master_->pool());
  }
  const std::string& dir() const { return dir_->path(); }

  // ---- requests through Handle ----
  std::string Call(MessageType type, const std::string& payload, uint32_t* conn = nullptr) {
    return master_->Handle(uint16_t(type), payload, conn != nullptr ? conn : &conn_slot_);
  }
  // Calls and decodes the reply (kept alive while decoding).
  template <typename R>
  R CallFor(MessageType type, const std::string& payload, uint32_t* conn = nullptr) {
    const std::string bytes = Call(type, payload, conn);
    Decoder d(bytes);
    R r;
    EXPECT_TRUE(Decode(&d, &r)) << MessageTypeName(uint16_t(type));
    return r;
  }

  // An Attach of a process of `machine` (this host's by default: the pid
  // must then be running), with the pool's token unless !with_token.
  AttachRequest AttachRequestFor(const std::string& name, uint64_t pid = uint64_t(getpid()),
                                 const std::string& machine = Hostname(), bool with_token = true) const {
    AttachRequest req;
    req.local_hostname = name;
    req.machine = machine;
    req.pid = pid;
    if (with_token) SetToken(master_->pool(), &req);
    return req;
  }
  AttachReply AttachWith(const AttachRequest& req, uint32_t* conn = nullptr) {
    return CallFor<AttachReply>(MessageType::kAttach, Enc(req), conn);
  }
  // An attach expected to succeed: the client it made.
  ClientRef Attach(const AttachRequest& req, uint32_t* conn = nullptr) {
    AttachReply reply = AttachWith(req, conn);
    EXPECT_EQ(reply.status, ErrorCode::OK);
    return {reply.slot, reply.slot_generation};
  }
  ClientRef Attach(const std::string& name = "client:1") { return Attach(AttachRequestFor(name)); }
  // The client bound to conn_slot_ (the last Attach or PutStart).
  ClientRef Conn() const {
    if (conn_slot_ == Master::kNoSlot) return {};
    return {conn_slot_, master_->pool().client_slot(conn_slot_)->generation.load()};
  }

  // ---- puts, as a client makes them ----
  // PutStart of `keys` by client c, over c's own connection (conn_slot_ is
  // bound to c: each client has a connection of its own).
  PutStartReply PutStart(const ClientRef& c, const std::vector<std::string>& keys,
                         const std::vector<uint64_t>& sizes, bool upsert = false) {
    PutStartRequest req;
    req.client = c;
    conn_slot_ = c.slot;
    req.upsert = upsert;
    req.keys = keys;
    req.sizes = sizes;
    return CallFor<PutStartReply>(MessageType::kPutStart, Enc(req));
  }
  // What a client does after PutStart: copy the value, publish COMPLETE.
  void WriteAndPublish(const PutStartItem& item, const std::string& value) {
    memcpy(master_->pool().base() + item.value_offset, value.data(), value.size());
    ASSERT_TRUE(index_->PublishComplete(item.entry_slot, item.generation));
  }
  // A whole put of one key (value ValueFor(key, size)), then a Tick.
  PutStartItem Put(const ClientRef& c, const std::string& key, size_t size, bool upsert = false) {
    PutStartReply r = PutStart(c, {key}, {size}, upsert);
    EXPECT_EQ(r.status, ErrorCode::OK);
    EXPECT_EQ(r.items.size(), 1u);
    if (r.items.size() != 1 || r.items[0].status != ErrorCode::OK) {
      ADD_FAILURE() << "put of " << key << " failed";
      return {};
    }
    WriteAndPublish(r.items[0], ValueFor(key, size));
    master_->Tick();
    return r.items[0];
  }

  // ---- reads, as a client makes them (one-sided) ----
  // The value a reader sees, or "" when not found.
  std::string Get(const std::string& key) {
    auto s = index_->FindComplete(key, KeyHash(key));
    if (!s.ok()) return "";
    const char* p = index_->ValuePtr(*s, key);
    EXPECT_NE(p, nullptr);
    if (p == nullptr) return "";
    std::string v(p, s->value_size);
    EXPECT_TRUE(index_->StillValid(*s));
    return v;
  }
  bool Found(const std::string& key) { return index_->FindComplete(key, KeyHash(key)).ok(); }

  // ---- removes, by the client bound to conn_slot_ ----
  ErrorCode Remove(const std::string& key, bool force = false) {
    return StatusOf(Call(MessageType::kRemove, Enc(RemoveRequest{Conn(), {key}, force})));
  }
  CountReply RemoveMatching(MessageType type, const std::string& pattern, bool force) {
    return CallFor<CountReply>(type, Enc(RemoveByRegexRequest{Conn(), pattern, force}));
  }

  MasterConfig config_;
  std::unique_ptr<Master> master_;
  std::unique_ptr<ObjectIndex> index_;
  uint32_t conn_slot_ = Master::kNoSlot;

 private:
  std::unique_ptr<ShmDir> dir_;
};

// The same, with the master started in SetUp (the default config).
class StartedMasterFixture : public MasterFixture {
 protected:
  void SetUp() override {
    MasterFixture::SetUp();
    if (!HasFatalFailure()) StartMaster();
  }
};

}  // namespace testutil
}  // namespace mcxl
