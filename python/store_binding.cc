// StoreCore: a store's life (setup, close, health), its one-sided reads into
// new Python objects (get, is_exist, get_size, the replica description) and
// the calls that go to the master (removes) or only raise leases (holds).
// The puts are in put_binding.cc, the zero-copy calls in buffers.cc.
#include <pybind11/stl.h>

#include <cstdlib>
#include <cstring>

#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/pool/layout.h"
#include "store_core.h"

namespace mcxl::binding {

namespace {
// The client's segment calls into the Python engine (segment_te.py): each
// takes the GIL (the client calls them from released-GIL sections); the
// engine is dropped under the GIL too, whichever thread drops the last copy.
void SetSegmentEngine(const py::object& engine, ClientOptions* o) {
  std::shared_ptr<py::object> te(new py::object(engine), [](py::object* p) {
    py::gil_scoped_acquire gil;
    delete p;
  });
  o->serve_segment = [te](char* base, uint64_t size) -> std::string {
    py::gil_scoped_acquire gil;
    try {
      return te->attr("serve")(uintptr_t(base), size).cast<std::string>();
    } catch (const std::exception& e) {
      MCXL_LOG(kError, "store", "DRAM segment not served over the Transfer Engine: %s", e.what());
      return "";
    }
  };
  // One TE read from the segment at `session` into `dst`.
  o->read_peer_segment = [te](const std::string& session, uint64_t offset, char* dst, uint64_t n) -> bool {
    py::gil_scoped_acquire gil;
    try {
      return te->attr("read")(session, offset, uintptr_t(dst), n).cast<bool>();
    } catch (const std::exception& e) {
      MCXL_LOG(kError, "store", "Transfer Engine read of the segment at %s failed: %s", session.c_str(), e.what());
      return false;
    }
  };
}
}  // namespace

Store::~Store() {
  if (client_) {
    py::gil_scoped_release nogil;
    (void)client_->Close();
  }
}

int Store::SetupCore(const std::string& local_hostname, const std::string& master_addr, const std::string& pool_path,
                     uint64_t pool_size, int connect_timeout_ms, int rpc_timeout_ms, int put_wait_ms, bool use_rings,
                     const std::string& tenant, const std::string& offload_path, bool enable_ssd_offload,
                     bool strict_buffers, uint64_t dram_segment_size, py::object segment_te) {
  if (client_ && !client_->closed()) {
    MCXL_LOG(kWarn, "store", "setup() called on a store that is already set up; close() it first");
    return kNotReady;
  }
  ClientOptions o;
  o.local_hostname = local_hostname;
  o.master_addr = master_addr;
  o.pool_path_override = pool_path;
  o.pool_size_override = pool_size;
  o.connect_timeout_ms = connect_timeout_ms;
  o.rpc_timeout_ms = rpc_timeout_ms;
  o.put_wait_ms = put_wait_ms;
  o.use_rings = use_rings;
  const char* pf = getenv("MC_CXL_PREFAULT");  // as MC_CXL_RPC etc.: an environment switch
  o.prefault_pool = pf == nullptr || pf[0] == '\0' || strcmp(pf, "0") != 0;  // on unless "0"
  o.tenant = tenant;
  // SSD tier: this host's path of the tier directory (the reference's
  // MOONCAKE_OFFLOAD_FILE_STORAGE_PATH / ssd_offload_path), and whether to
  // read records directly (MC_CXL_TIER_DIRECT_READ=0: the master stages them).
  o.offload_path_override = offload_path;
  o.enable_ssd_offload = enable_ssd_offload;
  o.strict_buffers = strict_buffers;
  o.dram_segment_size = dram_segment_size;  // 0 unless MC_CXL_DRAM_SEGMENT=1 (store.py)
  if (!segment_te.is_none()) SetSegmentEngine(segment_te, &o);
  const char* td = getenv("MC_CXL_TIER_DIRECT_READ");
  o.tier_direct_read = td == nullptr || td[0] == '\0' || strcmp(td, "0") != 0;
  std::optional<Result<std::shared_ptr<Client>>> r;
  {
    py::gil_scoped_release nogil;
    r.emplace(Client::Connect(o));
  }
  if (!*r) return ToInt(r->error());
  client_ = r->value();
  hostname_ = local_hostname;
  return 0;
}

int Store::Close() {
  std::shared_ptr<Client> c = std::move(client_);
  if (c) {
    py::gil_scoped_release nogil;
    (void)c->Close();
  }
  return 0;
}

void Store::FlushLeases() {
  auto c = client_;
  if (!c || c->closed()) return;
  py::gil_scoped_release nogil;
  c->FlushLeases();
}

int Store::HealthCheck() {
  auto c = client_;
  if (!c) return 1;
  py::gil_scoped_release nogil;
  return c->HealthCheck();
}

std::shared_ptr<Client> Store::Ready(const char* op) const {
  if (client_ && !client_->closed()) return client_;
  MCXL_LOG(kWarn, "store", "%s() called before setup() or after close(): returns %d", op, kNotReady);
  return nullptr;
}

namespace {

// get's destination: a new bytes object of the value's size, allocated with
// the GIL (held when the read starts: the index probe is shorter than a GIL
// hand-over); the GIL is released for a copy of kReleaseGilFromBytes or
// more, and taken again only to allocate anew when a retry finds a value of
// another size.
class BytesSink final : public ReadSink {
 public:
  ~BytesSink() {
    TakeGil();
    Py_XDECREF(bytes_);
  }
  Status Place(uint64_t size, ReadDest* dest) override {
    if (bytes_ == nullptr || uint64_t(PyBytes_GET_SIZE(bytes_)) != size) {
      TakeGil();
      Py_XDECREF(bytes_);
      bytes_ = PyBytes_FromStringAndSize(nullptr, Py_ssize_t(size));
      if (bytes_ == nullptr) return ErrorCode::INTERNAL_ERROR;  // MemoryError, raised by Get
    }
    if (saved_ == nullptr && size >= kReleaseGilFromBytes) saved_ = PyEval_SaveThread();
    slice_ = {PyBytes_AS_STRING(bytes_), size};
    dest->slices = &slice_;
    dest->nslices = 1;
    return ErrorCode::OK;
  }
  void TakeGil() {
    if (saved_ != nullptr) PyEval_RestoreThread(saved_);
    saved_ = nullptr;
  }
  // The value read (the GIL held).
  py::bytes Release() {
    PyObject* b = bytes_;
    bytes_ = nullptr;
    return py::reinterpret_steal<py::bytes>(b);
  }

 private:
  PyObject* bytes_ = nullptr;
  PyThreadState* saved_ = nullptr;  // set while the GIL is released
  MutSlice slice_{};
};

py::bytes GetKey(Store& s, std::string_view key) {
  auto c = s.Ready("get");
  if (!c) return py::bytes("");
  BytesSink sink;
  auto r = c->Get(key, sink);
  sink.TakeGil();
  if (!r) {
    if (PyErr_Occurred()) throw py::error_already_set();
    return py::bytes("");
  }
  return sink.Release();
}

py::bytes Get(Store& s, const py::handle& key_obj) {
  std::string tmp;
  return GetKey(s, KeyView(key_obj, &tmp));
}

std::vector<py::bytes> GetBatch(Store& s, const std::vector<std::string>& keys) {
  std::vector<py::bytes> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(GetKey(s, k));
  return out;
}

// With the GIL held: a probe of the index, shorter than a GIL hand-over.
int IsExist(Store& s, const py::handle& key_obj) {
  auto c = s.Ready("is_exist");
  if (!c) return kNotReady;
  std::string tmp;
  std::string_view key = KeyView(key_obj, &tmp);
  return c->IsExist(key);
}

std::vector<int> BatchIsExist(Store& s, const std::vector<std::string>& keys) {
  auto c = s.Ready("batch_is_exist");
  if (!c) return std::vector<int>(keys.size(), kNotReady);
  std::vector<std::string_view> views(keys.begin(), keys.end());
  py::gil_scoped_release nogil;
  return c->BatchIsExist(views);
}

int64_t GetSize(Store& s, const std::string& key) {
  auto c = s.Ready("get_size");
  if (!c) return kNotReady;
  py::gil_scoped_release nogil;
  auto r = c->GetSize(key);
  return r ? int64_t(*r) : int64_t(ToInt(r.error()));
}

// Where `key`'s replica lives, for get_replica_desc: {offset (the object's
// offset in the pool, as /query_key reports it), size, writer (the
// local_hostname in the writer's client slot, "" when unknown)}, or a
// negative ErrorCode. A read of the index: no master round trip, no lease.
py::object ReplicaInfo(Store& s, const std::string& key) {
  auto c = s.Ready("get_replica_desc");
  if (!c) return py::int_(kNotReady);
  std::optional<Result<EntrySnapshot>> snap;
  std::string writer, segment_owner, peer_session;
  {
    py::gil_scoped_release nogil;
    snap.emplace(c->Locate(key));
    if (*snap) {
      // owner_slot and the superblock are pool memory any client can write:
      // bound the slot by the table and the mapping. The host name may be
      // torn while its slot is re-attached; it is descriptive only.
      const auto& pool = c->pool();
      const Superblock* sb = pool->superblock();
      auto host_of = [&](uint64_t slot) {
        if (slot >= sb->client_slot_count || sb->client_table_offset > pool->size() ||
            slot >= (pool->size() - sb->client_table_offset) / sizeof(ClientSlot))
          return std::string();
        const char* host = pool->client_slot(uint32_t(slot))->host;
        return std::string(host, strnlen(host, sizeof(ClientSlot::host)));
      };
      writer = host_of(snap->value().owner_slot);
      if (snap->value().state() == EntryState::kInSegment) {
        uint32_t holder = 0;
        peer_session = c->PeerSegmentSession(snap->value(), key, &holder);
        segment_owner = host_of(holder);  // the segment's client, not always the putter
      }
    }
  }
  if (!*snap) return py::int_(ToInt(snap->error()));
  py::dict d;
  // kOnDisk: the value is a record in the SSD tier (the stub says where);
  // kInSegment: in a client's DRAM segment, read by others over the
  // Transfer Engine from its session.
  bool on_disk = snap->value().state() == EntryState::kOnDisk;
  d["tier"] = on_disk ? "disk" : "memory";
  if (on_disk) d["disk_root"] = c->tier_root();
  if (snap->value().state() == EntryState::kInSegment) {
    d["segment_name"] = segment_owner;
    d["read_by"] = peer_session.empty() ? "segment" : "transfer_engine";
    if (!peer_session.empty()) d["te_session"] = peer_session;
  }
  d["offset"] = snap->value().object_offset;
  d["size"] = snap->value().value_size;
  d["writer"] = writer;
  return d;
}

int Remove(Store& s, const std::string& key, bool force) {
  auto c = s.Ready("remove");
  if (!c) return kNotReady;
  py::gil_scoped_release nogil;
  return ToInt(c->Remove(key, force));
}

std::vector<int> BatchRemove(Store& s, const std::vector<std::string>& keys, bool force) {
  auto c = s.Ready("batch_remove");
  if (!c) return std::vector<int>(keys.size(), kNotReady);
  std::vector<std::string_view> kv(keys.begin(), keys.end());
  py::gil_scoped_release nogil;
  auto r = c->BatchRemove(kv, force);
  return std::vector<int>(r.begin(), r.end());
}

int64_t RemoveByRegex(Store& s, const std::string& pattern, bool force) {
  auto c = s.Ready("remove_by_regex");
  if (!c) return kNotReady;
  py::gil_scoped_release nogil;
  auto r = c->RemoveByRegex(pattern, force);
  return r ? int64_t(*r) : int64_t(ToInt(r.error()));
}

int64_t RemoveAll(Store& s, bool force) {
  auto c = s.Ready("remove_all");
  if (!c) return kNotReady;
  py::gil_scoped_release nogil;
  auto r = c->RemoveAll(force);
  return r ? int64_t(*r) : int64_t(ToInt(r.error()));
}

// Holds (client.h HoldLeases / ReleaseLeases): per key 0 or an error code.
std::vector<int> Hold(Store& s, const std::vector<std::string>& keys, uint64_t until_ns, bool release) {
  auto c = s.Ready(release ? "release_hold" : "hold");
  if (!c) return std::vector<int>(keys.size(), kNotReady);
  std::vector<std::string_view> views(keys.begin(), keys.end());
  py::gil_scoped_release nogil;
  auto rc = release ? c->ReleaseLeases(views) : c->HoldLeases(views, until_ns);
  std::vector<int> out(rc.size());
  for (size_t i = 0; i < rc.size(); ++i) out[i] = ToInt(rc[i]);
  return out;
}

}  // namespace

void DefineStoreCalls(StoreClass& store) {
  store.def(py::init<>())
      .def("_setup_core", &Store::SetupCore, py::arg("local_hostname"), py::arg("master_server_addr"),
           py::arg("pool_path"), py::arg("pool_size"), py::arg("connect_timeout_ms"), py::arg("rpc_timeout_ms"),
           py::arg("put_wait_ms"), py::arg("use_rings"), py::arg("tenant_id") = "default",
           py::arg("offload_path") = "", py::arg("enable_ssd_offload") = false,
           py::arg("strict_buffers") = false, py::arg("dram_segment_size") = 0,
           py::arg("segment_te") = py::none())
      .def("close", &Store::Close)
      .def("health_check", &Store::HealthCheck)
      .def("_flush_leases", &Store::FlushLeases)  // tests: queued leases land at the master
      .def("get_hostname", &Store::GetHostname)
      .def("get", &Get, py::arg("key"))
      .def("get_batch", &GetBatch, py::arg("keys"))
      .def("is_exist", &IsExist, py::arg("key"))
      .def("batch_is_exist", &BatchIsExist, py::arg("keys"))
      .def("get_size", &GetSize, py::arg("key"))
      .def("remove", &Remove, py::arg("key"), py::arg("force") = false)
      .def("batch_remove", &BatchRemove, py::arg("keys"), py::arg("force") = false)
      .def("remove_by_regex", &RemoveByRegex, py::arg("regex_pattern"), py::arg("force") = false)
      .def("remove_all", &RemoveAll, py::arg("force") = false)
      .def("_replica_info", &ReplicaInfo, py::arg("key"))
      .def("_offload_read_count", [](Store& s) -> int64_t {
             auto c = s.client();
             return c ? int64_t(c->offload_read_count()) : 0; })
      .def("_populated", [](Store& s) {
             auto c = s.client();
             return c && c->populated(); })
      .def("_hold", [](Store& s, const std::vector<std::string>& keys, uint64_t until_ns) {
             return Hold(s, keys, until_ns, false); }, py::arg("keys"), py::arg("until_ns"))
      .def("_release_hold", [](Store& s, const std::vector<std::string>& keys) {
             return Hold(s, keys, 0, true); }, py::arg("keys"));
}

}  // namespace mcxl::binding
