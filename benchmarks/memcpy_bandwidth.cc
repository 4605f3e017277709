// Single-thread memcpy bandwidth, the ceiling the allreduce benchmark
// compares against: prints "memcpy <bytes> <GB/s>" (bytes copied per second,
// best of several runs, warm buffers).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  const std::size_t bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 64u << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 0;
  for (int run = 0; run < 10; ++run) {
    const auto start = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (bytes / s / 1e9 > best) best = bytes / s / 1e9;
    a[run] = b[bytes - 1 - run];  // keep the copies observable
  }
  std::printf("memcpy %zu %.3f\n", bytes, best);
  return 0;
}
