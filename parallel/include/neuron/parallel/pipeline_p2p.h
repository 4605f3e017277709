// Point-to-point messages between pipeline stages: an activation (forward)
// or a gradient (backward) of one microbatch, sent with a header that
// carries what it is, its shape and its dtype, and checked on arrival.
// Each message has its own tag (kind, microbatch, virtual stage), so stages
// may send and receive in any order their schedules produce.
//
//   auto works = SendStageTensor(group, next, y, {false, mb, vs + 1});
//   at::Tensor x = RecvStageTensor(group, prev, {false, mb, vs}, {});
#pragma once

#include <ATen/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <optional>
#include <string>
#include <vector>

namespace c10d {
class ProcessGroup;
class Work;
}  // namespace c10d

namespace neuron::parallel {

struct StageMessage {
  bool gradient = false;  // else an activation
  int microbatch = 0;
  int virtual_stage = 0;  // the receiving virtual stage
};

// Sends `tensor` (any dtype, up to 8 dims) to group rank `dst`; the works
// must be waited for (or kept) until the peer received.
std::vector<c10::intrusive_ptr<::c10d::Work>> SendStageTensor(::c10d::ProcessGroup& group,
                                                              int dst, const at::Tensor& tensor,
                                                              StageMessage message);

// Receives the message `expected` from group rank `src`. With
// `expected_like` (a gradient: the output it belongs to), its shape and
// dtype must match: InvalidUsage naming the stage, the microbatch and both
// shapes otherwise.
at::Tensor RecvStageTensor(::c10d::ProcessGroup& group, int src, StageMessage expected,
                           const std::optional<at::Tensor>& expected_like);

}  // namespace neuron::parallel
