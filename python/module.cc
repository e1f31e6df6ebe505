// mooncake_cxl._core: the pybind11 binding of the C++ client, one file per
// concern (store_core.h states the rules every shim follows):
//   replicate_config.cc  ReplicateConfig and the enums
//   store_binding.cc     StoreCore: setup/close, get, is_exist, removes, holds
//   put_binding.cc       puts of Python buffers
//   buffers.cc           zero-copy calls and BufferHandle
//   announce_binding.cc  announcement channels
// and here the module itself and _layout. Benchmark helpers are not part of
// it (bench_core.cc: mooncake_cxl._bench_core).
#include <pybind11/pybind11.h>

#include <cstddef>

#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/control/message.h"
#include "mooncake_cxl/pool/layout.h"
#include "store_core.h"

namespace py = pybind11;

namespace {

// Offsets of the pool's shared structures, for tests that corrupt them on
// purpose (the ring robustness and pool-corruption tests) or speak the wire
// protocol raw.
py::dict Layout() {
  using namespace mcxl;
  py::dict d;
  d["superblock.ring_region_offset"] = offsetof(Superblock, ring_region_offset);
  d["superblock.ring_bytes"] = offsetof(Superblock, ring_bytes);
  d["superblock.client_slot_count"] = offsetof(Superblock, client_slot_count);
  d["superblock.master_incarnation"] = offsetof(Superblock, master_incarnation);
  d["ring_header_size"] = sizeof(RingHeader);
  d["protocol_version"] = kProtocolVersion;
  d["layout_version"] = kLayoutVersion;
  d["superblock.announce_offset"] = offsetof(Superblock, announce_offset);
  d["superblock.announce_slots"] = offsetof(Superblock, announce_slots);
  d["superblock.pool_size"] = offsetof(Superblock, pool_size);
  d["superblock.index_offset"] = offsetof(Superblock, index_offset);
  d["superblock.index_capacity"] = offsetof(Superblock, index_capacity);
  d["superblock.data_offset"] = offsetof(Superblock, data_offset);
  d["superblock.data_size"] = offsetof(Superblock, data_size);
  d["entry.state_gen"] = offsetof(IndexEntry, state_gen);
  d["entry.object_offset"] = offsetof(IndexEntry, object_offset);
  d["entry.value_size"] = offsetof(IndexEntry, value_size);
  d["entry.version"] = offsetof(IndexEntry, version);
  d["entry.flags"] = offsetof(IndexEntry, flags);
  d["entry_size"] = sizeof(IndexEntry);
  d["header.key_len"] = offsetof(ObjectHeader, key_len);
  d["header_size"] = sizeof(ObjectHeader);
  return d;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  using namespace mcxl::binding;
  m.doc() = "mooncake_cxl core: a KV-cache store in a CXL memory pool";
  mcxl::InitLogLevelFromEnv(mcxl::LogLevel::kWarn);
  m.def("_layout", &Layout);
  // Before StoreCore: its calls take a ReplicateConfig default.
  DefineReplicateConfig(m);
  StoreClass store(m, "StoreCore");
  DefineStoreCalls(store);
  DefinePutCalls(store);
  DefineZeroCopyCalls(m, store);
  DefineAnnounce(m, store);
}
