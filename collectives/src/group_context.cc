#include "neuron/collectives/group_context.h"

#include "wire.h"

namespace neuron::collectives {

transport::Deadline GroupContext::NewDeadline() const {
  return transport::Deadline::After(op_timeout_.count() > 0 ? op_timeout_ : timeout_);
}

void GroupContext::Exchange(int send_to, const void* send, std::size_t send_bytes,
                            int recv_from, void* recv, std::size_t recv_bytes,
                            const transport::Label& what) {
  const auto s = transport_->Isend(send_to, send, send_bytes);
  const auto r = transport_->Irecv(recv_from, recv, recv_bytes);
  transport_->Wait({s, r}, NewDeadline(), what);
}

char* GroupContext::WindowData(int rank) const {
  return windows_->Window(rank) + detail::kWindowDataOffset;
}

std::size_t GroupContext::WindowDataBytes() const {
  return windows_->window_bytes() - detail::kWindowDataOffset;
}

}  // namespace neuron::collectives
