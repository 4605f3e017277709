// The lane count of the executor's vector kernels (exp, exact GELU and its
// backward, the softmaxes, layer norm and their backward): the widest float
// vector the CPU holds in one register, 16 with AVX-512 (x86-64-v4), 8 with
// AVX2 (x86-64-v3), else 4. Elementwise results do not depend on it; a
// row's sums and maxima are added lane by lane, so their rounding does.
#pragma once

// 1 where the kernels are built as target clones for x86-64-v4, v3 and
// the default (GCC on x86-64 Linux), whose CPU check picks the lane count.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define NEURON_KERNEL_CLONES_BUILT 1
#else
#define NEURON_KERNEL_CLONES_BUILT 0
#endif

namespace neuron::runtime {

// The lane count in use: the one SetLaneWidth set, else the CPU's.
int LaneWidth();

// Sets the lane count for the whole process: 4, 8 or 16, or 0 for the
// CPU's own. Every count runs on every CPU (a vector wider than the
// registers is correct and slow), so tests run each kernel at each count.
// Throws InvalidUsage for any other value.
void SetLaneWidth(int lanes);

}  // namespace neuron::runtime
