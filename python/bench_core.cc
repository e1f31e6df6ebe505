// mooncake_cxl._bench_core: the data benchmark's baseline (mooncake_cxl.bench
// data), kept out of the product binding.
//
// MemcpyBench: plain memcpy of `size` bytes from a working set of
// `working_set` bytes into a destination set of `dst_working_set` bytes
// (both cycled, as the store's reads are). Keeps its buffers, so the
// benchmark can interleave baseline copies with store calls (same drift).
// With `shm_dir`, the source is a MAP_SHARED mapping of a (deleted) file in
// that directory: the same medium as a pool there, so the ratio measures the
// store's own cost, not the difference between two kinds of memory.
// run_parts copies a batch between caller buffers and the working set, one
// memcpy per part (the engines section's bound: same bytes, same caller
// memory as the store's batch).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

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
  // A batch as a store moves it: one memcpy per part between caller memory
  // (ptrs[i], sizes[i]) and the next free bytes of the working set (cycled;
  // into it when to_working_set, else out of it). Nanoseconds for the batch.
  double RunParts(const std::vector<uint64_t>& ptrs, const std::vector<uint64_t>& sizes, bool to_working_set) {
    if (ptrs.size() != sizes.size()) throw py::value_error("run_parts: one size per pointer");
    uint64_t total = 0;
    for (uint64_t n : sizes) total += (n + 63) & ~uint64_t(63);
    if (total > mapped_bytes_) throw py::value_error("run_parts: the batch exceeds the working set");
    if (cursor_ + total > mapped_bytes_) cursor_ = 0;
    char* base = const_cast<char*>(src_) + cursor_;
    py::gil_scoped_release nogil;
    auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0, off = 0; i < ptrs.size(); off += (sizes[i] + 63) & ~uint64_t(63), ++i) {
      char* caller = reinterpret_cast<char*>(ptrs[i]);
      if (to_working_set) memcpy(base + off, caller, sizes[i]);
      else memcpy(caller, base + off, sizes[i]);
    }
    auto t1 = std::chrono::steady_clock::now();
    cursor_ += total;
    return std::chrono::duration<double, std::nano>(t1 - t0).count();
  }
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
  uint64_t size_, n_, nd_, next_ = 0, cursor_ = 0;
  std::vector<char> dst_, private_;
  char* mapped_ = nullptr;
  uint64_t mapped_bytes_ = 0;
  const char* src_ = nullptr;
};

}  // namespace

PYBIND11_MODULE(_bench_core, m) {
  m.doc() = "mooncake_cxl benchmark helpers (not part of the store's API)";
  py::class_<MemcpyBench>(m, "MemcpyBench")
      .def(py::init<uint64_t, uint64_t, uint64_t, const std::string&>(), py::arg("size"),
           py::arg("working_set"), py::arg("dst_working_set") = 0, py::arg("shm_dir") = "")
      .def("run", &MemcpyBench::Run, py::arg("iterations"))
      .def("run_parts", &MemcpyBench::RunParts, py::arg("ptrs"), py::arg("sizes"), py::arg("to_working_set"));
}
