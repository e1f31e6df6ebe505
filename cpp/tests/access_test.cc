// Access control (access.h): the decision functions (loopback, exposure
// warnings, key listing, pool file modes, token comparison), pool file modes
// at create and format, and the master's checks driven through Handle(): an
// Attach without the pool's token takes no slot, requests from a connection
// that did not attach (or attached another slot) change nothing, a local pid
// claim must name a running process, and a full table gives up the slots of
// dead local processes to a new attach.
#include "mooncake_cxl/common/access.h"

#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "mooncake_cxl/master/master.h"
#include "test_util/master_fixture.h"

namespace mcxl {
namespace {

using testutil::Enc;
using testutil::Hostname;
using testutil::kMiB;
using testutil::StatusOf;

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(stat(path.c_str(), &st), 0);
  return st.st_mode & 07777;
}

// A pid that was just used and is no longer running.
uint64_t DeadPid() {
  pid_t p = fork();
  if (p == 0) _exit(0);
  int status = 0;
  waitpid(p, &status, 0);
  return uint64_t(p);
}

TEST(AccessDecisionTest, Loopback) {
  for (const char* a : {"127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1", "localhost"})
    EXPECT_TRUE(IsLoopbackAddress(a)) << a;
  for (const char* a : {"0.0.0.0", "::", "10.0.0.1", "192.168.1.5", "128.0.0.1", "::ffff:10.0.0.1", "", "bogus"})
    EXPECT_FALSE(IsLoopbackAddress(a)) << a;
}

TEST(AccessDecisionTest, ExposureWarningsForDefaultWildcardListeners) {
  // Mooncake's defaults (0.0.0.0, not given on the command line): one
  // warning per listener, naming the address and the flag that fixes it.
  auto w = ExposureWarnings("0.0.0.0", false, "0.0.0.0", false);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_NE(w[0].find("RPC listens on 0.0.0.0"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("--rpc_address=127.0.0.1"), std::string::npos) << w[0];
  EXPECT_NE(w[1].find("monitoring HTTP listens on 0.0.0.0"), std::string::npos) << w[1];
  EXPECT_NE(w[1].find("--metrics_host"), std::string::npos) << w[1];
  // Only the defaulted one warns; an address given explicitly is deliberate.
  w = ExposureWarnings("0.0.0.0", true, "0.0.0.0", false);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("monitoring"), std::string::npos);
  w = ExposureWarnings("10.1.2.3", false, "0.0.0.0", true);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("RPC listens on 10.1.2.3"), std::string::npos);
  EXPECT_TRUE(ExposureWarnings("0.0.0.0", true, "0.0.0.0", true).empty());
  EXPECT_TRUE(ExposureWarnings("127.0.0.1", false, "127.0.0.1", false).empty());
}

TEST(AccessDecisionTest, KeyListingIsLoopbackOnlyUnlessEnabled) {
  EXPECT_TRUE(KeyListingAllowed(false, "127.0.0.1"));
  EXPECT_TRUE(KeyListingAllowed(false, "::1"));
  EXPECT_FALSE(KeyListingAllowed(false, "10.0.0.7"));
  EXPECT_FALSE(KeyListingAllowed(false, ""));
  EXPECT_TRUE(KeyListingAllowed(true, "10.0.0.7"));
}

TEST(AccessDecisionTest, RemoteSecrets) {
  EXPECT_TRUE(SecretsEqual("abc", "abc"));
  EXPECT_FALSE(SecretsEqual("abc", "abd"));
  EXPECT_FALSE(SecretsEqual("abc", "abcd"));
  EXPECT_FALSE(SecretsEqual("", "x"));
  char dir[] = "/tmp/mcxl_secret_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  std::string path = std::string(dir) + "/secret", secret, again, why;
  ASSERT_TRUE(LoadOrCreateSecret(path, &secret, &why)) << why;
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);  // created owner-only
  EXPECT_EQ(secret.size(), 32u);
  ASSERT_TRUE(LoadOrCreateSecret(path, &again, &why));
  EXPECT_EQ(again, secret);  // read back, not replaced
  ASSERT_EQ(chmod(path.c_str(), 0644), 0);
  EXPECT_FALSE(LoadOrCreateSecret(path, &again, &why));  // others may read it: refused
  EXPECT_NE(why.find("chmod 600"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(AccessDecisionTest, PoolModes) {
  std::string why;
  EXPECT_TRUE(PoolModeAcceptable(S_IFREG | 0600, false, &why));
  EXPECT_TRUE(PoolModeAcceptable(S_IFREG | 0660, false, &why));
  EXPECT_TRUE(PoolModeAcceptable(S_IFCHR | 0640, false, &why));
  EXPECT_FALSE(PoolModeAcceptable(S_IFREG | 0644, false, &why));
  EXPECT_NE(why.find("0644"), std::string::npos) << why;
  EXPECT_FALSE(PoolModeAcceptable(S_IFREG | 0602, false, &why));
  EXPECT_NE(why.find("overwrite"), std::string::npos) << why;
  EXPECT_FALSE(PoolModeAcceptable(S_IFCHR | 0666, false, &why));
  EXPECT_TRUE(PoolModeAcceptable(S_IFREG | 0666, true, &why));
}

TEST(AccessDecisionTest, TokensEqual) {
  uint8_t a[16], b[16];
  for (int i = 0; i < 16; ++i) a[i] = b[i] = uint8_t(i * 7);
  EXPECT_TRUE(TokensEqual(a, b));
  for (int i = 0; i < 16; ++i) {
    b[i] ^= 0x80;
    EXPECT_FALSE(TokensEqual(a, b)) << i;
    b[i] ^= 0x80;
  }
}

class AccessTest : public testutil::MasterFixture {
 protected:
  void SetUp() override {
    MasterFixture::SetUp();
    config_.cxl_size = 16 * kMiB;
    config_.client_slots = 8;
  }
  AttachRequest Request(const std::string& name, uint64_t pid, bool with_token) {
    return AttachRequestFor(name, pid, Hostname(), with_token);
  }
};

TEST_F(AccessTest, FormatWritesARandomToken) {
  StartMaster();
  uint8_t first[16], zero[16] = {};
  memcpy(first, master_->pool().superblock()->auth_token, 16);
  EXPECT_NE(memcmp(first, zero, 16), 0);
  StartMaster();  // --format again: a new credential
  EXPECT_NE(memcmp(first, master_->pool().superblock()->auth_token, 16), 0);
  config_.format = false;  // a restart keeps it
  uint8_t second[16];
  memcpy(second, master_->pool().superblock()->auth_token, 16);
  StartMaster();
  EXPECT_EQ(memcmp(second, master_->pool().superblock()->auth_token, 16), 0);
}

TEST_F(AccessTest, AttachWithoutTokenTakesNoSlot) {
  StartMaster();
  uint32_t conn = Master::kNoSlot;
  // Far more tokenless attaches (claiming pid 1) than slots.
  for (int i = 0; i < 100; ++i) {
    AttachRequest bad = Request("flood", 1, false);
    if (i % 2) memset(bad.token, 0x5a, 16);  // a wrong token
    EXPECT_EQ(AttachWith(bad, &conn).status, ErrorCode::ILLEGAL_CLIENT);
  }
  EXPECT_EQ(conn, Master::kNoSlot);
  EXPECT_EQ(master_->stats().attached_clients, 0u);
  EXPECT_EQ(master_->stats().refused_requests, 100u);
  AttachReply ok = AttachWith(Request("real", uint64_t(getpid()), true), &conn);
  EXPECT_EQ(ok.status, ErrorCode::OK);
  EXPECT_EQ(conn, ok.slot);
}

TEST_F(AccessTest, RequestsFromAnUnattachedConnectionChangeNothing) {
  StartMaster();
  uint32_t real_conn = Master::kNoSlot;
  ClientRef real = Attach(Request("real", uint64_t(getpid()), true), &real_conn);
  Put(real, "keep", 64);  // over real's connection
  ASSERT_EQ(master_->stats().complete_keys, 1u);

  // A peer that knows (or guesses) the real client's slot and generation but
  // never attached, and one attached as another client, both naming `real`.
  uint32_t none = Master::kNoSlot;
  uint32_t other_conn = Master::kNoSlot;
  ASSERT_EQ(AttachWith(Request("other", uint64_t(getpid()), true), &other_conn).status, ErrorCode::OK);
  ASSERT_NE(other_conn, real.slot);
  PutStartRequest put;
  put.client = real;
  put.keys = {"intruder"};
  put.sizes = {64};
  for (uint32_t* conn : {&none, &other_conn}) {
    EXPECT_EQ(StatusOf(Call(MessageType::kRemoveAll, Enc(RemoveByRegexRequest{real, "", true}), conn)),
              ErrorCode::ILLEGAL_CLIENT);
    EXPECT_EQ(StatusOf(Call(MessageType::kRemoveByRegex, Enc(RemoveByRegexRequest{real, ".*", true}), conn)),
              ErrorCode::ILLEGAL_CLIENT);
    EXPECT_EQ(StatusOf(Call(MessageType::kRemove, Enc(RemoveRequest{real, {"keep"}, true}), conn)),
              ErrorCode::ILLEGAL_CLIENT);
    EXPECT_EQ(StatusOf(Call(MessageType::kBatchRemove, Enc(RemoveRequest{real, {"keep"}, true}), conn)),
              ErrorCode::ILLEGAL_CLIENT);
    EXPECT_EQ(StatusOf(Call(MessageType::kPutStart, Enc(put), conn)), ErrorCode::ILLEGAL_CLIENT);
    EXPECT_EQ(StatusOf(Call(MessageType::kHeartbeat, Enc(real), conn)), ErrorCode::ILLEGAL_CLIENT);
    EXPECT_EQ(StatusOf(Call(MessageType::kDetach, Enc(real), conn)), ErrorCode::ILLEGAL_CLIENT);
  }
  EXPECT_EQ(none, Master::kNoSlot);
  MasterStats st = master_->stats();
  EXPECT_EQ(st.complete_keys, 1u);
  EXPECT_EQ(st.pending_puts, 0u);
  EXPECT_EQ(st.attached_clients, 2u);
  EXPECT_EQ(st.refused_requests, 14u);
  // The bootstrap needs no credential; the real client still works.
  std::string ping = Call(MessageType::kPing, "", &none);
  Decoder d(ping);
  PingReply pr;
  ASSERT_TRUE(Decode(&d, &pr));
  EXPECT_EQ(pr.pool_path, config_.cxl_path);
  EXPECT_EQ(memcmp(pr.uuid, master_->pool().superblock()->uuid, 16), 0);
  EXPECT_EQ(StatusOf(Call(MessageType::kRemove, Enc(RemoveRequest{real, {"keep"}, false}), &real_conn)),
            ErrorCode::OK);
  EXPECT_EQ(StatusOf(Call(MessageType::kDetach, Enc(real), &real_conn)), ErrorCode::OK);
}

TEST_F(AccessTest, LocalPidClaimMustNameARunningProcess) {
  StartMaster();
  uint32_t conn = Master::kNoSlot;
  EXPECT_EQ(AttachWith(Request("dead", DeadPid(), true), &conn).status, ErrorCode::ILLEGAL_CLIENT);
  EXPECT_EQ(AttachWith(Request("zero", 0, true), &conn).status, ErrorCode::ILLEGAL_CLIENT);
  EXPECT_EQ(AttachWith(Request("huge", ~0ull, true), &conn).status, ErrorCode::ILLEGAL_CLIENT);
  EXPECT_EQ(master_->stats().attached_clients, 0u);
  // Another machine's pid cannot be checked here: taken as a hint.
  AttachRequest remote = Request("remote", 12345, true);
  remote.machine = "some-other-host";
  EXPECT_EQ(AttachWith(remote, &conn).status, ErrorCode::OK);
}

TEST_F(AccessTest, FullTableGivesUpSlotsOfDeadLocalProcesses) {
  StartMaster();  // 8 slots
  pid_t child = fork();
  if (child == 0) {
    pause();
    _exit(0);
  }
  for (uint32_t i = 0; i < 8; ++i) {
    uint32_t conn = Master::kNoSlot;
    ASSERT_EQ(AttachWith(Request("child", uint64_t(child), true), &conn).status, ErrorCode::OK) << i;
  }
  uint32_t conn = Master::kNoSlot;
  EXPECT_EQ(AttachWith(Request("late", uint64_t(getpid()), true), &conn).status, ErrorCode::NO_AVAILABLE_HANDLE);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  // No Tick in between: the attach itself finds the slots of the dead process.
  AttachReply r = AttachWith(Request("late", uint64_t(getpid()), true), &conn);
  EXPECT_EQ(r.status, ErrorCode::OK);
  EXPECT_EQ(master_->stats().attached_clients, 1u);
}

TEST_F(AccessTest, CreatedPoolFileIsOwnerOnly) {
  umask(0);  // the mode must not depend on the umask
  StartMaster();
  EXPECT_EQ(ModeOf(config_.cxl_path), 0600u);
  umask(022);
}

TEST_F(AccessTest, CreatedPoolFileWithGroupIs0660) {
  struct group* g = getgrgid(getgid());
  ASSERT_NE(g, nullptr);
  config_.pool_group = g->gr_name;
  StartMaster();
  EXPECT_EQ(ModeOf(config_.cxl_path), 0660u);
  struct stat st {};
  ASSERT_EQ(stat(config_.cxl_path.c_str(), &st), 0);
  EXPECT_EQ(st.st_gid, getgid());
  master_.reset();
  config_.cxl_path = dir() + "/other";
  config_.pool_group = "no-such-group-mcxl";
  EXPECT_EQ(Master::Create(config_).error(), ErrorCode::INVALID_PARAMS);
  EXPECT_FALSE(std::filesystem::exists(config_.cxl_path));
}

TEST_F(AccessTest, FormatRefusesAWorldReadablePoolUnlessAllowed) {
  for (mode_t mode : {0644, 0606, 0666}) {
    SCOPED_TRACE(mode);
    std::filesystem::remove(config_.cxl_path);
    int fd = open(config_.cxl_path.c_str(), O_RDWR | O_CREAT, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, off_t(config_.cxl_size)), 0);
    ASSERT_EQ(fchmod(fd, mode), 0);
    close(fd);
    config_.allow_world_readable_pool = false;
    EXPECT_EQ(Master::Create(config_).error(), ErrorCode::INVALID_PARAMS);
    config_.format = false;  // unformatted: formatted anyway, so refused too
    EXPECT_EQ(Master::Create(config_).error(), ErrorCode::INVALID_PARAMS);
    config_.format = true;
    config_.allow_world_readable_pool = true;
    EXPECT_TRUE(Master::Create(config_).ok());
  }
}

}  // namespace
}  // namespace mcxl
