// Small helpers of the lowering (lower.cc and the op lowerings): a node's
// attributes, shapes and strides, intermediate values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "neuron/compiler/graph.pb.h"

namespace neuron::compiler {

std::int64_t Elements(const proto::TensorType& t);
std::vector<std::int64_t> Shape(const proto::TensorType& t);
// Row-major strides of `shape`, in elements.
std::vector<std::int64_t> ContiguousStrides(const std::vector<std::int64_t>& shape);
// A dimension attribute, negative counting from the end, checked against a
// `rank`-D tensor (InvalidUsage naming `where`).
std::int64_t Dim(std::int64_t d, std::size_t rank, const std::string& where);
std::string Join(const std::vector<std::int64_t>& v);  // "2, 3, 4"
// A value of `dtype` and `shape` for an intermediate slot.
proto::Value TempValue(const std::string& name, const std::string& dtype,
                       const std::vector<std::int64_t>& shape);

// Node attributes: the attribute, or null.
const proto::Attribute* Attr(const proto::Node& n, const char* key);
// An int or float attribute as a number.
double Number(const proto::Attribute& a);
// An int or float attribute as a number; `fallback` when absent.
double AttrNumber(const proto::Node& n, const char* key, double fallback);
// An int attribute; `fallback` when absent.
std::int64_t AttrInt(const proto::Node& n, const char* key, std::int64_t fallback);
// An int or a list of ints; empty when absent.
std::vector<std::int64_t> AttrInts(const proto::Node& n, const char* key);

}  // namespace neuron::compiler
