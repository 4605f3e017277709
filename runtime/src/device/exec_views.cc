// The executor's data movement, as lower_views.cc lowers it: the DMA
// ops (load, store, spill, reload: `bytes` raw bytes of any dtype from
// input 0 to output 0, nothing when an elided copy left both in the same
// memory) and strided_copy (raw elements of any dtype, the same in and
// out, through a view of input 0 into output 0; strided_copy.h runs it).
#include "exec_kernels.h"

#include <cstring>
#include <utility>

#include "neuron/runtime/error.h"
#include "strided_copy.h"

namespace neuron::runtime::detail {

void RunDma(const proto::Instruction& i, const std::vector<Placed>& in,
            const std::vector<Placed>& out, const What& what) {
  NEURON_CHECK(in.size() == 1 && out.size() == 1, what,
               ": a DMA reads one buffer and writes one");
  NEURON_CHECK(i.bytes() <= in[0].buffer->bytes() && i.bytes() <= out[0].buffer->bytes(),
               what, ": moves ", i.bytes(), " bytes between buffers of ",
               in[0].buffer->bytes(), " and ", out[0].buffer->bytes());
  // The same memory when the copy was elided (elided_copies.h).
  if (out[0].data != in[0].data && i.bytes() > 0)
    std::memmove(out[0].data, in[0].data, i.bytes());
}

// strided_copy: raw elements of any dtype through a view (executor.h).
void RunStridedCopy(const proto::Instruction& i, const std::vector<Placed>& in,
                    const std::vector<Placed>& out, const What& what) {
  NEURON_CHECK(in.size() == 1 && out.size() == 1, what,
               ": strided_copy reads one buffer and writes one");
  NEURON_CHECK(in[0].buffer->dtype() == out[0].buffer->dtype(), what, ": copies ",
               proto::ElementType_Name(in[0].buffer->dtype()), " into ",
               proto::ElementType_Name(out[0].buffer->dtype()));
  const int rank = i.view_sizes_size();
  const bool contiguous_out = i.out_strides_size() == 0;
  NEURON_CHECK(
      i.in_strides_size() == rank && (contiguous_out || i.out_strides_size() == rank),
      what, ": ", rank, " view sizes, ", i.in_strides_size(), " input strides and ",
      i.out_strides_size(), " output strides");
  const std::size_t width = ElementBytes(in[0].buffer->dtype());
  // The largest element index each side touches must be inside its buffer.
  std::int64_t total = 1, in_last = i.in_offset(), out_last = i.out_offset();
  std::vector<std::int64_t> out_strides(rank);
  std::int64_t stride = 1;
  for (int d = rank - 1; d >= 0; --d) {
    const std::int64_t size = i.view_sizes(d);
    out_strides[d] = contiguous_out ? stride : i.out_strides(d);
    NEURON_CHECK(size >= 0 && i.in_strides(d) >= 0 && out_strides[d] >= 0, what,
                 ": negative size or stride");
    stride *= size;
    total *= size;
    if (size > 0) {
      in_last += (size - 1) * i.in_strides(d);
      out_last += (size - 1) * out_strides[d];
    }
  }
  if (total == 0) return;
  NEURON_CHECK(i.in_offset() >= 0 && i.out_offset() >= 0 &&
                   static_cast<std::size_t>(in_last) < in[0].elements() &&
                   static_cast<std::size_t>(out_last) < out[0].elements(),
               what, ": the view reaches element ", in_last, " of ", in[0].elements(),
               " (input) and ", out_last, " of ", out[0].elements(), " (output)");
  detail::View view{{i.view_sizes().begin(), i.view_sizes().end()},
                    {i.in_strides().begin(), i.in_strides().end()},
                    std::move(out_strides)};
  detail::CopyView(in[0].data + i.in_offset() * width,
                   out[0].data + i.out_offset() * width, width, view);
}

}  // namespace neuron::runtime::detail
