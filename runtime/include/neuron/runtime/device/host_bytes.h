// HostBytes: a tensor's bytes on the host, as std::vector<std::uint8_t>
// but growing without zero-filling, as `new std::uint8_t[n]` would. The
// executor writes, or zeroes, every byte of a result it hands back
// (unwritten_reads.h), so a fill before that would be a wasted pass over
// every result.
//
//   HostBytes b(n);                  // n bytes, unset
//   HostBytes z(n, 0);               // n zero bytes
//   HostBytes c(v.begin(), v.end()); // a copy
#pragma once

#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace neuron::runtime {

// std::allocator whose value-initialization (resize(n), vector(n)) leaves
// trivial elements unset; construction with arguments is as usual.
template <typename T>
struct UninitializedAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() = default;
  template <typename U>
  UninitializedAllocator(const UninitializedAllocator<U>&) noexcept {}

  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

using HostBytes = std::vector<std::uint8_t, UninitializedAllocator<std::uint8_t>>;

}  // namespace neuron::runtime
