// The pool's announcement channels (announce.h) for mooncake_cxl.kv.announce:
// StoreCore._announce_open gives a producer or a reader of a named channel
// (or an error code); their records are up to 7 words.
#include <pybind11/stl.h>

#include <algorithm>

#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/client/client.h"
#include "mooncake_cxl/control/announce.h"
#include "store_core.h"

namespace mcxl::binding {
namespace {

constexpr size_t kWords = sizeof(AnnounceMessage::words) / sizeof(AnnounceMessage::words[0]);

// The master names the tenant's channel and counts the hold; the object
// returned drops the hold when closed or collected.
py::object AnnounceOpen(Store& s, const std::string& name, bool producer, bool from_start) {
  auto c = s.Ready("announce_open");
  if (!c) return py::int_(kNotReady);
  Result<Client::AnnounceChannel> ch = ErrorCode::INTERNAL_ERROR;
  {
    py::gil_scoped_release nogil;
    ch = c->AnnounceOpen(name);
  }
  if (!ch) return py::int_(ToInt(ch.error()));
  std::weak_ptr<Client> weak = c;
  // Runs at close() (GIL released) or when Python collects the object (GIL
  // held: released for the master call, which may wait while no master runs).
  auto on_close = [weak, held = *ch] {
    auto client = weak.lock();
    if (!client) return;
    if (PyGILState_Check()) {
      py::gil_scoped_release nogil;
      client->AnnounceClose(held);
    } else {
      client->AnnounceClose(held);
    }
  };
  if (producer) {
    auto r = AnnounceProducer::Open(c->pool(), ch->channel, ch->name_hash, on_close);
    if (!r) return py::int_(ToInt(r.error()));
    return py::cast(std::move(r.value()));
  }
  auto r = AnnounceReader::Open(c->pool(), ch->channel, ch->name_hash, from_start, on_close);
  if (!r) return py::int_(ToInt(r.error()));
  return py::cast(std::move(r.value()));
}

int64_t Publish(AnnounceProducer& p, const std::vector<uint64_t>& words) {
  if (words.size() > kWords) {
    MCXL_LOG(kWarn, "announce", "publish: %zu words, a record holds %zu", words.size(), kWords);
    return int64_t(ErrorCode::INVALID_PARAMS);
  }
  AnnounceMessage msg;
  std::copy(words.begin(), words.end(), msg.words);
  auto n = p.Publish(msg);
  return n ? int64_t(*n) : int64_t(ToInt(n.error()));
}

// None when nothing is new, ("lapped", lost) after an overrun, ("lost", 0)
// once the channel no longer carries its name, else (number, words).
py::object Next(AnnounceReader& r) {
  AnnounceMessage msg;
  uint64_t n = 0;
  switch (r.Next(&msg, &n)) {
    case AnnounceReader::ReadResult::kEmpty: return py::none();
    case AnnounceReader::ReadResult::kLapped: return py::make_tuple("lapped", n);
    case AnnounceReader::ReadResult::kLost: return py::make_tuple("lost", 0);
    default: break;
  }
  return py::make_tuple(n, std::vector<uint64_t>(msg.words, msg.words + kWords));
}

bool Wait(AnnounceReader& r, double timeout_s, double spin_us) {
  uint64_t timeout_ns = timeout_s <= 0 ? 0 : uint64_t(std::min(timeout_s, 1e9) * 1e9);
  uint64_t spin_ns = spin_us <= 0 ? 0 : uint64_t(std::min(spin_us, 1e9) * 1e3);
  py::gil_scoped_release nogil;
  return r.Wait(spin_ns, timeout_ns);
}

}  // namespace

void DefineAnnounce(py::module_& m, StoreClass& store) {
  store.def("_announce_open", &AnnounceOpen, py::arg("name"), py::arg("producer"), py::arg("from_start") = false);
  py::class_<AnnounceProducer>(m, "_AnnounceProducer")
      .def("publish", &Publish, py::arg("words"))
      .def("close", &AnnounceProducer::Close, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("head", &AnnounceProducer::head);
  py::class_<AnnounceReader>(m, "_AnnounceReader")
      .def("next", &Next)
      .def("close", &AnnounceReader::Close, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("named", &AnnounceReader::named)
      .def("wait", &Wait, py::arg("timeout_s"), py::arg("spin_us") = 50.0)
      .def_property_readonly("cursor", &AnnounceReader::cursor)
      .def_property_readonly("head", &AnnounceReader::head)
      .def_property_readonly("producer_pid", &AnnounceReader::producer_pid)
      .def_property_readonly("producer_dead", &AnnounceReader::producer_dead)
      .def_property_readonly("epoch", &AnnounceReader::epoch);
}

}  // namespace mcxl::binding
