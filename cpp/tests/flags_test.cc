// FlagSet: gflags-style parsing (--a=1, --a 1, --b, --b=false, --nob,
// -single-dash), typed values and their errors, unknown flags, ignored
// Mooncake flags, --help and the usage text.
#include "mooncake_cxl/common/flags.h"

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <vector>

namespace mcxl {
namespace {

struct Flags {
  int64_t a = 5;
  uint64_t u = 7;
  bool b = false;
  bool on = true;
  double d = 0.5;
  std::string s = "def";
  FlagSet set;

  Flags() {
    set.Add("a", &a, "an int");
    set.Add("u", &u, "an unsigned");
    set.Add("b", &b, "a bool");
    set.Add("on", &on, "a bool that defaults to true");
    set.Add("d", &d, "a double");
    set.Add("s", &s, "a string");
    set.Ignore("etcd_endpoints");
    set.Ignore("enable_gc");
  }
  // Parses `args` (program name prepended); returns success.
  bool Parse(std::initializer_list<const char*> args) {
    std::vector<std::string> store{"prog"};
    for (const char* a : args) store.emplace_back(a);
    std::vector<char*> argv;
    for (auto& x : store) argv.push_back(x.data());
    error.clear();
    return set.Parse(int(argv.size()), argv.data(), &error, &help);
  }
  std::string error;
  bool help = false;
};

TEST(FlagsTest, DefaultsWithoutArguments) {
  Flags f;
  ASSERT_TRUE(f.Parse({}));
  EXPECT_EQ(f.a, 5);
  EXPECT_EQ(f.u, 7u);
  EXPECT_FALSE(f.b);
  EXPECT_TRUE(f.on);
  EXPECT_EQ(f.s, "def");
  EXPECT_FALSE(f.help);
}

TEST(FlagsTest, EqualsAndSeparateValues) {
  Flags f;
  ASSERT_TRUE(f.Parse({"--a=1", "--u", "42", "--d=2.25", "--s", "hello world"})) << f.error;
  EXPECT_EQ(f.a, 1);
  EXPECT_EQ(f.u, 42u);
  EXPECT_DOUBLE_EQ(f.d, 2.25);
  EXPECT_EQ(f.s, "hello world");
  Flags g;
  ASSERT_TRUE(g.Parse({"--a", "-3", "--s=", "-u=9"})) << g.error;
  EXPECT_EQ(g.a, -3);  // a negative value after a space is a value, not a flag
  EXPECT_EQ(g.s, "");
  EXPECT_EQ(g.u, 9u);  // a single dash works too
  Flags h;
  ASSERT_TRUE(h.Parse({"--s=a=b"}));
  EXPECT_EQ(h.s, "a=b");  // only the first '=' separates
}

TEST(FlagsTest, BoolForms) {
  Flags f;
  ASSERT_TRUE(f.Parse({"--b"}));
  EXPECT_TRUE(f.b);
  ASSERT_TRUE(f.Parse({"--b=false"}));
  EXPECT_FALSE(f.b);
  ASSERT_TRUE(f.Parse({"--b=true"}));
  EXPECT_TRUE(f.b);
  ASSERT_TRUE(f.Parse({"--b=0"}));
  EXPECT_FALSE(f.b);
  ASSERT_TRUE(f.Parse({"--b", "true", "--a=2"}));
  EXPECT_TRUE(f.b);
  EXPECT_EQ(f.a, 2);
  ASSERT_TRUE(f.Parse({"--b", "false"}));
  EXPECT_FALSE(f.b);
  ASSERT_TRUE(f.Parse({"--noon"}));
  EXPECT_FALSE(f.on);
  ASSERT_TRUE(f.Parse({"--b", "--nob"}));  // last one wins
  EXPECT_FALSE(f.b);
  EXPECT_FALSE(f.Parse({"--b=maybe"}));
  EXPECT_NE(f.error.find("--b"), std::string::npos);
  EXPECT_FALSE(f.Parse({"--noa"}));  // "no" only negates bools
  EXPECT_NE(f.error.find("noa"), std::string::npos);
  EXPECT_FALSE(f.Parse({"--nob=true"}));
}

TEST(FlagsTest, UnknownFlagFailsWithItsName) {
  Flags f;
  EXPECT_FALSE(f.Parse({"--a=1", "--bogus=3"}));
  EXPECT_NE(f.error.find("bogus"), std::string::npos) << f.error;
  EXPECT_FALSE(f.Parse({"positional"}));
  EXPECT_NE(f.error.find("positional"), std::string::npos) << f.error;
}

TEST(FlagsTest, BadValuesFail) {
  for (const char* arg : {"--a=x", "--a=12x", "--a=", "--a=99999999999999999999", "--u=-1",
                          "--u=1.5", "--d=abc", "--d="}) {
    Flags f;
    EXPECT_FALSE(f.Parse({arg})) << arg;
    EXPECT_NE(f.error.find("invalid value"), std::string::npos) << f.error;
  }
  Flags f;
  EXPECT_FALSE(f.Parse({"--a"}));  // needs a value
  EXPECT_NE(f.error.find("needs a value"), std::string::npos) << f.error;
}

TEST(FlagsTest, IgnoredFlagsAreAcceptedAndReported) {
  Flags f;
  ASSERT_TRUE(f.Parse({"--etcd_endpoints", "http://x:2379", "--a=3", "--enable_gc=true"})) << f.error;
  EXPECT_EQ(f.a, 3);
  EXPECT_EQ(f.set.ignored_seen(), (std::vector<std::string>{"etcd_endpoints", "enable_gc"}));
  Flags g;
  ASSERT_TRUE(g.Parse({"--enable_gc", "--b"}));  // a bare ignored flag does not eat the next
  EXPECT_TRUE(g.b);
}

TEST(FlagsTest, HelpAndUsage) {
  Flags f;
  ASSERT_TRUE(f.Parse({"--help"}));
  EXPECT_TRUE(f.help);
  std::string usage = f.set.Usage("prog");
  for (const char* needle : {"--a", "an int", "--s", "\"def\"", "--etcd_endpoints"})
    EXPECT_NE(usage.find(needle), std::string::npos) << needle;
}

}  // namespace
}  // namespace mcxl

namespace mcxl {
namespace {

// WasSet tells a flag given on the command line (even at its default value:
// a deliberate choice, e.g. --rpc_address=0.0.0.0) from one left unset.
TEST(FlagSetTest, WasSetTellsGivenFromDefaulted) {
  Flags f;
  ASSERT_TRUE(f.Parse({"--s=def", "--b", "--noon", "--a", "5"}));
  EXPECT_TRUE(f.set.WasSet("s"));
  EXPECT_TRUE(f.set.WasSet("b"));
  EXPECT_TRUE(f.set.WasSet("on"));
  EXPECT_TRUE(f.set.WasSet("a"));
  EXPECT_FALSE(f.set.WasSet("u"));
  EXPECT_FALSE(f.set.WasSet("d"));
  EXPECT_FALSE(f.set.WasSet("etcd_endpoints"));
  EXPECT_FALSE(f.set.WasSet("no_such_flag"));
  Flags g;
  ASSERT_FALSE(g.Parse({"--u=-1"}));  // a rejected value does not count as set
  EXPECT_FALSE(g.set.WasSet("u"));
}

}  // namespace
}  // namespace mcxl
