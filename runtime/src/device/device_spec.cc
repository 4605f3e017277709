#include "neuron/runtime/device/device_spec.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <cmath>
#include <utility>

#include "neuron/runtime/text_proto.h"
#include "neuron/runtime/config.h"
#include "neuron/runtime/error.h"

namespace neuron::runtime {

// Defined in the generated default_device.cc (from neuroncore-v3.textproto).
extern const char* const kDefaultDeviceText;

namespace {

// Checks `value` > 0 for the field `name` of the spec from `origin`.
template <typename T>
void Positive(T value, const char* name, const std::string& origin) {
  NEURON_CHECK(value > 0 && std::isfinite(static_cast<double>(value)), "device spec ", origin,
               ": ", name, " must be > 0 and finite, got ", value);
}

void CheckElementwise(const proto::ElementwiseEngineSpec& e, const std::string& engine,
                      const std::string& origin) {
  NEURON_CHECK(e.clock_ghz() > 0 && e.lanes() > 0 && e.cycles_per_element() > 0,
               "device spec ", origin, ": ", engine,
               " needs clock_ghz, lanes and cycles_per_element > 0 (got ", e.clock_ghz(),
               ", ", e.lanes(), ", ", e.cycles_per_element(), ")");
}

// The host fields are 0 (their default) or positive and finite.
void CheckHost(const proto::HostSpec& h, const std::string& origin) {
  const std::pair<double, const char*> fields[] = {
      {h.link_gbps(), "host.link_gbps"},
      {h.link_latency_us(), "host.link_latency_us"},
      {h.sync_us(), "host.sync_us"},
      {h.cpu_ns_per_element(), "host.cpu_ns_per_element"}};
  for (const auto& [value, name] : fields) {
    NEURON_CHECK(value >= 0 && std::isfinite(value), "device spec ", origin, ": ", name,
                 " must be 0 (its default) or > 0 and finite, got ", value);
  }
}

}  // namespace

DeviceSpec::DeviceSpec(proto::DeviceSpec spec, std::string origin)
    : spec_(std::move(spec)), origin_(std::move(origin)) {
  Validate();
  google::protobuf::io::StringOutputStream stream(&serialized_);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  spec_.SerializeToCodedStream(&coded);
}

DeviceSpec DeviceSpec::Default() {
  return FromText(kDefaultDeviceText, "<embedded neuroncore-v3>");
}

DeviceSpec DeviceSpec::FromFile(const std::string& path) {
  return FromText(ReadTextFile(path, "device spec"), path);
}

DeviceSpec DeviceSpec::FromText(const std::string& text, const std::string& origin) {
  proto::DeviceSpec spec;
  ParseTextProto(text, origin, "device spec", &spec);
  return DeviceSpec(std::move(spec), origin);
}

DeviceSpec DeviceSpec::FromEnvironment() {
  const auto path = ConfigRegistry::Get().Find(ConfigKey::kDeviceFile);
  return path ? FromFile(*path) : Default();
}

double DeviceSpec::PeakTflops(bool fp32) const {
  const auto& t = spec_.tensor();
  const double peak = 2.0 * t.pe_rows() * t.pe_columns() * t.clock_ghz() * 1e9 / 1e12;
  return fp32 ? peak / t.fp32_slowdown() : peak;
}

std::uint64_t DeviceSpec::SbufBytes() const {
  return std::uint64_t{spec_.sbuf().partitions()} * spec_.sbuf().bytes_per_partition();
}

std::uint64_t DeviceSpec::PsumBytes() const {
  return std::uint64_t{spec_.psum().partitions()} * spec_.psum().bytes_per_partition();
}

void DeviceSpec::Validate() const {
  for (char c : spec_.name()) {
    NEURON_CHECK(c >= 0x20 && c < 0x7f, "device spec ", origin_,
                 ": name must be printable ASCII");
  }
  const auto& t = spec_.tensor();
  Positive(t.pe_rows(), "tensor.pe_rows", origin_);
  Positive(t.pe_columns(), "tensor.pe_columns", origin_);
  Positive(t.clock_ghz(), "tensor.clock_ghz", origin_);
  Positive(t.max_moving_free(), "tensor.max_moving_free", origin_);
  NEURON_CHECK(t.fp32_slowdown() >= 1, "device spec ", origin_,
               ": tensor.fp32_slowdown must be >= 1, got ", t.fp32_slowdown());
  CheckElementwise(spec_.vector(), "vector", origin_);
  CheckElementwise(spec_.scalar(), "scalar", origin_);
  CheckElementwise(spec_.gpsimd(), "gpsimd", origin_);
  Positive(spec_.sbuf().partitions(), "sbuf.partitions", origin_);
  Positive(spec_.sbuf().bytes_per_partition(), "sbuf.bytes_per_partition", origin_);
  Positive(spec_.psum().partitions(), "psum.partitions", origin_);
  Positive(spec_.psum().bytes_per_partition(), "psum.bytes_per_partition", origin_);
  NEURON_CHECK(spec_.sbuf().partitions() == t.pe_rows(), "device spec ", origin_,
               ": sbuf.partitions (", spec_.sbuf().partitions(),
               ") must equal tensor.pe_rows (", t.pe_rows(),
               "): tiles contract over them");
  NEURON_CHECK(spec_.psum().bytes_per_partition() <= spec_.sbuf().bytes_per_partition(),
               "device spec ", origin_, ": psum.bytes_per_partition (",
               spec_.psum().bytes_per_partition(), ") exceeds sbuf.bytes_per_partition (",
               spec_.sbuf().bytes_per_partition(), ")");
  Positive(spec_.hbm().capacity_bytes(), "hbm.capacity_bytes", origin_);
  Positive(spec_.hbm().bandwidth_gbps(), "hbm.bandwidth_gbps", origin_);
  NEURON_CHECK(SbufBytes() < spec_.hbm().capacity_bytes(), "device spec ", origin_,
               ": SBUF (", SbufBytes(), " bytes) must be smaller than HBM (",
               spec_.hbm().capacity_bytes(), " bytes)");
  Positive(spec_.dma().engines(), "dma.engines", origin_);
  Positive(spec_.dma().bandwidth_gbps_per_engine(), "dma.bandwidth_gbps_per_engine",
           origin_);
  NEURON_CHECK(spec_.dma().fixed_cost_us() >= 0, "device spec ", origin_,
               ": dma.fixed_cost_us must be >= 0, got ", spec_.dma().fixed_cost_us());
  const double fraction = spec_.dma().collective_compute_fraction();
  NEURON_CHECK(fraction >= 0 && fraction <= 1, "device spec ", origin_,
               ": dma.collective_compute_fraction must be 0 (0.5) to 1, got ", fraction);
  CheckHost(spec_.host(), origin_);
}

}  // namespace neuron::runtime
