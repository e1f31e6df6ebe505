// Access control: who may talk to the master, and what a start-up exposes.
//
// Contract (README, "Access control"):
//  * The pool's credential is a random 128-bit token that Format writes into
//    the superblock (Superblock::auth_token). Only a process that can read the
//    pool can know it. A client presents it in its Attach; an Attach without
//    it is ILLEGAL_CLIENT before any slot is taken. The connection that
//    attached is bound to that slot; every other request (all but Ping, the
//    bootstrap) names (slot, generation) and must arrive on a connection bound
//    to that slot (TCP) or on that slot's own ring (gated by pool access).
//  * The pid in an Attach is a liveness hint, not an identity: a peer holding
//    the token is as trusted as any pool reader. A local claim must name a
//    running process (else ILLEGAL_CLIENT).
//  * A client that cannot read the pool (a remote host, over the Transfer
//    Engine) presents instead the operator's secret, a file both sides are
//    given (--auth_token_file, MC_CXL_AUTH_TOKEN_FILE); without one the
//    master refuses every such Attach.
//  * Pure decision functions here, so they can be unit-tested.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mcxl {

constexpr size_t kAuthTokenBytes = 16;

// Constant-time comparison of two kAuthTokenBytes tokens.
bool TokensEqual(const uint8_t* a, const uint8_t* b);
// Constant-time (in the secret's length) comparison of two secrets.
bool SecretsEqual(std::string_view a, std::string_view b);
// The secret in `path` (surrounding whitespace trimmed): created mode 0600
// with 32 random hex digits when missing. Errors (unreadable, empty, others
// may read it, over 4 KiB) in *why, and false.
bool LoadOrCreateSecret(const std::string& path, std::string* secret, std::string* why);

// True for a numeric IPv4 address in 127.0.0.0/8, "::1", an IPv4-mapped
// loopback ("::ffff:127.0.0.1") or "localhost". False for anything else,
// including the wildcard addresses 0.0.0.0 and "::".
bool IsLoopbackAddress(std::string_view address);

// The warnings to log at start for listeners bound beyond loopback: one line
// per listener whose address is not loopback and whose flag was left at its
// default (an address given explicitly is a deliberate choice: no warning).
std::vector<std::string> ExposureWarnings(std::string_view rpc_address, bool rpc_address_set,
                                          std::string_view metrics_host, bool metrics_host_set);

// Whether the key-revealing monitoring pages (/get_all_keys, /query_key) are
// served to a peer: always to loopback peers, to others only with
// --enable_key_listing.
bool KeyListingAllowed(bool enable_key_listing, std::string_view peer_address);

// Whether a pool with file mode `mode` may be formatted: refused (with the
// reason in *why) when others may read or write it, unless allowed.
bool PoolModeAcceptable(mode_t mode, bool allow_world_readable, std::string* why);

}  // namespace mcxl
