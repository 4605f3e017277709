#include "neuron/collectives/reduce.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "neuron/collectives/half.h"
#include "neuron/runtime/error.h"

namespace neuron::collectives {

namespace {

// How one storage type is loaded into and stored from its accumulator type.
template <typename T>
struct Plain {
  using Storage = T;
  using Acc = T;
  static Acc Load(Storage v) { return v; }
  static Storage Store(Acc v) { return v; }
};
struct Half {
  using Storage = std::uint16_t;
  using Acc = float;
  static Acc Load(Storage v) { return HalfToFloat(v); }
  static Storage Store(Acc v) { return FloatToHalf(v); }
};
struct BFloat16 {
  using Storage = std::uint16_t;
  using Acc = float;
  static Acc Load(Storage v) { return BFloat16ToFloat(v); }
  static Storage Store(Acc v) { return FloatToBFloat16(v); }
};

// The reduce ops as function objects, so each kernel loop is specialised
// for one op and the compiler can vectorise it. Integer arithmetic wraps:
// it is done in the unsigned type of the same width.
template <typename A>
A WrapAdd(A a, A b) {
  using U = std::make_unsigned_t<A>;
  return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
}
template <typename A>
A WrapMul(A a, A b) {
  using U = std::make_unsigned_t<A>;
  return static_cast<A>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
}

struct SumOp {
  template <typename A> A operator()(A a, A b) const {
    if constexpr (std::is_floating_point_v<A>) return a + b; else return WrapAdd(a, b);
  }
};
struct ProductOp {
  template <typename A> A operator()(A a, A b) const {
    if constexpr (std::is_floating_point_v<A>) return a * b; else return WrapMul(a, b);
  }
};
struct MinOp {  // NaN-propagating, like torch.minimum
  template <typename A> A operator()(A a, A b) const {
    if constexpr (std::is_floating_point_v<A>) {
      return (a != a || b != b) ? std::numeric_limits<A>::quiet_NaN() : (b < a ? b : a);
    } else {
      return b < a ? b : a;
    }
  }
};
struct MaxOp {
  template <typename A> A operator()(A a, A b) const {
    if constexpr (std::is_floating_point_v<A>) {
      return (a != a || b != b) ? std::numeric_limits<A>::quiet_NaN() : (b > a ? b : a);
    } else {
      return b > a ? b : a;
    }
  }
};
struct BandOp { template <typename A> A operator()(A a, A b) const { return static_cast<A>(a & b); } };
struct BorOp { template <typename A> A operator()(A a, A b) const { return static_cast<A>(a | b); } };
struct BxorOp { template <typename A> A operator()(A a, A b) const { return static_cast<A>(a ^ b); } };

// Calls f(op functor) for `op`; bitwise ops only for integer accumulators.
template <typename A, typename F>
void WithOp(ReduceOp op, F&& f) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return f(SumOp{});
    case ReduceOp::kProduct: return f(ProductOp{});
    case ReduceOp::kMin: return f(MinOp{});
    case ReduceOp::kMax: return f(MaxOp{});
    default: break;
  }
  if constexpr (std::is_integral_v<A>) {
    switch (op) {
      case ReduceOp::kBand: return f(BandOp{});
      case ReduceOp::kBor: return f(BorOp{});
      case ReduceOp::kBxor: return f(BxorOp{});
      default: break;
    }
  }
  NEURON_ASSERT(false, "unchecked reduce op ", Name(op));
}

// bool as one byte 0/1, with c10d's mapping of the arithmetic ops.
std::uint8_t CombineBool(ReduceOp op, std::uint8_t a, std::uint8_t b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMax:
    case ReduceOp::kBor:
      return (a | b) ? 1 : 0;
    case ReduceOp::kProduct:
    case ReduceOp::kMin:
    case ReduceOp::kBand:
      return (a & b) ? 1 : 0;
    case ReduceOp::kBxor:
      return (a ^ b) ? 1 : 0;
    default:
      break;
  }
  NEURON_ASSERT(false, "unchecked bool reduce op ", Name(op));
}

// Elements per block: the accumulator of a block stays in L1.
constexpr std::size_t kBlock = 1024;

// A few elements (the small allreduces' common case): element by element,
// every input's element read before `out`'s is written, in the same order
// as the blocked loop below, without its accumulator array.
constexpr std::size_t kFewElements = 16;

template <typename Traits, typename Op>
void ReduceFewAs(Op op, const void* const* inputs, std::size_t n, void* out,
                 std::size_t count, std::size_t divisor, bool average) {
  using S = typename Traits::Storage;
  using A = typename Traits::Acc;
  for (std::size_t i = 0; i < count; ++i) {
    A a = Traits::Load(static_cast<const S*>(inputs[0])[i]);
    for (std::size_t k = 1; k < n; ++k) {
      a = op(a, Traits::Load(static_cast<const S*>(inputs[k])[i]));
    }
    if (average) a = static_cast<A>(a / static_cast<A>(divisor));
    static_cast<S*>(out)[i] = Traits::Store(a);
  }
}

template <typename Traits, typename Op>
void ReduceInputsAs(Op op, const void* const* inputs, std::size_t n, void* out,
                    std::size_t count, std::size_t divisor, bool average) {
  if (count <= kFewElements) {
    return ReduceFewAs<Traits>(op, inputs, n, out, count, divisor, average);
  }
  using S = typename Traits::Storage;
  using A = typename Traits::Acc;
  auto* o = static_cast<S*>(out);
  A acc[kBlock];
  // Block by block: every input of a block is read before the block of `out`
  // is written, so `out` may alias one of the inputs. Within a block the
  // inputs are combined strictly left to right.
  for (std::size_t start = 0; start < count; start += kBlock) {
    const std::size_t len = std::min(kBlock, count - start);
    const S* first = static_cast<const S*>(inputs[0]) + start;
    for (std::size_t i = 0; i < len; ++i) acc[i] = Traits::Load(first[i]);
    for (std::size_t k = 1; k < n; ++k) {
      const S* in = static_cast<const S*>(inputs[k]) + start;
      for (std::size_t i = 0; i < len; ++i) acc[i] = op(acc[i], Traits::Load(in[i]));
    }
    if (average) {
      const A d = static_cast<A>(divisor);
      for (std::size_t i = 0; i < len; ++i) acc[i] = static_cast<A>(acc[i] / d);
    }
    for (std::size_t i = 0; i < len; ++i) o[start + i] = Traits::Store(acc[i]);
  }
}

template <typename Traits, typename Op>
void AccumulateAs(Op op, void* inout, const void* in, std::size_t count) {
  using S = typename Traits::Storage;
  auto* a = static_cast<S*>(inout);
  const auto* b = static_cast<const S*>(in);
  for (std::size_t i = 0; i < count; ++i) {
    a[i] = Traits::Store(op(Traits::Load(a[i]), Traits::Load(b[i])));
  }
}

template <typename Traits>
void DivideAs(void* buffer, std::size_t count, std::size_t divisor) {
  using S = typename Traits::Storage;
  using A = typename Traits::Acc;
  auto* b = static_cast<S*>(buffer);
  const A d = static_cast<A>(divisor);
  for (std::size_t i = 0; i < count; ++i) {
    b[i] = Traits::Store(static_cast<A>(Traits::Load(b[i]) / d));
  }
}

// Calls f.template operator()<Traits>() for the traits of `type`.
template <typename F>
void Dispatch(DataType type, F&& f) {
  switch (type) {
    case DataType::kFloat32: return f(Plain<float>{});
    case DataType::kFloat64: return f(Plain<double>{});
    case DataType::kFloat16: return f(Half{});
    case DataType::kBFloat16: return f(BFloat16{});
    case DataType::kInt8: return f(Plain<std::int8_t>{});
    case DataType::kUInt8: return f(Plain<std::uint8_t>{});
    case DataType::kInt32: return f(Plain<std::int32_t>{});
    case DataType::kInt64: return f(Plain<std::int64_t>{});
    case DataType::kBool: break;
  }
  NEURON_ASSERT(false, "Dispatch of ", Name(type));
}

}  // namespace

void CheckReducible(DataType type, ReduceOp op, const char* op_name) {
  const bool bitwise =
      op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
  NEURON_CHECK(!(bitwise && IsFloatingPoint(type)), op_name, ": reduce op ", Name(op),
               " is not defined for ", Name(type), " (only integers and bool)");
  NEURON_CHECK(!(op == ReduceOp::kAvg && type == DataType::kBool), op_name,
               ": reduce op avg is not defined for bool");
}

void ReduceInputs(DataType type, ReduceOp op, const void* const* inputs,
                  std::size_t num_inputs, void* out, std::size_t count,
                  std::size_t avg_divisor) {
  CheckReducible(type, op, "reduce");
  NEURON_ASSERT(num_inputs > 0, "ReduceInputs without inputs");
  if (type == DataType::kBool) {
    auto* o = static_cast<std::uint8_t*>(out);
    for (std::size_t i = 0; i < count; ++i) {
      std::uint8_t acc = static_cast<const std::uint8_t*>(inputs[0])[i] ? 1 : 0;
      for (std::size_t k = 1; k < num_inputs; ++k) {
        acc = CombineBool(op, acc, static_cast<const std::uint8_t*>(inputs[k])[i] ? 1 : 0);
      }
      o[i] = acc;
    }
    return;
  }
  const bool average = op == ReduceOp::kAvg && avg_divisor > 0;
  Dispatch(type, [&](auto traits) {
    using T = decltype(traits);
    WithOp<typename T::Acc>(op, [&](auto f) {
      ReduceInputsAs<T>(f, inputs, num_inputs, out, count, avg_divisor, average);
    });
  });
}

void Accumulate(DataType type, ReduceOp op, void* inout, const void* in,
                std::size_t count) {
  CheckReducible(type, op, "reduce");
  if (type == DataType::kBool) {
    auto* a = static_cast<std::uint8_t*>(inout);
    const auto* b = static_cast<const std::uint8_t*>(in);
    for (std::size_t i = 0; i < count; ++i) a[i] = CombineBool(op, a[i] ? 1 : 0, b[i] ? 1 : 0);
    return;
  }
  Dispatch(type, [&](auto traits) {
    using T = decltype(traits);
    WithOp<typename T::Acc>(op, [&](auto f) { AccumulateAs<T>(f, inout, in, count); });
  });
}

void FinishAverage(DataType type, void* buffer, std::size_t count, std::size_t divisor) {
  NEURON_CHECK(type != DataType::kBool, "avg is not defined for bool");
  NEURON_ASSERT(divisor > 0, "average over zero contributions");
  Dispatch(type, [&](auto traits) { DivideAs<decltype(traits)>(buffer, count, divisor); });
}

}  // namespace neuron::collectives
