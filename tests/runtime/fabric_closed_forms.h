// Test topologies and the closed forms the fabric model is held against:
// a hop costs a + bytes / B, and a reducing hop (the receiver reduces what
// arrives, in two slices that overlap the wire) a + (w + r + max(w, r)) / 2
// with w = bytes / B and r = bytes / R, R the rank's reduction rate.
#pragma once

#include <gtest/gtest.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "neuron/runtime/device/device_spec.h"
#include "neuron/runtime/fabric/collective_schedules.h"
#include "neuron/runtime/fabric/fabric_model.h"
#include "neuron/runtime/fabric/reduction_rate.h"

namespace neuron::runtime {

inline constexpr double kB = 100e9;  // link bandwidth of the test topologies, B/s
inline constexpr double kA = 2e-6;   // per hop latency, s
// The reduction rate of a rank that holds a whole chip of the default
// device (8 NeuronCore-v3).
inline double ChipReductionRate() {
  static const double rate = ReductionBytesPerSecond(DeviceSpec::Default(), 8);
  return rate;
}

inline double Hop(double bytes, double a = kA, double b = kB) { return a + bytes / b; }

inline double ReduceHop(double bytes, double a = kA, double b = kB) {
  const double w = bytes / b, r = bytes / ChipReductionRate();
  return a + (w + r + std::max(w, r)) / 2;
}

// One node whose chips form a 1-D torus (a ring) of n chips.
inline Topology RingTopology(int n, const std::string& extra = "") {
  return Topology::FromText(
      "chips_per_node: " + std::to_string(n) + " torus_dims: [" + std::to_string(n) +
          "] ranks_per_chip: 1 intra_node_link { bandwidth_gbps: 100 latency_us: 2 } "
          "inter_node_link { bandwidth_gbps: 100 latency_us: 2 } " + extra,
      "ring-test");
}

// Nodes of one chip each, joined by EFA NICs: every pair one hop apart.
inline Topology SwitchTopology(const std::string& extra = "") {
  return Topology::FromText(
      "chips_per_node: 1 torus_dims: [1] ranks_per_chip: 1 "
      "intra_node_link { bandwidth_gbps: 100 latency_us: 2 } "
      "inter_node_link { bandwidth_gbps: 100 latency_us: 2 } " + extra,
      "switch-test");
}

// `topology` without its collective calibration: the bare fabric the
// closed forms describe (its chunking bounds stay).
inline Topology Uncalibrated(const Topology& topology) {
  proto::TopologySpec spec = topology.spec();
  spec.mutable_collective_engine()->clear_calibration();
  std::string text;
  google::protobuf::TextFormat::PrintToString(spec, &text);
  return Topology::FromText(text, spec.name() + " without calibration");
}

// The default device with HBM at `gbps` per core.
inline DeviceSpec DeviceWithHbm(double gbps) {
  proto::DeviceSpec spec = DeviceSpec::Default().spec();
  spec.mutable_hbm()->set_bandwidth_gbps(gbps);
  std::string text;
  google::protobuf::TextFormat::PrintToString(spec, &text);
  return DeviceSpec::FromText(text, "hbm-test");
}

inline double Seconds(const FabricModel& model, CollectiveKind kind, double bytes,
                      FabricAlgorithm algorithm) {
  const CollectiveShape shape{kind, bytes, AllRanks(model.world_size()), 0};
  return ToSeconds(model.Simulate(BuildSchedule(model, shape, algorithm)).total);
}

// Sets an environment variable for a scope, restoring what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_.empty()) ::unsetenv(name_);
    else ::setenv(name_, old_.c_str(), 1);
  }

 private:
  const char* name_;
  std::string old_;
};

// Equal to the closed form up to floating-point rounding.
inline void ExpectClose(double modelled, double closed_form, const std::string& what) {
  EXPECT_NEAR(modelled, closed_form, 1e-9 * closed_form) << what;
}

}  // namespace neuron::runtime
