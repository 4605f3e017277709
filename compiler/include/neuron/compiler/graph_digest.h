// The digest of what a graph computes, for the compile cache's key.
//
// Covers the inputs (names, dtypes, shapes), the constants (their values'
// types and a SHA-256 of their bytes), every node's op, inputs, outputs and
// attributes (in attribute-name order), and the outputs; not the graph's
// name nor the nodes' source lines, which are labels. Equal graphs give
// equal digests on every rank and run.
//
// Written field by field (each string length-prefixed, so no two graphs
// encode alike) into SHA-256 through a small buffer: serializing every node
// as a protobuf message cost a quarter of a disk cache hit, and gathering
// the whole encoding in one string first made a memory hit 18 us instead of
// 11.6 (24 layers). A test walks the IR's
// descriptors so a field added to graph.proto cannot be left out silently
// (tests/compiler/graph_digest_test.cc).
#pragma once

#include <string>

#include "neuron/compiler/graph.pb.h"

namespace neuron::compiler {

// Hex SHA-256 (64 characters).
std::string GraphDigest(const proto::Graph& graph);

// Hex SHA-256 of `bytes`.
std::string Sha256Hex(const std::string& bytes);

}  // namespace neuron::compiler
