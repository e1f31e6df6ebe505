// StoreCore's puts of Python buffers (put, upsert, put_parts, put_batch and
// their upsert forms): each buffer is held for the call, the copy into the
// pool runs with the GIL released, one master round trip for all keys.
#include <pybind11/stl.h>

#include "mooncake_cxl/common/log.h"
#include "store_core.h"

namespace mcxl::binding {

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

namespace {

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

std::vector<int> PutMany(Store& s, const std::vector<std::string>& keys,
                         const std::vector<std::vector<py::handle>>& values, const ReplicateConfig& config,
                         bool upsert, const char* op) {
  auto c = s.Ready(op);
  if (!c) return std::vector<int>(keys.size(), kNotReady);
  if (!ConfigOk(config, keys.size(), op, c->dram_segment_size() != 0))
    return std::vector<int>(keys.size(), kInvalid);
  std::vector<std::unique_ptr<HeldBuffer>> held;
  std::vector<PutParts> parts(values.size());
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

// PutMany for one key and one buffer, without its per-call vectors
// (Client::PutOne; the key is a view of the caller's str, alive for the call).
int Put(Store& s, const py::object& key_obj, py::buffer value, const ReplicateConfig& config, bool upsert) {
  std::string tmp;
  std::string_view key = KeyView(key_obj, &tmp);
  const char* op = upsert ? "upsert" : "put";
  auto c = s.Ready(op);
  if (!c) return kNotReady;
  if (!ConfigOk(config, 1, op, c->dram_segment_size() != 0)) return kInvalid;
  HeldBuffer held(value);
  ConstSlice part = held.slice();
  PutOptions opts = ToPutOptions(config);
  py::gil_scoped_release nogil;
  return ToInt(c->PutOne(key, &part, 1, opts, upsert));
}

int PutJoined(Store& s, const std::string& key, py::args parts, const ReplicateConfig& config, bool upsert) {
  std::vector<py::handle> v(parts.begin(), parts.end());
  return PutMany(s, {key}, {v}, config, upsert, upsert ? "upsert_parts" : "put_parts")[0];
}

int PutBatch(Store& s, const std::vector<std::string>& keys, const std::vector<py::buffer>& values,
             const ReplicateConfig& config, bool upsert) {
  if (keys.size() != values.size()) {
    MCXL_LOG(kWarn, "store", "put_batch: %zu keys but %zu values", keys.size(), values.size());
    return kInvalid;
  }
  // An empty value stores nothing of the batch, as in the reference (an
  // empty key fails alone: the others are stored, also as in the reference).
  for (size_t i = 0; i < keys.size(); ++i) {
    py::buffer_info info = values[i].request();
    if (info.size * info.itemsize == 0) {
      MCXL_LOG(kWarn, "store", "%s: empty value at position %zu; nothing stored",
               upsert ? "upsert_batch" : "put_batch", i);
      return kInvalid;
    }
  }
  std::vector<std::vector<py::handle>> v;
  for (const auto& b : values) v.push_back({b});
  for (int r : PutMany(s, keys, v, config, upsert, upsert ? "upsert_batch" : "put_batch"))
    if (r != 0) return r;
  return 0;
}

}  // namespace

void DefinePutCalls(StoreClass& store) {
  using C = ReplicateConfig;
  store
      .def("put", [](Store& s, const py::object& key, py::buffer value, const C& config) {
             return Put(s, key, value, config, false); },
           py::arg("key"), py::arg("value"), py::arg("config") = C())
      .def("upsert", [](Store& s, const py::object& key, py::buffer value, const C& config) {
             return Put(s, key, value, config, true); },
           py::arg("key"), py::arg("value"), py::arg("config") = C())
      .def("put_parts", [](Store& s, const std::string& key, py::args parts, const C& config) {
             return PutJoined(s, key, parts, config, false); },
           py::arg("key"), py::arg("config") = C())
      .def("upsert_parts", [](Store& s, const std::string& key, py::args parts, const C& config) {
             return PutJoined(s, key, parts, config, true); },
           py::arg("key"), py::arg("config") = C())
      .def("put_batch", [](Store& s, const std::vector<std::string>& keys, const std::vector<py::buffer>& values,
                           const C& config) { return PutBatch(s, keys, values, config, false); },
           py::arg("keys"), py::arg("values"), py::arg("config") = C())
      .def("upsert_batch", [](Store& s, const std::vector<std::string>& keys, const std::vector<py::buffer>& values,
                              const C& config) { return PutBatch(s, keys, values, config, true); },
           py::arg("keys"), py::arg("values"), py::arg("config") = C());
}

}  // namespace mcxl::binding
