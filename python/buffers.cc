// StoreCore's zero-copy calls: caller memory registered or named by address
// (register_buffer, put_from and its batch forms, get_into and its batch
// forms, get_into_ranges), and BufferHandle, a pinned view into the pool
// (get_buffer). Every caller range is checked (Client::CheckRange) before
// any byte moves; a key with a bad range fails alone.
#include <pybind11/stl.h>

#include <algorithm>

#include "mooncake_cxl/common/log.h"
#include "store_core.h"

namespace mcxl::binding {
namespace {

// A read-only view straight into the pool. Holds a pin (see
// Client::PinValue) until it is garbage-collected, and the client (and so the
// pool mapping) alive. While it lives its bytes never change: the pin
// survives the client's close(), a reclaim of its slot while the process is
// alive (e.g. stopped past --client_ttl), and a master restart. Every access
// (buffer protocol, ptr()) checks that the pin is still held and raises
// BufferError if the master dropped it (only a retired client of another host
// past --put_start_release_timeout_sec): it never shows other bytes. A
// memoryview or array taken from the handle is valid while the handle is.
// A value in a DRAM segment has no pool bytes to pin: its handle holds a
// copy instead (no client, nothing to check).
class BufferHandle {
 public:
  BufferHandle(std::shared_ptr<Client> c, PinnedView v) : client_(std::move(c)), view_(v) {}
  explicit BufferHandle(std::string copy) : copy_(std::move(copy)) {
    view_.data = copy_.data();
    view_.size = copy_.size();
  }
  ~BufferHandle() {
    if (client_) client_->Unpin(view_);
  }
  BufferHandle(const BufferHandle&) = delete;
  uintptr_t ptr() const { return reinterpret_cast<uintptr_t>(Checked()); }
  uint64_t size() const { return view_.size; }
  const char* data() const { return Checked(); }

 private:
  const char* Checked() const {
    if (client_ && !client_->PinHeld(view_))
      throw py::buffer_error("BufferHandle: the master dropped this view's pin (its client was retired "
                             "longer than --put_start_release_timeout_sec); the bytes are no longer valid");
    return view_.data;
  }
  std::shared_ptr<Client> client_;
  PinnedView view_;
  std::string copy_;
};

// get_buffer's copy of a segment value.
class StringSink final : public ReadSink {
 public:
  Status Place(uint64_t size, ReadDest* dest) override {
    bytes.resize(size);
    slice_ = {bytes.data(), size};
    dest->slices = &slice_;
    dest->nslices = 1;
    return ErrorCode::OK;
  }
  std::string bytes;

 private:
  MutSlice slice_{};
};

// The zero-copy batch calls take one buffer list and one size list per key.
bool OneListPerKey(const char* op, const std::vector<std::string>& keys,
                   const std::vector<std::vector<uint64_t>>& ptrs, const std::vector<std::vector<uint64_t>>& sizes) {
  if (ptrs.size() == keys.size() && sizes.size() == keys.size()) return true;
  MCXL_LOG(kWarn, "store", "%s: %zu keys, %zu buffer lists, %zu size lists: one of each per key", op,
           keys.size(), ptrs.size(), sizes.size());
  return false;
}

// uintptr_t and uint64_t are one type here: pointers and sizes share it.
static_assert(std::is_same_v<uintptr_t, uint64_t>);

int RegisterBuffer(Store& s, uintptr_t ptr, uint64_t size) {
  auto c = s.Ready("register_buffer");
  if (!c) return kNotReady;
  py::gil_scoped_release nogil;
  return ToInt(c->RegisterBuffer(ptr, size).error());
}

int UnregisterBuffer(Store& s, uintptr_t ptr) {
  auto c = s.Ready("unregister_buffer");
  if (!c) return kNotReady;
  return ToInt(c->UnregisterBuffer(ptr).error());
}

// Puts each key's value gathered from caller memory: one master round trip
// for the batch, one copy per byte. count(i): key i's number of buffers
// (SIZE_MAX: its lists disagree); slice(i, j): the j-th. The values go to
// Client::Put as one flat list (no vector per key).
template <class Count, class Slice>
std::vector<int> PutFromFlat(Store& s, const std::vector<std::string>& keys, Count count, Slice slice,
                             const ReplicateConfig& config, bool upsert, const char* op) {
  auto c = s.Ready(op);
  if (!c) return std::vector<int>(keys.size(), kNotReady);
  if (!ConfigOk(config, keys.size(), op, c->dram_segment_size() != 0))
    return std::vector<int>(keys.size(), kInvalid);
  PutOptions opts = ToPutOptions(config);
  py::gil_scoped_release nogil;
  std::vector<int> out(keys.size(), 0);
  std::vector<std::string_view> send_keys;
  std::vector<ConstSlice> parts;
  std::vector<size_t> first, sent;
  send_keys.reserve(keys.size());
  first.reserve(keys.size() + 1);
  sent.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    size_t n = count(i);
    if (n == SIZE_MAX) {
      out[i] = kInvalid;
      continue;
    }
    size_t begin = parts.size();
    for (size_t j = 0; j < n && out[i] == 0; ++j) {
      ConstSlice p = slice(i, j);
      out[i] = ToInt(c->CheckRange(reinterpret_cast<uintptr_t>(p.data), p.size, op).error());
      parts.push_back(p);
    }
    if (out[i] != 0) {
      parts.resize(begin);
      continue;
    }
    first.push_back(begin);
    send_keys.emplace_back(keys[i]);
    sent.push_back(i);
  }
  first.push_back(parts.size());
  if (!sent.empty()) {
    auto r = c->Put(send_keys, parts, first, opts, upsert);
    for (size_t j = 0; j < sent.size(); ++j) out[sent[j]] = ToInt(r[j]);
  }
  return out;
}

// The multi-buffer forms: one buffer list and one size list per key.
std::vector<int> PutFromRanges(Store& s, const std::vector<std::string>& keys,
                               const std::vector<std::vector<uintptr_t>>& ptrs,
                               const std::vector<std::vector<uint64_t>>& sizes, const ReplicateConfig& config,
                               bool upsert, const char* op) {
  if (!OneListPerKey(op, keys, ptrs, sizes)) return std::vector<int>(keys.size(), kInvalid);
  return PutFromFlat(
      s, keys,
      [&](size_t i) {
        if (ptrs[i].size() == sizes[i].size()) return ptrs[i].size();
        MCXL_LOG(kWarn, "store", "%s: key %zu has %zu buffers but %zu sizes", op, i, ptrs[i].size(), sizes[i].size());
        return SIZE_MAX;
      },
      [&](size_t i, size_t j) { return ConstSlice{reinterpret_cast<const void*>(ptrs[i][j]), sizes[i][j]}; }, config,
      upsert, op);
}

// batch_put_from / batch_upsert_from: one buffer per key (no nested lists).
std::vector<int> PutFromOnePerKey(Store& s, const std::vector<std::string>& keys, const std::vector<uintptr_t>& ptrs,
                                  const std::vector<uint64_t>& sizes, const ReplicateConfig& config, bool upsert,
                                  const char* op) {
  if (ptrs.size() != keys.size() || sizes.size() != keys.size()) {
    MCXL_LOG(kWarn, "store", "%s: %zu keys, %zu buffers, %zu sizes: one of each per key", op, keys.size(),
             ptrs.size(), sizes.size());
    return std::vector<int>(keys.size(), kInvalid);
  }
  return PutFromFlat(
      s, keys, [](size_t) { return size_t(1); },
      [&](size_t i, size_t) { return ConstSlice{reinterpret_cast<const void*>(ptrs[i]), sizes[i]}; }, config, upsert,
      op);
}

// Checks every destination, then one Client::BatchGetInto for the keys
// that passed (GIL released by the caller). count(i): key i's number of
// destinations (SIZE_MAX: its lists disagree); slice(i, j): the j-th.
template <class Count, class Slice>
std::vector<int64_t> GetIntoFlat(Client& c, const std::vector<std::string>& keys, Count count, Slice slice,
                                 const char* op) {
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

// get_into: one key, one destination, no batch vectors; the GIL released
// only for a copy of kReleaseGilFromBytes or more.
int64_t GetIntoOne(Store& s, const py::handle& key_obj, uintptr_t ptr, uint64_t size) {
  auto c = s.Ready("get_into");
  if (!c) return kNotReady;
  std::string tmp;
  std::string_view key = KeyView(key_obj, &tmp);
  std::optional<py::gil_scoped_release> nogil;
  if (size >= kReleaseGilFromBytes) nogil.emplace();
  Status checked = c->CheckRange(ptr, size, "get_into");
  if (!checked.ok()) return ToInt(checked.error());
  MutSlice dst{reinterpret_cast<void*>(ptr), size};
  auto r = c->GetInto(key, &dst, 1);
  return r ? int64_t(*r) : int64_t(ToInt(r.error()));
}

// Reads each key's value scattered into caller memory: bytes read or an error.
std::vector<int64_t> GetIntoRanges(Store& s, const std::vector<std::string>& keys,
                                   const std::vector<std::vector<uintptr_t>>& ptrs,
                                   const std::vector<std::vector<uint64_t>>& sizes, const char* op) {
  auto c = s.Ready(op);
  if (!c) return std::vector<int64_t>(keys.size(), kNotReady);
  if (!OneListPerKey(op, keys, ptrs, sizes)) return std::vector<int64_t>(keys.size(), kInvalid);
  py::gil_scoped_release nogil;
  return GetIntoFlat(
      *c, keys, [&](size_t i) { return ptrs[i].size() == sizes[i].size() ? ptrs[i].size() : SIZE_MAX; },
      [&](size_t i, size_t j) { return MutSlice{reinterpret_cast<void*>(ptrs[i][j]), sizes[i][j]}; }, op);
}

// batch_get_into: one buffer per key (no nested lists to build).
std::vector<int64_t> GetIntoOnePerKey(Store& s, const std::vector<std::string>& keys,
                                      const std::vector<uintptr_t>& ptrs, const std::vector<uint64_t>& sizes,
                                      const char* op) {
  auto c = s.Ready(op);
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

std::vector<std::vector<std::vector<int64_t>>> GetIntoKeyRanges(
    Store& s, const std::vector<uintptr_t>& buffers, const std::vector<std::vector<std::string>>& all_keys,
    const std::vector<std::vector<std::vector<uint64_t>>>& dst_offsets,
    const std::vector<std::vector<std::vector<uint64_t>>>& src_offsets,
    const std::vector<std::vector<std::vector<uint64_t>>>& sizes) {
  using Out = std::vector<std::vector<std::vector<int64_t>>>;
  auto c = s.Ready("get_into_ranges");
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
        ok = c->CheckRangeFrom(buffers[b], dst_offsets[b][k][r], sizes[b][k][r], "get_into_ranges").ok();
        ranges.push_back({src_offsets[b][k][r], reinterpret_cast<void*>(dst), sizes[b][k][r]});
      }
      if (ok) out[b][k] = c->GetRanges(all_keys[b][k], ranges);
    }
  return out;
}

py::object GetBuffer(Store& s, const std::string& key) {
  auto c = s.Ready("get_buffer");
  if (!c) return py::none();
  std::optional<Result<PinnedView>> v;
  {
    py::gil_scoped_release nogil;
    v.emplace(c->PinValue(key));
  }
  if (!*v && v->error() == ErrorCode::NOT_SUPPORTED) {  // in a DRAM segment: a copy
    StringSink sink;
    Result<uint64_t> r = ErrorCode::OBJECT_NOT_FOUND;
    {
      py::gil_scoped_release nogil;
      r = c->Get(key, sink);
    }
    if (!r) return py::none();
    return py::cast(std::make_unique<BufferHandle>(std::move(sink.bytes)));
  }
  if (!*v) return py::none();
  return py::cast(std::make_unique<BufferHandle>(c, v->value()));
}

std::vector<py::object> BatchGetBuffer(Store& s, const std::vector<std::string>& keys) {
  std::vector<py::object> out;
  for (const auto& k : keys) out.push_back(GetBuffer(s, k));
  return out;
}

}  // namespace

void DefineZeroCopyCalls(py::module_& m, StoreClass& store) {
  using C = ReplicateConfig;
  using Ptrs = std::vector<uintptr_t>;
  using Sizes = std::vector<uint64_t>;
  using PtrLists = std::vector<std::vector<uintptr_t>>;
  using SizeLists = std::vector<std::vector<uint64_t>>;
  using Keys = std::vector<std::string>;
  store.def("register_buffer", &RegisterBuffer, py::arg("buffer_ptr"), py::arg("size"))
      .def("unregister_buffer", &UnregisterBuffer, py::arg("buffer_ptr"))
      .def("put_from", [](Store& s, const std::string& key, uintptr_t p, uint64_t n, const C& config) {
             return PutFromRanges(s, {key}, {{p}}, {{n}}, config, false, "put_from")[0]; },
           py::arg("key"), py::arg("buffer_ptr"), py::arg("size"), py::arg("config") = C())
      .def("upsert_from", [](Store& s, const std::string& key, uintptr_t p, uint64_t n, const C& config) {
             return PutFromRanges(s, {key}, {{p}}, {{n}}, config, true, "upsert_from")[0]; },
           py::arg("key"), py::arg("buffer_ptr"), py::arg("size"), py::arg("config") = C())
      .def("put_from_with_metadata",
           [](Store& s, const std::string& key, uintptr_t p, uintptr_t meta, uint64_t n, uint64_t meta_n, const C& config) {
             // Metadata first, then data: the reference's object layout.
             return PutFromRanges(s, {key}, {{meta, p}}, {{meta_n, n}}, config, false, "put_from_with_metadata")[0]; },
           py::arg("key"), py::arg("buffer_ptr"), py::arg("metadata_buffer_ptr"), py::arg("size"),
           py::arg("metadata_size"), py::arg("config") = C())
      .def("batch_put_from", [](Store& s, const Keys& keys, const Ptrs& ptrs, const Sizes& sizes, const C& config) {
             return PutFromOnePerKey(s, keys, ptrs, sizes, config, false, "batch_put_from"); },
           py::arg("keys"), py::arg("buffer_ptrs"), py::arg("sizes"), py::arg("config") = C())
      .def("batch_upsert_from", [](Store& s, const Keys& keys, const Ptrs& ptrs, const Sizes& sizes, const C& config) {
             return PutFromOnePerKey(s, keys, ptrs, sizes, config, true, "batch_upsert_from"); },
           py::arg("keys"), py::arg("buffer_ptrs"), py::arg("sizes"), py::arg("config") = C())
      .def("batch_put_from_multi_buffers",
           [](Store& s, const Keys& keys, const PtrLists& ptrs, const SizeLists& sizes, const C& config) {
             return PutFromRanges(s, keys, ptrs, sizes, config, false, "batch_put_from_multi_buffers"); },
           py::arg("keys"), py::arg("all_buffer_ptrs"), py::arg("all_sizes"), py::arg("config") = C())
      // For batch_upsert_tensor (header + data per key, one master round trip).
      .def("_batch_upsert_from_multi_buffers",
           [](Store& s, const Keys& keys, const PtrLists& ptrs, const SizeLists& sizes, const C& config) {
             return PutFromRanges(s, keys, ptrs, sizes, config, true, "batch_upsert_tensor"); },
           py::arg("keys"), py::arg("all_buffer_ptrs"), py::arg("all_sizes"), py::arg("config") = C())
      .def("get_into", &GetIntoOne,
           py::arg("key"), py::arg("buffer_ptr"), py::arg("size"))
      .def("batch_get_into", [](Store& s, const Keys& keys, const Ptrs& ptrs, const Sizes& sizes) {
             return GetIntoOnePerKey(s, keys, ptrs, sizes, "batch_get_into"); },
           py::arg("keys"), py::arg("buffer_ptrs"), py::arg("sizes"))
      .def("batch_get_into_multi_buffers",
           [](Store& s, const Keys& keys, const PtrLists& ptrs, const SizeLists& sizes, bool) {
             return GetIntoRanges(s, keys, ptrs, sizes, "batch_get_into_multi_buffers"); },
           py::arg("keys"), py::arg("all_buffer_ptrs"), py::arg("all_sizes"), py::arg("prefer_alloc_in_same_node") = false)
      .def("get_into_ranges", &GetIntoKeyRanges, py::arg("buffer_ptrs"), py::arg("all_keys"),
           py::arg("all_dst_offsets"), py::arg("all_src_offsets"), py::arg("all_sizes"))
      .def("get_buffer", &GetBuffer, py::arg("key"))
      .def("batch_get_buffer", &BatchGetBuffer, py::arg("keys"));

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

}  // namespace mcxl::binding
