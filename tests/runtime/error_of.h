// The message of the neuron::Error that `f` throws ("no error" when it
// throws none), for tests that check what an error names.
#pragma once

#include <functional>
#include <string>

#include "neuron/runtime/error.h"

namespace neuron::runtime::testing {

inline std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const neuron::Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace neuron::runtime::testing
