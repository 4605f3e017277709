// Loading and validating the simulated NeuronCore a rank runs on.
//
// Usage:
//   DeviceSpec core = DeviceSpec::Default();           // embedded NeuronCore-v3
//   DeviceSpec mine = DeviceSpec::FromEnvironment();   // NEURON_DEVICE_FILE
//   double tflops = core.PeakTflops(/*fp32=*/false);   // 78.6
//
// Every error names the file (and, for parse errors, the line and column)
// and the field: a spec with impossible values (a zero clock, an SBUF
// smaller than one partition row, ...) is refused at load.
#pragma once

#include <cstdint>
#include <string>

#include "neuron/runtime/device.pb.h"

namespace neuron::runtime {

class DeviceSpec {
 public:
  // The embedded default (configs/devices/neuroncore-v3.textproto).
  static DeviceSpec Default();
  static DeviceSpec FromFile(const std::string& path);
  // Parses text; `origin` names where it came from in error messages.
  static DeviceSpec FromText(const std::string& text, const std::string& origin);
  // The file named by NEURON_DEVICE_FILE, or Default() when unset.
  static DeviceSpec FromEnvironment();

  const proto::DeviceSpec& spec() const { return spec_; }
  const std::string& origin() const { return origin_; }
  // The spec's deterministic binary serialization, made once: what identifies
  // the device in compile cache keys.
  const std::string& serialized() const { return serialized_; }

  // Dense matmul peak: pe_rows x pe_columns multiply-adds per cycle (2 FLOPs
  // each) at the tensor engine's clock; fp32 divided by its slowdown.
  double PeakTflops(bool fp32) const;
  std::uint64_t SbufBytes() const;
  std::uint64_t PsumBytes() const;
  std::uint64_t HbmBytes() const { return spec_.hbm().capacity_bytes(); }

 private:
  DeviceSpec(proto::DeviceSpec spec, std::string origin);
  void Validate() const;

  proto::DeviceSpec spec_;
  std::string origin_;
  std::string serialized_;
};

}  // namespace neuron::runtime
