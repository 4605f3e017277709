// Communicator::AllReduce: the call's checks, the tuner's choice, the
// handshake (which carries a small direct allreduce's data, and a large
// one's registered buffer), then the algorithm.
#include <algorithm>
#include <cstring>
#include <memory>

#include "algorithms.h"
#include "communicator_internal.h"
#include "handshake.h"
#include "hierarchy.h"
#include "neuron/collectives/communicator.h"
#include "neuron/collectives/reduce.h"
#include "neuron/collectives/transport/shared_buffers.h"
#include "neuron/runtime/error.h"

namespace neuron::collectives {

using detail::OpCode;

void Communicator::AllReduce(const AllReduceOptions& o) {
  CheckReducible(o.dtype, o.op, "allreduce");
  NEURON_CHECK(o.data != nullptr || o.count == 0, "allreduce: data is null");
  detail::Header h = NewHeader(OpCode::kAllReduce, o.dtype, o.count, o.op);
  const std::size_t bytes = o.count * ElementSize(o.dtype);
  const Algorithm algorithm = tuner_.AllReduce(o.algorithm, bytes, o.count, shape());
  h.algorithm = static_cast<std::uint8_t>(algorithm);  // all ranks must agree
  char* data = static_cast<char*>(o.data);
  const bool direct = algorithm == Algorithm::kDirect && size_ > 1;
  const bool small =
      direct && bytes <= std::min(tuner_.small_message_bytes(), WindowDataBytes());
  // Data that fits the windows is staged with the header: one phase fewer;
  // data that fits a header slot goes with the header itself.
  const bool staged = direct && bytes <= WindowDataBytes();
  // Ranks with other options must not mix paths: the header says which.
  h.path = !small                          ? detail::kPathAlgorithm
           : bytes <= detail::kTinyBytes   ? detail::kPathHeaderLine
           : bytes <= detail::kInlineBytes ? detail::kPathHeaderSlot
                                           : detail::kPathStaged;
  h.model_bytes = static_cast<double>(bytes);
  // A large direct allreduce shows every rank where its buffer lives when
  // it is registered (SharedBufferPool): when all are, nothing is staged.
  const bool sliced = direct && !small;
  transport::SharedRegion region;
  if (sliced) {
    if (auto found = transport::SharedBufferPool::Instance().Find(data, bytes))
      region = *found;
  }
  const bool stage = staged && region.fd < 0;
  const detail::Agreed agreed =
      Handshake(h, stage ? data : nullptr, stage ? bytes : 0, sliced ? &region : nullptr,
                sliced ? sizeof(region) : 0);
  const OpScope scope(*this, h, agreed);
  if (size_ == 1 || o.count == 0) {
    if (o.op == ReduceOp::kAvg && o.count > 0) FinishAverage(o.dtype, o.data, o.count, 1);
    return;
  }
  RunAllReduce(algorithm, h, data, staged);
}

void Communicator::RunAllReduce(Algorithm algorithm, const detail::Header& h, char* data,
                                bool staged) {
  const Label what = detail::Handshake::Describing(h);
  const std::size_t count = h.count;
  switch (algorithm) {
    case Algorithm::kRing:
      RingAllReduce(*this, data, count, h.dtype, h.reduce, what);
      return;
    case Algorithm::kRecursiveDoubling:
      RecursiveDoublingAllReduce(*this, data, count, h.dtype, h.reduce, what);
      return;
    case Algorithm::kRabenseifner:
      RabenseifnerAllReduce(*this, data, count, h.dtype, h.reduce, what);
      return;
    case Algorithm::kHierarchical:
      hierarchy_->AllReduce(data, count, h.dtype, h.reduce);
      return;
    default:
      if (h.path != detail::kPathAlgorithm) {
        SmallDirectAllReduce(data, count, h.dtype, h.reduce, h.path);
        return;
      }
      bool none_registered = false;
      if (!TryRegisteredAllReduce(data, count, h.dtype, h.reduce, what,
                                  &none_registered)) {
        // Staged by the handshake only if every rank staged.
        DirectAllReduce(*this, data, count, h.dtype, h.reduce, what,
                        staged && none_registered);
      }
      return;
  }
}

void Communicator::SmallDirectAllReduce(char* data, std::size_t count, DataType dtype,
                                        ReduceOp op, std::uint8_t path) {
  window_inputs_.resize(static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    window_inputs_[static_cast<std::size_t>(r)] =
        r == rank_ ? data  // unchanged; its shared copy may not be out yet
        : path == detail::kPathHeaderLine
            ? static_cast<const void*>(handshake_->TinyData(r))
        : path == detail::kPathHeaderSlot ? handshake_->InlineData(r)
                                          : WindowData(r);
  }
  DirectAllReduceFrom(*this, window_inputs_.data(), data, count, dtype, op,
                      path == detail::kPathStaged);
}

bool Communicator::TryRegisteredAllReduce(char* data, std::size_t count, DataType dtype,
                                          ReduceOp op, const Label& what,
                                          bool* none_registered) {
  // As every rank published them with its header.
  std::vector<transport::SharedRegion> regions(static_cast<std::size_t>(size_));
  int registered = 0;
  for (int r = 0; r < size_; ++r) {
    std::memcpy(&regions[r], handshake_->InlineData(r), sizeof(transport::SharedRegion));
    registered += regions[r].fd >= 0 ? 1 : 0;
  }
  *none_registered = registered == 0;
  if (registered < size_) return false;
  if (peer_buffers_ == nullptr)
    peer_buffers_ = std::make_unique<transport::PeerBufferMap>();
  RegisteredAllReduce(*this, *peer_buffers_, regions.data(), data, count, dtype, op,
                      what);
  registered_op_ = true;
  return true;
}

}  // namespace neuron::collectives
