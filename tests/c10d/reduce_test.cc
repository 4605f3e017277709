// Every reduction of the neuron process group, every dtype and reduce op,
// against a reference computed here in float64/int64 from small integers
// (exact in every dtype, so the comparison is bitwise).
#include <gtest/gtest.h>

#include "group_threads.h"

namespace neuron::c10d {
namespace {

using testing::RunGroup;
using RedOp = ::c10d::ReduceOp;

const std::vector<at::ScalarType> kTypes = {at::kFloat,    at::kDouble, at::kHalf,
                                            at::kBFloat16, at::kChar,   at::kByte,
                                            at::kInt,      at::kLong,   at::kBool};

bool IsFloat(at::ScalarType t) { return at::isFloatingType(t); }

bool Supported(at::ScalarType t, RedOp::RedOpType op) {
  const bool bitwise = op == RedOp::BAND || op == RedOp::BOR || op == RedOp::BXOR;
  if (bitwise) return !IsFloat(t);
  return !(op == RedOp::AVG && t == at::kBool);
}

// Rank r's input, as int64: chosen so every reduction stays exact.
at::Tensor Input(int64_t n, int rank, int size, RedOp::RedOpType op,
                 at::ScalarType type) {
  at::Tensor i = at::arange(n, at::kLong);
  at::Tensor x;
  switch (op) {
    case RedOp::PRODUCT:
      x = 1 + (i + rank) % 2;
      break;
    case RedOp::AVG:
      x = i % 7 + 1 + (rank == 0 ? size - 1 : -1);
      break;  // mean (i%7)+1
    case RedOp::BAND:
    case RedOp::BOR:
    case RedOp::BXOR:
      x = (i * 7 + rank * 13) % 64;
      break;
    default:
      x = (i * 3 + rank * 5) % 11;
      break;
  }
  if (type == at::kBool) x = x % 2;
  return x;
}

at::Tensor Reference(const std::vector<at::Tensor>& inputs, RedOp::RedOpType op,
                     at::ScalarType type) {
  at::Tensor all = at::stack(inputs);  // int64, [size, n]
  at::Tensor r;
  if (type == at::kBool) {
    at::Tensor b = all.to(at::kBool);
    switch (op) {
      case RedOp::SUM:
      case RedOp::MAX:
      case RedOp::BOR:
        r = b.any(0);
        break;
      case RedOp::PRODUCT:
      case RedOp::MIN:
      case RedOp::BAND:
        r = b.all(0);
        break;
      default:
        r = (all.sum(0) % 2).to(at::kBool);
        break;  // BXOR
    }
    return r;
  }
  switch (op) {
    case RedOp::SUM:
      r = all.sum(0);
      break;
    case RedOp::AVG:
      r = all.sum(0) / static_cast<int64_t>(inputs.size());
      break;
    case RedOp::PRODUCT:
      r = all.prod(0);
      break;
    case RedOp::MIN:
      r = std::get<0>(all.min(0));
      break;
    case RedOp::MAX:
      r = std::get<0>(all.max(0));
      break;
    case RedOp::BAND:
      r = all[0].clone();
      for (auto& x : inputs) r.bitwise_and_(x);
      break;
    case RedOp::BOR:
      r = all[0].clone();
      for (auto& x : inputs) r.bitwise_or_(x);
      break;
    default:
      r = at::zeros_like(all[0]);
      for (auto& x : inputs) r.bitwise_xor_(x);
      break;
  }
  return r.to(type);
}

const std::vector<RedOp::RedOpType> kOps = {RedOp::SUM, RedOp::AVG, RedOp::PRODUCT,
                                            RedOp::MIN, RedOp::MAX, RedOp::BAND,
                                            RedOp::BOR, RedOp::BXOR};

void ExpectBitwise(const at::Tensor& got, const at::Tensor& want,
                   const std::string& what) {
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << what;
  ASSERT_TRUE(at::equal(got, want))
      << what << "\n got " << got.slice(0, 0, 8) << "\n want " << want.slice(0, 0, 8);
}

TEST(BackendNeuron, AllReduceReduceAndReduceScatterMatchTheReference) {
  for (int size : {1, 3, 4}) {
    RunGroup(size, [size](BackendNeuron& pg, int rank) {
      for (at::ScalarType type : kTypes) {
        for (auto op : kOps) {
          if (!Supported(type, op)) continue;
          for (int64_t n : {0, 1, 1001}) {
            const std::string what = ::c10::str(c10::toString(type), " op ", int(op),
                                                " n ", n, " size ", size);
            std::vector<at::Tensor> inputs;
            for (int r = 0; r < size; ++r) inputs.push_back(Input(n, r, size, op, type));
            const at::Tensor want = Reference(inputs, op, type);
            // allreduce
            std::vector<at::Tensor> t = {
                inputs[rank].to(type, /*non_blocking=*/false, /*copy=*/true)};
            pg.allreduce(t, {RedOp(op)})->wait();
            ExpectBitwise(t[0], want, "allreduce " + what);
            // reduce to the last rank; the others keep their input
            std::vector<at::Tensor> u = {
                inputs[rank].to(type, /*non_blocking=*/false, /*copy=*/true)};
            ::c10d::ReduceOptions ro;
            ro.reduceOp = RedOp(op);
            ro.rootRank = size - 1;
            pg.reduce(u, ro)->wait();
            ExpectBitwise(u[0],
                          rank == size - 1 ? want
                                           : inputs[rank].to(type, /*non_blocking=*/false,
                                                             /*copy=*/true),
                          "reduce " + what);
            // reduce-scatter: every rank contributes `inputs` rotated, and
            // receives block `rank` (uneven blocks: block r has r+1 rows).
            std::vector<at::Tensor> blocks;
            std::vector<at::Tensor> wanted;
            for (int b = 0; b < size; ++b) {
              std::vector<at::Tensor> contributions;
              for (int r = 0; r < size; ++r)
                contributions.push_back(Input(n + b, r, size, op, type));
              blocks.push_back(contributions[rank].to(type, false, true));
              wanted.push_back(Reference(contributions, op, type));
            }
            std::vector<at::Tensor> out = {at::empty({n + rank}, type)};
            std::vector<std::vector<at::Tensor>> in = {blocks};
            pg.reduce_scatter(out, in, {RedOp(op)})->wait();
            ExpectBitwise(out[0], wanted[rank], "reduce_scatter " + what);
          }
        }
      }
    });
  }
}

TEST(BackendNeuron, TensorFormsOfReductionsMatchTheReference) {
  RunGroup(4, [](BackendNeuron& pg, int rank) {
    // _reduce_scatter_base: input of 4 blocks of 5.
    at::Tensor in = at::arange(20, at::kFloat) * (rank + 1);
    at::Tensor out = at::empty({5}, at::kFloat);
    pg._reduce_scatter_base(out, in, {})->wait();
    ExpectBitwise(out, at::arange(rank * 5, rank * 5 + 5, at::kFloat) * 10,
                  "_reduce_scatter_base");
    // allreduce_coalesced: several shapes, one dtype.
    std::vector<at::Tensor> ts = {at::full({2, 3}, rank + 1.0), at::full({5}, 2.0 * rank),
                                  at::empty({0})};
    pg.allreduce_coalesced(ts, {})->wait();
    ExpectBitwise(ts[0], at::full({2, 3}, 10.0), "coalesced 0");
    ExpectBitwise(ts[1], at::full({5}, 12.0), "coalesced 1");
    // Non-contiguous tensors are reduced and written back in place.
    at::Tensor base = at::arange(12, at::kFloat).reshape({3, 4}) + rank;
    std::vector<at::Tensor> view = {base.t()};
    ASSERT_FALSE(view[0].is_contiguous());
    pg.allreduce(view, {})->wait();
    ExpectBitwise(base, (at::arange(12, at::kFloat).reshape({3, 4}) * 4 + 6),
                  "strided allreduce");
    at::Tensor strided = at::zeros({10});
    std::vector<at::Tensor> every_other = {strided.slice(0, 0, 10, 2)};
    every_other[0].fill_(rank);
    pg.allreduce(every_other, {RedOp(RedOp::MAX)})->wait();
    ExpectBitwise(strided, at::tensor({3.f, 0.f, 3.f, 0.f, 3.f, 0.f, 3.f, 0.f, 3.f, 0.f}),
                  "strided slice");
  });
}

TEST(BackendNeuron, PreMulSumScalesEveryInputByItsFactorThenSums) {
  RunGroup(3, [](BackendNeuron& pg, int rank) {
    auto input = [](int r) { return at::linspace(-1, 2, 12) * (r + 1) + r; };
    // Reference: the inputs times the factor, summed in rank order.
    auto want = [&](double factor) {
      at::Tensor sum = input(0) * factor;
      for (int r = 1; r < 3; ++r) sum = sum + input(r) * factor;
      return sum;
    };
    for (const auto& op : {::c10d::makePreMulSum<double>(0.25),
                           ::c10d::makePreMulSum<at::Tensor>(at::scalar_tensor(0.25))}) {
      std::vector<at::Tensor> t{input(rank)};
      ::c10d::AllreduceOptions ao;
      ao.reduceOp = op;
      pg.allreduce(t, ao)->wait();
      EXPECT_TRUE(at::equal(t[0], want(0.25))) << "allreduce on rank " << rank;

      std::vector<at::Tensor> r{input(rank)};
      ::c10d::ReduceOptions ro;
      ro.reduceOp = op;
      ro.rootRank = 1;
      pg.reduce(r, ro)->wait();
      EXPECT_TRUE(at::equal(r[0], rank == 1 ? want(0.25) : input(rank))) << "reduce";

      at::Tensor in = input(rank), out = at::empty({4});
      ::c10d::ReduceScatterOptions so;
      so.reduceOp = op;
      pg._reduce_scatter_base(out, in, so)->wait();
      EXPECT_TRUE(at::equal(out, want(0.25).narrow(0, 4 * rank, 4))) << "reduce-scatter";
      EXPECT_TRUE(at::equal(in, input(rank))) << "the input is left as it was";
    }
    std::vector<at::Tensor> ints{at::ones({3}, at::kInt)};
    ::c10d::AllreduceOptions ao;
    ao.reduceOp = ::c10d::makePreMulSum<double>(2.0);
    try {
      pg.allreduce(ints, ao);
      ADD_FAILURE() << "an integer PREMUL_SUM was accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("PREMUL_SUM multiplies by a factor: it needs a "
                                           "floating-point dtype, got Int"),
                std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace neuron::c10d
