// mooncake_cxl._core: the pybind11 binding of the C++ client.
//
// One flat file of small shims in the manner of RE2's binding: Python
// buffers are acquired with the GIL held, the C++ work runs with the GIL
// released, and ErrorCode becomes Mooncake's negative integers here and
// nowhere else. Signatures, defaults and return types follow
// mooncake.store.MooncakeDistributedStore 0.3.13 (see MOONCAKE_API.md);
// setup() is completed by the Python façade (dict form, size strings).
#include <pybind11/pybind11.h>
#include <sys/mman.h>
#include <unistd.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "mooncake_cxl/control/announce.h"
#include "mooncake_cxl/client/client.h"
#include "mooncake_cxl/pool/layout.h"
#include "mooncake_cxl/common/log.h"

namespace py = pybind11;
using namespace mcxl;

namespace {

enum class SoftPinAction : int { PRESERVE = 0, ENABLE = 1, DISABLE = 2 };
enum class ReplicaStatus : int { UNDEFINED = 0, INITIALIZED, PROCESSING, COMPLETE, REMOVED, FAILED };
enum class ObjectDataType : int {
  UNKNOWN = 0, KVCACHE, TENSOR, WEIGHT, SAMPLE, ACTIVATION, GRADIENT, OPTIMIZER_STATE, METADATA, GENERAL
};
const char* kDataTypeNames[] = {"UNKNOWN", "KVCACHE", "TENSOR", "WEIGHT", "SAMPLE", "ACTIVATION",
                                "GRADIENT", "OPTIMIZER_STATE", "METADATA", "GENERAL"};
const char* kSoftPinNames[] = {"PRESERVE", "ENABLE", "DISABLE"};

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

PutOptions ToPutOptions(const ReplicateConfig& c) {
  PutOptions o;
  if (c.with_hard_pin) o.flags |= kFlagHardPin;
  if (c.soft_pin_action == SoftPinAction::ENABLE) o.flags |= kFlagSoftPin;
  o.soft_pin_ttl_ms = c.soft_pin_ttl_ms.value_or(0);
  if (c.group_ids) o.group_ids = *c.group_ids;
  return o;
}

// Configurations the reference also rejects with INVALID_PARAMS, for a call
// that puts `nkeys` keys. (Too long a soft pin is the master's to refuse.)
const char* InvalidConfig(const ReplicateConfig& c, size_t nkeys) {
  if (c.replica_num == 0) return "replica_num must be at least 1";
  if (c.soft_pin_ttl_ms && c.soft_pin_action != SoftPinAction::ENABLE)
    return "soft_pin_ttl_ms is set but soft_pin_action is not ENABLE";
  if (c.group_ids && c.group_ids->size() != nkeys)
    return "group_ids must hold one group per key of the call";
  if (c.nof_replica_num != 0) return "nof_replica_num: this store has no NVMe-oF tier";
  if (c.dfs_replica_num != 0) return "dfs_replica_num: this store has no DFS tier";
  if (c.prefer_alloc_in_same_node) return "prefer_alloc_in_same_node is not supported (as in Mooncake)";
  return nullptr;
}

constexpr int kNotReady = int(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);

// A Python buffer held for the duration of a put. Non-contiguous arrays are
// copied to C order first (as the reference does); everything else is used
// in place.
class HeldBuffer {
 public:
  explicit HeldBuffer(const py::handle& obj) {
    if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_C_CONTIGUOUS) == 0) {
      held_ = true;
      return;
    }
    PyErr_Clear();
    if (!PyObject_CheckBuffer(obj.ptr()))
      throw py::type_error(std::string("a bytes-like object is required, not '") +
                           Py_TYPE(obj.ptr())->tp_name + "'");
    copy_ = py::bytes(py::memoryview(py::reinterpret_borrow<py::object>(obj)).attr("tobytes")());
    char* p = nullptr;
    Py_ssize_t n = 0;
    PyBytes_AsStringAndSize(copy_.ptr(), &p, &n);
    view_.buf = p;
    view_.len = n;
  }
  ~HeldBuffer() {
    if (held_) PyBuffer_Release(&view_);
  }
  HeldBuffer(const HeldBuffer&) = delete;
  ConstSlice slice() const { return {view_.buf, uint64_t(view_.len)}; }

 private:
  Py_buffer view_{};
  bool held_ = false;
  py::object copy_;
};

// A read-only view straight into the pool. Holds a pin (see
// Client::PinValue) until it is garbage-collected, and the client (and so the
// pool mapping) alive. While it lives its bytes never change: the pin
// survives the client's close(), a reclaim of its slot while the process is
// alive (e.g. stopped past --client_ttl), and a master restart. Every access
// (buffer protocol, ptr()) checks that the pin is still held and raises
// BufferError if the master dropped it (only a retired client of another host
// past --put_start_release_timeout_sec): it never shows other bytes. A
// memoryview or array taken from the handle is valid while the handle is.
class BufferHandle {
 public:
  BufferHandle(std::shared_ptr<Client> c, PinnedView v) : client_(std::move(c)), view_(v) {}
  ~BufferHandle() { client_->Unpin(view_); }
  BufferHandle(const BufferHandle&) = delete;
  uintptr_t ptr() const { return reinterpret_cast<uintptr_t>(Checked()); }
  uint64_t size() const { return view_.size; }
  const char* data() const { return Checked(); }

 private:
  const char* Checked() const {
    if (!client_->PinHeld(view_))
      throw py::buffer_error("BufferHandle: the master dropped this view's pin (its client was retired "
                             "longer than --put_start_release_timeout_sec); the bytes are no longer valid");
    return view_.data;
  }
  std::shared_ptr<Client> client_;
  PinnedView view_;
};

constexpr int kInvalid = int(ErrorCode::INVALID_PARAMS);

// The zero-copy batch calls take one buffer list and one size list per key.
bool OneListPerKey(const char* op, const std::vector<std::string>& keys,
                   const std::vector<std::vector<uint64_t>>& ptrs, const std::vector<std::vector<uint64_t>>& sizes) {
  if (ptrs.size() == keys.size() && sizes.size() == keys.size()) return true;
  MCXL_LOG(kWarn, "store", "%s: %zu keys, %zu buffer lists, %zu size lists: one of each per key", op,
           keys.size(), ptrs.size(), sizes.size());
  return false;
}

// A put's key as a view, without pybind11's string_view caster (which
// registers the str with the call's keep-alive set: an unordered_set insert
// per call). The argument tuple holds `key` for the whole call; the UTF-8
// form of a str is cached in the str itself. Other types as the std::string
// caster would take them, copied into *tmp.
std::string_view KeyView(const py::handle& key, std::string* tmp) {
  if (PyUnicode_Check(key.ptr())) {
    Py_ssize_t n = 0;
    const char* p = PyUnicode_AsUTF8AndSize(key.ptr(), &n);
    if (p == nullptr) {  // not encodable (a lone surrogate): refused as the std::string caster does
      PyErr_Clear();
      throw py::type_error("key must be a str encodable as UTF-8, or bytes");
    }
    return std::string_view(p, size_t(n));
  }
  if (PyBytes_Check(key.ptr())) return std::string_view(PyBytes_AS_STRING(key.ptr()), size_t(PyBytes_GET_SIZE(key.ptr())));
  py::detail::make_caster<std::string> c;
  if (!c.load(key, true))
    throw py::type_error(std::string("key must be str or bytes, not '") + Py_TYPE(key.ptr())->tp_name + "'");
  *tmp = std::move(static_cast<std::string&>(c));
  return *tmp;
}

// get's destination: a new bytes object of the value's size, allocated with
// the GIL (held when the read starts: the index probe is shorter than a GIL
// hand-over); the GIL is released for the copy, and taken again only to
// allocate anew when a retry finds a value of another size.
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
    if (saved_ == nullptr) saved_ = PyEval_SaveThread();
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

class Store {
 public:
  ~Store() {
    if (client_) {
      py::gil_scoped_release nogil;
      (void)client_->Close();
    }
  }

  int SetupCore(const std::string& local_hostname, const std::string& master_addr,
                const std::string& pool_path, uint64_t pool_size, int connect_timeout_ms,
                int rpc_timeout_ms, int put_wait_ms, bool use_rings, const std::string& tenant,
                const std::string& offload_path, bool enable_ssd_offload) {
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
    o.prefault_pool = pf != nullptr && pf[0] != '\0' && strcmp(pf, "0") != 0;
    o.tenant = tenant;
    // SSD tier: this host's path of the tier directory (the reference's
    // MOONCAKE_OFFLOAD_FILE_STORAGE_PATH / ssd_offload_path), and whether to
    // read records directly (MC_CXL_TIER_DIRECT_READ=0: the master stages them).
    o.offload_path_override = offload_path;
    o.enable_ssd_offload = enable_ssd_offload;
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

  int Close() {
    std::shared_ptr<Client> c = std::move(client_);
    if (c) {
      py::gil_scoped_release nogil;
      (void)c->Close();
    }
    return 0;
  }

  int HealthCheck() {
    auto c = client_;
    if (!c) return 1;
    py::gil_scoped_release nogil;
    return c->HealthCheck();
  }

  std::string GetHostname() const { return hostname_; }
  std::shared_ptr<Client> client() const { return client_; }

  // ---- puts ----
  std::vector<int> PutMany(const std::vector<std::string>& keys, const std::vector<std::vector<py::handle>>& values,
                           const ReplicateConfig& config, bool upsert, const char* op) {
    auto c = Ready(op);
    if (!c) return std::vector<int>(keys.size(), kNotReady);
    if (const char* why = InvalidConfig(config, keys.size())) {
      MCXL_LOG(kWarn, "store", "%s: invalid ReplicateConfig: %s", op, why);
      return std::vector<int>(keys.size(), int(ErrorCode::INVALID_PARAMS));
    }
    std::vector<std::unique_ptr<HeldBuffer>> held;
    std::vector<mcxl::PutParts> parts(values.size());
    for (size_t i = 0; i < values.size(); ++i)
      for (const auto& v : values[i]) {
        held.push_back(std::make_unique<HeldBuffer>(v));
        parts[i].push_back(held.back()->slice());
      }
    std::vector<std::string_view> kv(keys.begin(), keys.end());
    PutOptions opts = ToPutOptions(config);
    std::vector<ErrorCode> r;
    {
      py::gil_scoped_release nogil;
      r = c->Put(kv, parts, opts, upsert);
    }
    std::vector<int> out(r.size());
    for (size_t i = 0; i < r.size(); ++i) out[i] = ToInt(r[i]);
    return out;
  }

  int Put(std::string_view key, py::buffer value, const ReplicateConfig& config, bool upsert) {
    // PutMany for one key and one buffer, without its per-call vectors
    // (Client::PutOne; the key is a view of the caller's str, alive for the call).
    const char* op = upsert ? "upsert" : "put";
    auto c = Ready(op);
    if (!c) return kNotReady;
    if (const char* why = InvalidConfig(config, 1)) {
      MCXL_LOG(kWarn, "store", "%s: invalid ReplicateConfig: %s", op, why);
      return int(ErrorCode::INVALID_PARAMS);
    }
    HeldBuffer held(value);
    ConstSlice part = held.slice();
    PutOptions opts = ToPutOptions(config);
    py::gil_scoped_release nogil;
    return ToInt(c->PutOne(key, &part, 1, opts, upsert));
  }

  int PutJoined(const std::string& key, py::args parts, const ReplicateConfig& config, bool upsert) {
    std::vector<py::handle> v(parts.begin(), parts.end());
    return PutMany({key}, {v}, config, upsert, upsert ? "upsert_parts" : "put_parts")[0];
  }

  int PutBatch(const std::vector<std::string>& keys, const std::vector<py::buffer>& values,
               const ReplicateConfig& config, bool upsert) {
    if (keys.size() != values.size()) {
      MCXL_LOG(kWarn, "store", "put_batch: %zu keys but %zu values", keys.size(), values.size());
      return int(ErrorCode::INVALID_PARAMS);
    }
    // An empty value stores nothing of the batch, as in the reference (an
    // empty key fails alone: the others are stored, also as in the reference).
    for (size_t i = 0; i < keys.size(); ++i) {
      py::buffer_info info = values[i].request();
      if (info.size * info.itemsize == 0) {
        MCXL_LOG(kWarn, "store", "%s: empty value at position %zu; nothing stored",
                 upsert ? "upsert_batch" : "put_batch", i);
        return int(ErrorCode::INVALID_PARAMS);
      }
    }
    std::vector<std::vector<py::handle>> v;
    for (const auto& b : values) v.push_back({b});
    for (int r : PutMany(keys, v, config, upsert, upsert ? "upsert_batch" : "put_batch"))
      if (r != 0) return r;
    return 0;
  }

  // ---- zero-copy ----
  int RegisterBuffer(uintptr_t ptr, uint64_t size) {
    auto c = Ready("register_buffer");
    if (!c) return kNotReady;
    py::gil_scoped_release nogil;
    return ToInt(c->RegisterBuffer(ptr, size).error());
  }

  int UnregisterBuffer(uintptr_t ptr) {
    auto c = Ready("unregister_buffer");
    if (!c) return kNotReady;
    return ToInt(c->UnregisterBuffer(ptr).error());
  }

  // Puts each key's value gathered from caller memory: one master round trip
  // for the batch, one copy per byte.
  std::vector<int> PutFromRanges(const std::vector<std::string>& keys,
                                 const std::vector<std::vector<uintptr_t>>& ptrs,
                                 const std::vector<std::vector<uint64_t>>& sizes, const ReplicateConfig& config,
                                 bool upsert, const char* op) {
    auto c = Ready(op);
    if (!c) return std::vector<int>(keys.size(), kNotReady);
    if (!OneListPerKey(op, keys, ptrs, sizes)) return std::vector<int>(keys.size(), kInvalid);
    if (const char* why = InvalidConfig(config, keys.size())) {
      MCXL_LOG(kWarn, "store", "%s: invalid ReplicateConfig: %s", op, why);
      return std::vector<int>(keys.size(), kInvalid);
    }
    PutOptions opts = ToPutOptions(config);
    py::gil_scoped_release nogil;
    std::vector<int> out(keys.size(), 0);
    std::vector<std::string_view> send_keys;
    std::vector<mcxl::PutParts> send_parts;
    std::vector<size_t> sent;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (ptrs[i].size() != sizes[i].size()) {
        MCXL_LOG(kWarn, "store", "%s: key %zu has %zu buffers but %zu sizes", op, i, ptrs[i].size(), sizes[i].size());
        out[i] = kInvalid;
        continue;
      }
      mcxl::PutParts parts;
      for (size_t j = 0; j < ptrs[i].size() && out[i] == 0; ++j) {
        out[i] = ToInt(c->CheckRange(ptrs[i][j], sizes[i][j], op).error());
        parts.push_back({reinterpret_cast<const void*>(ptrs[i][j]), sizes[i][j]});
      }
      if (out[i] != 0) continue;
      send_keys.emplace_back(keys[i]);
      send_parts.push_back(std::move(parts));
      sent.push_back(i);
    }
    if (!sent.empty()) {
      auto r = c->Put(send_keys, send_parts, opts, upsert);
      for (size_t j = 0; j < sent.size(); ++j) out[sent[j]] = ToInt(r[j]);
    }
    return out;
  }

  // Reads each key's value scattered into caller memory: bytes read or an error.
  std::vector<int64_t> GetIntoRanges(const std::vector<std::string>& keys,
                                     const std::vector<std::vector<uintptr_t>>& ptrs,
                                     const std::vector<std::vector<uint64_t>>& sizes, const char* op) {
    auto c = Ready(op);
    if (!c) return std::vector<int64_t>(keys.size(), kNotReady);
    if (!OneListPerKey(op, keys, ptrs, sizes)) return std::vector<int64_t>(keys.size(), kInvalid);
    py::gil_scoped_release nogil;
    return GetIntoFlat(
        *c, keys, [&](size_t i) { return ptrs[i].size() == sizes[i].size() ? ptrs[i].size() : SIZE_MAX; },
        [&](size_t i, size_t j) { return MutSlice{reinterpret_cast<void*>(ptrs[i][j]), sizes[i][j]}; }, op);
  }

  // batch_get_into: one buffer per key (no nested lists to build).
  std::vector<int64_t> GetIntoOnePerKey(const std::vector<std::string>& keys, const std::vector<uintptr_t>& ptrs,
                                        const std::vector<uint64_t>& sizes, const char* op) {
    auto c = Ready(op);
    if (!c) return std::vector<int64_t>(keys.size(), kNotReady);
    if (ptrs.size() != keys.size() || sizes.size() != keys.size()) {
      MCXL_LOG(kWarn, "store", "%s: %zu keys, %zu buffers, %zu sizes: one of each per key", op, keys.size(),
               ptrs.size(), sizes.size());
      return std::vector<int64_t>(keys.size(), kInvalid);
    }
    py::gil_scoped_release nogil;
    return GetIntoFlat(
        *c, keys, [](size_t) { return size_t(1); },
        [&](size_t i, size_t) { return MutSlice{reinterpret_cast<void*>(ptrs[i]), sizes[i]}; }, op);
  }

  // Checks every destination, then one Client::BatchGetInto for the keys
  // that passed (GIL released by the caller). count(i): key i's number of
  // destinations (SIZE_MAX: its lists disagree); slice(i, j): the j-th.
  template <class Count, class Slice>
  static std::vector<int64_t> GetIntoFlat(Client& c, const std::vector<std::string>& keys, Count count,
                                          Slice slice, const char* op) {
    std::vector<int64_t> out(keys.size(), 0);
    std::vector<std::string_view> views(keys.begin(), keys.end());
    std::vector<MutSlice> dsts;
    std::vector<size_t> first;
    first.reserve(keys.size() + 1);
    for (size_t i = 0; i < keys.size(); ++i) {
      first.push_back(dsts.size());
      size_t n = count(i);
      if (n == SIZE_MAX) {
        out[i] = kInvalid;
        continue;
      }
      for (size_t j = 0; j < n && out[i] == 0; ++j) {
        MutSlice d = slice(i, j);
        out[i] = ToInt(c.CheckRange(reinterpret_cast<uintptr_t>(d.data), d.size, op).error());
        dsts.push_back(d);
      }
    }
    first.push_back(dsts.size());
    if (keys.size() == 1 && out[0] == 0) {  // get_into: no batch bookkeeping
      auto r = c.GetInto(views[0], dsts.data(), dsts.size());
      out[0] = r ? int64_t(*r) : int64_t(ToInt(r.error()));
      return out;
    }
    c.BatchGetInto(views, dsts, first, &out);
    return out;
  }

  std::vector<std::vector<std::vector<int64_t>>> GetIntoKeyRanges(
      const std::vector<uintptr_t>& buffers, const std::vector<std::vector<std::string>>& all_keys,
      const std::vector<std::vector<std::vector<uint64_t>>>& dst_offsets,
      const std::vector<std::vector<std::vector<uint64_t>>>& src_offsets,
      const std::vector<std::vector<std::vector<uint64_t>>>& sizes) {
    using Out = std::vector<std::vector<std::vector<int64_t>>>;
    auto c = Ready("get_into_ranges");
    const int64_t fail = !c ? kNotReady : kInvalid;
    // The reference's shapes (Mooncake 0.3.13, checked in test_conformance):
    // outer lists of different lengths: one list per buffer, [fail] per key;
    // a buffer whose per-key lists differ in number from its keys: [fail] per
    // key; a key whose offset and size lists differ: one fail per destination
    // offset (so [] for a key given no destination offsets); a key given no
    // ranges: [] (not read). Other keys of the call are read as usual.
    size_t nb = buffers.size();
    if (all_keys.size() != nb || dst_offsets.size() != nb || src_offsets.size() != nb || sizes.size() != nb) {
      if (c) MCXL_LOG(kWarn, "store", "get_into_ranges: %zu buffers but %zu key lists (%zu/%zu/%zu offset and size lists)",
                      nb, all_keys.size(), dst_offsets.size(), src_offsets.size(), sizes.size());
      Out out(std::max(nb, all_keys.size()));
      for (size_t b = 0; b < out.size(); ++b)
        out[b].assign(b < all_keys.size() && !all_keys[b].empty() ? all_keys[b].size() : 1, {fail});
      return out;
    }
    Out out(nb);
    std::vector<std::vector<char>> read(nb);  // per key: ranges consistent, to be read
    for (size_t b = 0; b < nb; ++b) {
      size_t nk = all_keys[b].size();
      read[b].assign(nk, 0);
      if (dst_offsets[b].size() != nk || src_offsets[b].size() != nk || sizes[b].size() != nk) {
        if (c) MCXL_LOG(kWarn, "store", "get_into_ranges: buffer %zu has %zu keys but %zu/%zu/%zu per-key lists", b, nk,
                        dst_offsets[b].size(), src_offsets[b].size(), sizes[b].size());
        out[b].assign(nk, {fail});
        continue;
      }
      out[b].resize(nk);
      for (size_t k = 0; k < nk; ++k) {
        size_t n = dst_offsets[b][k].size();
        bool ok = src_offsets[b][k].size() == n && sizes[b][k].size() == n;
        if (!ok && c)
          MCXL_LOG(kWarn, "store", "get_into_ranges: key %zu of buffer %zu has %zu destination offsets but %zu source "
                   "offsets and %zu sizes", k, b, n, src_offsets[b][k].size(), sizes[b][k].size());
        out[b][k].assign(n, fail);
        read[b][k] = ok && n > 0 && c;
      }
    }
    if (!c) return out;
    py::gil_scoped_release nogil;
    std::vector<RangeCopy> ranges;
    for (size_t b = 0; b < buffers.size(); ++b)
      for (size_t k = 0; k < all_keys[b].size(); ++k) {
        if (!read[b][k]) continue;
        ranges.clear();
        bool ok = true;
        for (size_t r = 0; r < sizes[b][k].size() && ok; ++r) {
          uintptr_t dst = buffers[b] + dst_offsets[b][k][r];
          ok = c->CheckRange(dst, sizes[b][k][r], "get_into_ranges").ok();
          ranges.push_back({src_offsets[b][k][r], reinterpret_cast<void*>(dst), sizes[b][k][r]});
        }
        if (ok) out[b][k] = c->GetRanges(all_keys[b][k], ranges);
      }
    return out;
  }

  // An announcement channel of the pool (announce.h): a producer or a reader
  // object, or an error code.
  py::object AnnounceOpen(const std::string& name, bool producer, bool from_start) {
    auto c = Ready("announce_open");
    if (!c) return py::int_(kNotReady);
    if (producer) {
      auto r = AnnounceProducer::Open(c->pool(), name);
      if (!r) return py::int_(ToInt(r.error()));
      return py::cast(std::move(r.value()));
    }
    auto r = AnnounceReader::Open(c->pool(), name, from_start);
    if (!r) return py::int_(ToInt(r.error()));
    return py::cast(std::move(r.value()));
  }

  // Holds (client.h HoldLeases / ReleaseLeases): per key 0 or an error code.
  std::vector<int> Hold(const std::vector<std::string>& keys, uint64_t until_ns, bool release) {
    auto c = Ready(release ? "release_hold" : "hold");
    if (!c) return std::vector<int>(keys.size(), kNotReady);
    std::vector<std::string_view> views(keys.begin(), keys.end());
    py::gil_scoped_release nogil;
    auto rc = release ? c->ReleaseLeases(views) : c->HoldLeases(views, until_ns);
    std::vector<int> out(rc.size());
    for (size_t i = 0; i < rc.size(); ++i) out[i] = ToInt(rc[i]);
    return out;
  }

  py::object GetBuffer(const std::string& key) {
    auto c = Ready("get_buffer");
    if (!c) return py::none();
    std::optional<Result<PinnedView>> v;
    {
      py::gil_scoped_release nogil;
      v.emplace(c->PinValue(key));
    }
    if (!*v) return py::none();
    return py::cast(std::make_unique<BufferHandle>(c, v->value()));
  }

  std::vector<py::object> BatchGetBuffer(const std::vector<std::string>& keys) {
    std::vector<py::object> out;
    for (const auto& k : keys) out.push_back(GetBuffer(k));
    return out;
  }

  // ---- one-sided reads ----
  py::bytes Get(const std::string& key) {
    auto c = Ready("get");
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

  std::vector<py::bytes> GetBatch(const std::vector<std::string>& keys) {
    std::vector<py::bytes> out;
    out.reserve(keys.size());
    for (const auto& k : keys) out.push_back(Get(k));
    return out;
  }

  int IsExist(const std::string& key) {
    auto c = Ready("is_exist");
    if (!c) return kNotReady;
    py::gil_scoped_release nogil;
    return c->IsExist(key);
  }

  std::vector<int> BatchIsExist(const std::vector<std::string>& keys) {
    auto c = Ready("batch_is_exist");
    if (!c) return std::vector<int>(keys.size(), kNotReady);
    py::gil_scoped_release nogil;
    std::vector<int> out(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) out[i] = c->IsExist(keys[i]);
    return out;
  }

  int64_t GetSize(const std::string& key) {
    auto c = Ready("get_size");
    if (!c) return kNotReady;
    py::gil_scoped_release nogil;
    auto r = c->GetSize(key);
    return r ? int64_t(*r) : int64_t(ToInt(r.error()));
  }

  // Where `key`'s replica lives, for get_replica_desc: {offset (the object's
  // offset in the pool, as /query_key reports it), size, writer (the
  // local_hostname in the writer's client slot, "" when unknown)}, or a
  // negative ErrorCode. A read of the index: no master round trip, no lease.
  py::object ReplicaInfo(const std::string& key) {
    auto c = Ready("get_replica_desc");
    if (!c) return py::int_(kNotReady);
    std::optional<Result<EntrySnapshot>> snap;
    std::string writer;
    {
      py::gil_scoped_release nogil;
      snap.emplace(c->Locate(key));
      if (*snap) {
        // owner_slot and the superblock are pool memory any client can write:
        // bound the slot by the table and the mapping. The host name may be
        // torn while its slot is re-attached; it is descriptive only.
        const auto& pool = c->pool();
        const Superblock* sb = pool->superblock();
        uint64_t slot = snap->value().owner_slot;
        if (slot < sb->client_slot_count && sb->client_table_offset <= pool->size() &&
            slot < (pool->size() - sb->client_table_offset) / sizeof(ClientSlot)) {
          const char* host = pool->client_slot(uint32_t(slot))->host;
          writer.assign(host, strnlen(host, sizeof(ClientSlot::host)));
        }
      }
    }
    if (!*snap) return py::int_(ToInt(snap->error()));
    py::dict d;
    // kOnDisk: the value is a record in the SSD tier (the stub says where).
    bool on_disk = snap->value().state() == EntryState::kOnDisk;
    d["tier"] = on_disk ? "disk" : "memory";
    if (on_disk) d["disk_root"] = c->tier_root();
    d["offset"] = snap->value().object_offset;
    d["size"] = snap->value().value_size;
    d["writer"] = writer;
    return d;
  }

  // ---- master operations ----
  int Remove(const std::string& key, bool force) {
    auto c = Ready("remove");
    if (!c) return kNotReady;
    py::gil_scoped_release nogil;
    return ToInt(c->Remove(key, force));
  }

  std::vector<int> BatchRemove(const std::vector<std::string>& keys, bool force) {
    auto c = Ready("batch_remove");
    if (!c) return std::vector<int>(keys.size(), kNotReady);
    std::vector<std::string_view> kv(keys.begin(), keys.end());
    py::gil_scoped_release nogil;
    auto r = c->BatchRemove(kv, force);
    return std::vector<int>(r.begin(), r.end());
  }

  int64_t RemoveByRegex(const std::string& pattern, bool force) {
    auto c = Ready("remove_by_regex");
    if (!c) return kNotReady;
    py::gil_scoped_release nogil;
    auto r = c->RemoveByRegex(pattern, force);
    return r ? int64_t(*r) : int64_t(ToInt(r.error()));
  }

  int64_t RemoveAll(bool force) {
    auto c = Ready("remove_all");
    if (!c) return kNotReady;
    py::gil_scoped_release nogil;
    auto r = c->RemoveAll(force);
    return r ? int64_t(*r) : int64_t(ToInt(r.error()));
  }

 private:
  // The client if set up and open; else logs why the call is refused.
  std::shared_ptr<Client> Ready(const char* op) const {
    if (client_ && !client_->closed()) return client_;
    MCXL_LOG(kWarn, "store", "%s() called before setup() or after close(): returns %d", op, kNotReady);
    return nullptr;
  }

  std::shared_ptr<Client> client_;
  std::string hostname_;
};

// The benchmark's baseline: plain memcpy of `size` bytes from a working set
// of `working_set` bytes into a destination set of `dst_working_set` bytes
// (both cycled, as the store's reads are). Keeps its buffers, so the
// benchmark can interleave baseline copies with store calls (same drift).
//
// With `shm_dir`, the source is a MAP_SHARED mapping of a (deleted) file in
// that directory: the same medium as a pool there, so the ratio measures the
// store's own cost, not the difference between two kinds of memory.
class MemcpyBench {
 public:
  MemcpyBench(uint64_t size, uint64_t working_set, uint64_t dst_working_set, const std::string& shm_dir)
      : size_(size), n_(std::max<uint64_t>(1, working_set / size)),
        nd_(std::max<uint64_t>(1, dst_working_set / size)), dst_(nd_ * size + 4096, 0) {
    uint64_t bytes = n_ * size;
    if (!shm_dir.empty()) {
      std::string tmpl = shm_dir + "/mcxl_memcpy_XXXXXX";
      int fd = mkstemp(tmpl.data());
      if (fd >= 0) {
        unlink(tmpl.c_str());
        if (ftruncate(fd, off_t(bytes)) == 0) {
          void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
          if (p != MAP_FAILED) mapped_ = static_cast<char*>(p);
        }
        close(fd);
      }
    }
    if (mapped_ == nullptr) {
      private_.assign(bytes + 4096, 1);
      src_ = AlignUp(private_.data());
    } else {
      memset(mapped_, 1, bytes);
      src_ = mapped_;
    }
    mapped_bytes_ = bytes;
  }
  ~MemcpyBench() {
    if (mapped_ != nullptr) munmap(mapped_, mapped_bytes_);
  }
  MemcpyBench(const MemcpyBench&) = delete;
  // Nanoseconds per copy, one entry per copy.
  std::vector<double> Run(int iterations) {
    std::vector<double> out;
    out.reserve(iterations);
    py::gil_scoped_release nogil;
    for (int i = 0; i < iterations; ++i, ++next_) {
      char* d = AlignUp(dst_.data()) + (next_ % nd_) * size_;
      auto t0 = std::chrono::steady_clock::now();
      memcpy(d, src_ + (next_ % n_) * size_, size_);
      auto t1 = std::chrono::steady_clock::now();
      out.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
      if (d[size_ / 2] != 1) out.back() = -1;  // keeps the copy observable
    }
    return out;
  }

 private:
  // Page-aligned buffers: the best case of a raw memcpy.
  static char* AlignUp(char* p) { return reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(p) + 4095) & ~uintptr_t(4095)); }
  uint64_t size_, n_, nd_, next_ = 0;
  std::vector<char> dst_, private_;
  char* mapped_ = nullptr;
  uint64_t mapped_bytes_ = 0;
  const char* src_ = nullptr;
};

}  // namespace

// Single-buffer forms of the zero-copy calls, lifted to the batch shapes.
// (uintptr_t and uint64_t are one type here: pointers and sizes share it.)
static_assert(std::is_same_v<uintptr_t, uint64_t>);
std::vector<std::vector<uint64_t>> Nest(const std::vector<uint64_t>& v) {
  std::vector<std::vector<uint64_t>> out;
  out.reserve(v.size());
  for (auto x : v) out.push_back({x});
  return out;
}

PYBIND11_MODULE(_core, m) {
  m.doc() = "mooncake_cxl core: a KV-cache store in a CXL memory pool";
  InitLogLevelFromEnv(LogLevel::kWarn);

  // Offsets of the pool's shared structures, for tests that corrupt them on
  // purpose (the ring robustness tests).
  m.def("_layout", [] {
    py::dict d;
    d["superblock.ring_region_offset"] = offsetof(Superblock, ring_region_offset);
    d["superblock.ring_bytes"] = offsetof(Superblock, ring_bytes);
    d["superblock.client_slot_count"] = offsetof(Superblock, client_slot_count);
    d["superblock.master_incarnation"] = offsetof(Superblock, master_incarnation);
    d["ring_header_size"] = sizeof(RingHeader);
    d["protocol_version"] = kProtocolVersion;  // for the tests that speak the wire protocol raw
    d["superblock.announce_offset"] = offsetof(Superblock, announce_offset);
    d["superblock.announce_slots"] = offsetof(Superblock, announce_slots);
    // For the pool-corruption tests (test_pool_corruption.py).
    d["superblock.pool_size"] = offsetof(Superblock, pool_size);
    d["superblock.index_offset"] = offsetof(Superblock, index_offset);
    d["superblock.index_capacity"] = offsetof(Superblock, index_capacity);
    d["superblock.data_offset"] = offsetof(Superblock, data_offset);
    d["superblock.data_size"] = offsetof(Superblock, data_size);
    d["entry.state_gen"] = offsetof(IndexEntry, state_gen);
    d["entry.object_offset"] = offsetof(IndexEntry, object_offset);
    d["entry.value_size"] = offsetof(IndexEntry, value_size);
    d["entry_size"] = sizeof(IndexEntry);
    d["header.key_len"] = offsetof(ObjectHeader, key_len);
    d["header_size"] = sizeof(ObjectHeader);
    return d;
  });
  py::class_<MemcpyBench>(m, "_MemcpyBench")
      .def(py::init<uint64_t, uint64_t, uint64_t, const std::string&>(), py::arg("size"),
           py::arg("working_set"), py::arg("dst_working_set") = 0, py::arg("shm_dir") = "")
      .def("run", &MemcpyBench::Run, py::arg("iterations"));

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

  using C = ReplicateConfig;
  py::class_<Store>(m, "StoreCore")
      .def(py::init<>())
      .def("_setup_core", &Store::SetupCore, py::arg("local_hostname"), py::arg("master_server_addr"),
           py::arg("pool_path"), py::arg("pool_size"), py::arg("connect_timeout_ms"), py::arg("rpc_timeout_ms"),
           py::arg("put_wait_ms"), py::arg("use_rings"), py::arg("tenant_id") = "default",
           py::arg("offload_path") = "", py::arg("enable_ssd_offload") = false)
      .def("close", &Store::Close)
      .def("health_check", &Store::HealthCheck)
      .def("get_hostname", &Store::GetHostname)
      .def("put", [](Store& s, const py::object& key, py::buffer value, const C& config) {
             std::string tmp;
             return s.Put(KeyView(key, &tmp), value, config, false); },
           py::arg("key"), py::arg("value"), py::arg("config") = C())
      .def("upsert", [](Store& s, const py::object& key, py::buffer value, const C& config) {
             std::string tmp;
             return s.Put(KeyView(key, &tmp), value, config, true); },
           py::arg("key"), py::arg("value"), py::arg("config") = C())
      .def("put_parts", [](Store& s, const std::string& key, py::args parts, const C& config) { return s.PutJoined(key, parts, config, false); },
           py::arg("key"), py::arg("config") = C())
      .def("upsert_parts", [](Store& s, const std::string& key, py::args parts, const C& config) { return s.PutJoined(key, parts, config, true); },
           py::arg("key"), py::arg("config") = C())
      .def("put_batch", [](Store& s, const std::vector<std::string>& keys, const std::vector<py::buffer>& values, const C& config) { return s.PutBatch(keys, values, config, false); },
           py::arg("keys"), py::arg("values"), py::arg("config") = C())
      .def("upsert_batch", [](Store& s, const std::vector<std::string>& keys, const std::vector<py::buffer>& values, const C& config) { return s.PutBatch(keys, values, config, true); },
           py::arg("keys"), py::arg("values"), py::arg("config") = C())
      .def("get", &Store::Get, py::arg("key"))
      .def("get_batch", &Store::GetBatch, py::arg("keys"))
      .def("is_exist", &Store::IsExist, py::arg("key"))
      .def("batch_is_exist", &Store::BatchIsExist, py::arg("keys"))
      .def("get_size", &Store::GetSize, py::arg("key"))
      .def("remove", &Store::Remove, py::arg("key"), py::arg("force") = false)
      .def("batch_remove", &Store::BatchRemove, py::arg("keys"), py::arg("force") = false)
      .def("remove_by_regex", &Store::RemoveByRegex, py::arg("regex_pattern"), py::arg("force") = false)
      .def("remove_all", &Store::RemoveAll, py::arg("force") = false)
      .def("register_buffer", &Store::RegisterBuffer, py::arg("buffer_ptr"), py::arg("size"))
      .def("unregister_buffer", &Store::UnregisterBuffer, py::arg("buffer_ptr"))
      .def("put_from", [](Store& s, const std::string& key, uintptr_t p, uint64_t n, const C& config) {
             return s.PutFromRanges({key}, {{p}}, {{n}}, config, false, "put_from")[0]; },
           py::arg("key"), py::arg("buffer_ptr"), py::arg("size"), py::arg("config") = C())
      .def("upsert_from", [](Store& s, const std::string& key, uintptr_t p, uint64_t n, const C& config) {
             return s.PutFromRanges({key}, {{p}}, {{n}}, config, true, "upsert_from")[0]; },
           py::arg("key"), py::arg("buffer_ptr"), py::arg("size"), py::arg("config") = C())
      .def("put_from_with_metadata",
           [](Store& s, const std::string& key, uintptr_t p, uintptr_t meta, uint64_t n, uint64_t meta_n, const C& config) {
             // Metadata first, then data: the reference's object layout.
             return s.PutFromRanges({key}, {{meta, p}}, {{meta_n, n}}, config, false, "put_from_with_metadata")[0]; },
           py::arg("key"), py::arg("buffer_ptr"), py::arg("metadata_buffer_ptr"), py::arg("size"),
           py::arg("metadata_size"), py::arg("config") = C())
      .def("batch_put_from", [](Store& s, const std::vector<std::string>& keys, const std::vector<uintptr_t>& ptrs,
                                const std::vector<uint64_t>& sizes, const C& config) {
             return s.PutFromRanges(keys, Nest(ptrs), Nest(sizes), config, false, "batch_put_from"); },
           py::arg("keys"), py::arg("buffer_ptrs"), py::arg("sizes"), py::arg("config") = C())
      .def("batch_upsert_from", [](Store& s, const std::vector<std::string>& keys, const std::vector<uintptr_t>& ptrs,
                                   const std::vector<uint64_t>& sizes, const C& config) {
             return s.PutFromRanges(keys, Nest(ptrs), Nest(sizes), config, true, "batch_upsert_from"); },
           py::arg("keys"), py::arg("buffer_ptrs"), py::arg("sizes"), py::arg("config") = C())
      .def("batch_put_from_multi_buffers",
           [](Store& s, const std::vector<std::string>& keys, const std::vector<std::vector<uintptr_t>>& ptrs,
              const std::vector<std::vector<uint64_t>>& sizes, const C& config) {
             return s.PutFromRanges(keys, ptrs, sizes, config, false, "batch_put_from_multi_buffers"); },
           py::arg("keys"), py::arg("all_buffer_ptrs"), py::arg("all_sizes"), py::arg("config") = C())
      // For batch_upsert_tensor (header + data per key, one master round trip).
      .def("_batch_upsert_from_multi_buffers",
           [](Store& s, const std::vector<std::string>& keys, const std::vector<std::vector<uintptr_t>>& ptrs,
              const std::vector<std::vector<uint64_t>>& sizes, const C& config) {
             return s.PutFromRanges(keys, ptrs, sizes, config, true, "batch_upsert_tensor"); },
           py::arg("keys"), py::arg("all_buffer_ptrs"), py::arg("all_sizes"), py::arg("config") = C())
      .def("_replica_info", &Store::ReplicaInfo, py::arg("key"))
      .def("_offload_read_count", [](Store& s) -> int64_t {
             auto c = s.client();
             return c ? int64_t(c->offload_read_count()) : 0; })
      .def("get_into", [](Store& s, const std::string& key, uintptr_t p, uint64_t n) {
             return s.GetIntoRanges({key}, {{p}}, {{n}}, "get_into")[0]; },
           py::arg("key"), py::arg("buffer_ptr"), py::arg("size"))
      .def("batch_get_into", [](Store& s, const std::vector<std::string>& keys, const std::vector<uintptr_t>& ptrs,
                                const std::vector<uint64_t>& sizes) {
             return s.GetIntoOnePerKey(keys, ptrs, sizes, "batch_get_into"); },
           py::arg("keys"), py::arg("buffer_ptrs"), py::arg("sizes"))
      .def("batch_get_into_multi_buffers",
           [](Store& s, const std::vector<std::string>& keys, const std::vector<std::vector<uintptr_t>>& ptrs,
              const std::vector<std::vector<uint64_t>>& sizes, bool) {
             return s.GetIntoRanges(keys, ptrs, sizes, "batch_get_into_multi_buffers"); },
           py::arg("keys"), py::arg("all_buffer_ptrs"), py::arg("all_sizes"), py::arg("prefer_alloc_in_same_node") = false)
      .def("get_into_ranges", &Store::GetIntoKeyRanges, py::arg("buffer_ptrs"), py::arg("all_keys"),
           py::arg("all_dst_offsets"), py::arg("all_src_offsets"), py::arg("all_sizes"))
      .def("get_buffer", &Store::GetBuffer, py::arg("key"))
      .def("batch_get_buffer", &Store::BatchGetBuffer, py::arg("keys"))
      .def("_announce_open", &Store::AnnounceOpen, py::arg("name"), py::arg("producer"), py::arg("from_start") = false)
      .def("_hold", [](Store& s, const std::vector<std::string>& keys, uint64_t until_ns) {
             return s.Hold(keys, until_ns, false); }, py::arg("keys"), py::arg("until_ns"))
      .def("_release_hold", [](Store& s, const std::vector<std::string>& keys) {
             return s.Hold(keys, 0, true); }, py::arg("keys"));

  // Announcement channels (mooncake_cxl.kv.announce wraps them).
  py::class_<AnnounceProducer>(m, "_AnnounceProducer")
      .def("publish", [](AnnounceProducer& p, const std::vector<uint64_t>& words) -> int64_t {
             if (words.size() > 7) {
               MCXL_LOG(kWarn, "announce", "publish: %zu words, a record holds 7", words.size());
               return int64_t(ErrorCode::INVALID_PARAMS);
             }
             AnnounceMessage msg;
             std::copy(words.begin(), words.end(), msg.words);
             return int64_t(p.Publish(msg));
           }, py::arg("words"))
      .def("close", &AnnounceProducer::Close)
      .def_property_readonly("head", &AnnounceProducer::head);
  py::class_<AnnounceReader>(m, "_AnnounceReader")
      // None when nothing is new, ("lapped", lost) after an overrun, else (number, words).
      .def("next", [](AnnounceReader& r) -> py::object {
             AnnounceMessage msg;
             uint64_t n = 0;
             switch (r.Next(&msg, &n)) {
               case AnnounceReader::ReadResult::kEmpty: return py::none();
               case AnnounceReader::ReadResult::kLapped: return py::make_tuple("lapped", n);
               default: break;
             }
             return py::make_tuple(n, std::vector<uint64_t>(msg.words, msg.words + 7));
           })
      .def("wait", [](AnnounceReader& r, double timeout_s, double spin_us) {
             uint64_t timeout_ns = timeout_s <= 0 ? 0 : uint64_t(std::min(timeout_s, 1e9) * 1e9);
             uint64_t spin_ns = spin_us <= 0 ? 0 : uint64_t(std::min(spin_us, 1e9) * 1e3);
             py::gil_scoped_release nogil;
             return r.Wait(spin_ns, timeout_ns);
           }, py::arg("timeout_s"), py::arg("spin_us") = 50.0)
      .def_property_readonly("cursor", &AnnounceReader::cursor)
      .def_property_readonly("head", &AnnounceReader::head)
      .def_property_readonly("producer_pid", &AnnounceReader::producer_pid)
      .def_property_readonly("producer_dead", &AnnounceReader::producer_dead)
      .def_property_readonly("epoch", &AnnounceReader::epoch);

  py::class_<BufferHandle>(m, "BufferHandle", py::buffer_protocol())
      .def_buffer([](BufferHandle& h) {
        // Read-only bytes, format 'b' as in the reference.
        return py::buffer_info(const_cast<char*>(h.data()), 1, "b", 1, {py::ssize_t(h.size())}, {py::ssize_t(1)},
                               /*readonly=*/true);
      })
      .def("ptr", &BufferHandle::ptr)
      .def("size", &BufferHandle::size)
      .def("__len__", &BufferHandle::size);
}
