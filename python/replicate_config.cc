// ReplicateConfig and the enums of the reference's store module: accepted
// with the reference's fields and defaults, printed as the reference prints
// them, refused where the reference refuses them, and mapped onto the
// client's PutOptions (pins and eviction groups; a CXL pool holds one copy,
// so the replica counts have nothing to choose).
#include <pybind11/stl.h>

#include <sstream>

#include "mooncake_cxl/common/log.h"
#include "store_core.h"

namespace mcxl::binding {
namespace {

enum class ReplicaStatus : int { UNDEFINED = 0, INITIALIZED, PROCESSING, COMPLETE, REMOVED, FAILED };
const char* kDataTypeNames[] = {"UNKNOWN", "KVCACHE", "TENSOR", "WEIGHT", "SAMPLE", "ACTIVATION",
                                "GRADIENT", "OPTIMIZER_STATE", "METADATA", "GENERAL"};
const char* kSoftPinNames[] = {"PRESERVE", "ENABLE", "DISABLE"};

std::string Join(const std::vector<std::string>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s + "]";
}

// Same text as the reference's str(ReplicateConfig).
std::string ConfigString(const ReplicateConfig& c) {
  std::ostringstream os;
  os << "ReplicateConfig: { replica_num: " << c.replica_num << ", nof_replica_num: " << c.nof_replica_num
     << ", dfs_replica_num: " << c.dfs_replica_num
     << ", soft_pin_action: " << kSoftPinNames[int(c.soft_pin_action)] << ", soft_pin_ttl_ms: "
     << (c.soft_pin_ttl_ms ? std::to_string(*c.soft_pin_ttl_ms) : std::string("default"))
     << ", with_hard_pin: " << c.with_hard_pin << ", preferred_segments: " << Join(c.preferred_segments);
  if (!c.preferred_segment.empty()) os << ", preferred_segment (deprecated): " << c.preferred_segment;
  os << ", preferred_nof_segments: " << Join(c.preferred_nof_segments)
     << ", prefer_alloc_in_same_node: " << c.prefer_alloc_in_same_node
     << ", data_type: " << kDataTypeNames[int(c.data_type)];
  if (c.group_ids) os << ", group_ids: " << Join(*c.group_ids);
  os << " }";
  return os.str();
}

// Configurations the reference also rejects with INVALID_PARAMS, for a call
// that puts `nkeys` keys. (Too long a soft pin is the master's to refuse.)
const char* InvalidConfig(const ReplicateConfig& c, size_t nkeys, bool has_segment) {
  if (c.replica_num == 0) return "replica_num must be at least 1";
  if (c.soft_pin_ttl_ms && c.soft_pin_action != SoftPinAction::ENABLE)
    return "soft_pin_ttl_ms is set but soft_pin_action is not ENABLE";
  if (c.group_ids && c.group_ids->size() != nkeys)
    return "group_ids must hold one group per key of the call";
  if (c.nof_replica_num != 0) return "nof_replica_num: this store has no NVMe-oF tier";
  if (c.dfs_replica_num != 0) return "dfs_replica_num: this store has no DFS tier";
  // Without a DRAM segment there is no node-local place to prefer.
  if (c.prefer_alloc_in_same_node && !has_segment)
    return "prefer_alloc_in_same_node is not supported (as in Mooncake) without a DRAM segment";
  return nullptr;
}

}  // namespace

PutOptions ToPutOptions(const ReplicateConfig& c) {
  PutOptions o;
  if (c.with_hard_pin) o.flags |= kFlagHardPin;
  if (c.soft_pin_action == SoftPinAction::ENABLE) o.flags |= kFlagSoftPin;
  o.soft_pin_ttl_ms = c.soft_pin_ttl_ms.value_or(0);
  if (c.group_ids) o.group_ids = *c.group_ids;
  // Assigned only when named: the default put copies no string.
  if (!c.preferred_segment.empty()) o.preferred_segment = c.preferred_segment;
  else if (!c.preferred_segments.empty()) o.preferred_segment = c.preferred_segments[0];
  o.same_node = c.prefer_alloc_in_same_node;
  return o;
}

bool ConfigOk(const ReplicateConfig& c, size_t nkeys, const char* op, bool has_segment) {
  const char* why = InvalidConfig(c, nkeys, has_segment);
  if (why == nullptr) return true;
  MCXL_LOG(kWarn, "store", "%s: invalid ReplicateConfig: %s", op, why);
  return false;
}

void DefineReplicateConfig(py::module_& m) {
  // For the remote store (mooncake_cxl/remote/store.py): the same checks and
  // options as a local put. None (logged) when invalid, else (flags, ttl, groups).
  m.def("_put_config", [](const ReplicateConfig& c, size_t nkeys, const std::string& op) -> py::object {
    if (!ConfigOk(c, nkeys, op.c_str())) return py::none();
    PutOptions o = ToPutOptions(c);
    return py::make_tuple(o.flags, o.soft_pin_ttl_ms, o.group_ids);
  });
  py::enum_<SoftPinAction>(m, "SoftPinAction")
      .value("PRESERVE", SoftPinAction::PRESERVE)
      .value("ENABLE", SoftPinAction::ENABLE)
      .value("DISABLE", SoftPinAction::DISABLE);
  py::enum_<ReplicaStatus>(m, "ReplicaStatus")
      .value("UNDEFINED", ReplicaStatus::UNDEFINED)
      .value("INITIALIZED", ReplicaStatus::INITIALIZED)
      .value("PROCESSING", ReplicaStatus::PROCESSING)
      .value("COMPLETE", ReplicaStatus::COMPLETE)
      .value("REMOVED", ReplicaStatus::REMOVED)
      .value("FAILED", ReplicaStatus::FAILED);
  py::enum_<ObjectDataType> dt(m, "ObjectDataType");
  for (int i = 0; i < 10; ++i) dt.value(kDataTypeNames[i], ObjectDataType(i));

  py::class_<ReplicateConfig>(m, "ReplicateConfig")
      .def(py::init<>())
      .def_readwrite("replica_num", &ReplicateConfig::replica_num)
      .def_readwrite("nof_replica_num", &ReplicateConfig::nof_replica_num)
      .def_readwrite("dfs_replica_num", &ReplicateConfig::dfs_replica_num)
      .def_readwrite("soft_pin_action", &ReplicateConfig::soft_pin_action)
      .def_readwrite("soft_pin_ttl_ms", &ReplicateConfig::soft_pin_ttl_ms)
      .def_readwrite("with_hard_pin", &ReplicateConfig::with_hard_pin)
      .def_readwrite("preferred_segments", &ReplicateConfig::preferred_segments)
      .def_readwrite("preferred_nof_segments", &ReplicateConfig::preferred_nof_segments)
      .def_readwrite("preferred_segment", &ReplicateConfig::preferred_segment)
      .def_readwrite("prefer_alloc_in_same_node", &ReplicateConfig::prefer_alloc_in_same_node)
      .def_readwrite("data_type", &ReplicateConfig::data_type)
      .def_readwrite("group_ids", &ReplicateConfig::group_ids)
      // Mooncake 0.3.12's name for soft_pin_action=ENABLE.
      .def_property(
          "with_soft_pin", [](const ReplicateConfig& c) { return c.soft_pin_action == SoftPinAction::ENABLE; },
          [](ReplicateConfig& c, bool v) { c.soft_pin_action = v ? SoftPinAction::ENABLE : SoftPinAction::PRESERVE; })
      .def("__str__", &ConfigString);
}

}  // namespace mcxl::binding
