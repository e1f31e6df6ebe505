// What the files of the mooncake_cxl._core binding share (not installed).
//
// The binding is small shims over mcxl::Client, one file per concern
// (module.cc lists them). Every shim follows the same rules: Python buffers
// and objects are touched with the GIL held, the C++ work runs with the GIL
// released (but single-key reads of less than kReleaseGilFromBytes, which
// keep it: releasing and re-taking it cost a 4 KiB get a third of its
// instructions, and another thread waits a few µs at most), and ErrorCode becomes Mooncake's negative integers here and
// nowhere else. Signatures, defaults and return types are those of
// mooncake.store.MooncakeDistributedStore 0.3.13; setup() is completed by
// the Python façade (dict form, size strings).
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mooncake_cxl/client/client.h"

namespace mcxl::binding {

namespace py = pybind11;

constexpr int kNotReady = int(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
constexpr int kInvalid = int(ErrorCode::INVALID_PARAMS);
constexpr uint64_t kReleaseGilFromBytes = 64 << 10;

// A key argument as a view (put_binding.cc), without pybind11's string
// casters (a std::string copy; string_view registers the str with the
// call's keep-alive set: an unordered_set insert per call). The argument
// tuple holds `key` for the whole call; the UTF-8 form of a str is cached in
// the str itself. Other types as the std::string caster would take them,
// copied into *tmp; a type it refuses raises TypeError.
std::string_view KeyView(const py::handle& key, std::string* tmp);

// ---- ReplicateConfig (replicate_config.cc) ----
enum class SoftPinAction : int { PRESERVE = 0, ENABLE = 1, DISABLE = 2 };
enum class ObjectDataType : int {
  UNKNOWN = 0, KVCACHE, TENSOR, WEIGHT, SAMPLE, ACTIVATION, GRADIENT, OPTIMIZER_STATE, METADATA, GENERAL
};

struct ReplicateConfig {
  size_t replica_num = 1;  // accepted; a CXL pool holds one copy
  size_t nof_replica_num = 0;
  size_t dfs_replica_num = 0;
  SoftPinAction soft_pin_action = SoftPinAction::PRESERVE;
  std::optional<uint64_t> soft_pin_ttl_ms;
  bool with_hard_pin = false;
  std::vector<std::string> preferred_segments;
  std::vector<std::string> preferred_nof_segments;
  std::string preferred_segment;
  bool prefer_alloc_in_same_node = false;
  ObjectDataType data_type = ObjectDataType::UNKNOWN;
  std::optional<std::vector<std::string>> group_ids;
};

PutOptions ToPutOptions(const ReplicateConfig& c);
// True when `c` is valid for a call `op` that puts `nkeys` keys; else logs
// why (the reference refuses the same configurations, INVALID_PARAMS).
// has_segment: the client has a DRAM segment (prefer_alloc_in_same_node is then accepted).
bool ConfigOk(const ReplicateConfig& c, size_t nkeys, const char* op, bool has_segment = false);

// ---- the store (store_binding.cc) ----
// StoreCore: one client, set up and closed by the Python façade.
class Store {
 public:
  ~Store();
  int SetupCore(const std::string& local_hostname, const std::string& master_addr, const std::string& pool_path,
                uint64_t pool_size, int connect_timeout_ms, int rpc_timeout_ms, int put_wait_ms, bool use_rings,
                const std::string& tenant, const std::string& offload_path, bool enable_ssd_offload, bool strict_buffers,
                uint64_t dram_segment_size, py::object segment_te);
  int Close();
  int HealthCheck();
  void FlushLeases();  // the client's queued leases (a non-coherent pool) land at the master
  std::string GetHostname() const { return hostname_; }
  std::shared_ptr<Client> client() const { return client_; }
  // The client if set up and open; else logs why `op` is refused.
  std::shared_ptr<Client> Ready(const char* op) const;

 private:
  std::shared_ptr<Client> client_;
  std::string hostname_;
};

using StoreClass = py::class_<Store>;

// Each file's part of the module.
void DefineReplicateConfig(py::module_& m);
void DefineStoreCalls(StoreClass& store);                     // store_binding.cc
void DefinePutCalls(StoreClass& store);                       // put_binding.cc
void DefineZeroCopyCalls(py::module_& m, StoreClass& store);  // buffers.cc
void DefineAnnounce(py::module_& m, StoreClass& store);       // announce_binding.cc

}  // namespace mcxl::binding
