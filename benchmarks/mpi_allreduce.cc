// MPI_Allreduce timing for the allreduce benchmark (the Open MPI peer):
//   mpirun -n 4 --oversubscribe --mca btl self,vader build/benchmarks/mpi_allreduce 8 1048576
// Prints one line per size: "mpi <bytes> <microseconds per op> <busbw GB/s>",
// the slowest rank's average over the iterations (100000 after 1000 warm-up for
// sizes up to 64 KiB, else 256 MiB worth, 5 to 50, after 2), float32 sum.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  for (int a = 1; a < argc; ++a) {
    const std::size_t bytes = std::strtoull(argv[a], nullptr, 10);
    const bool small = bytes <= (64u << 10);
    const int iterations =
        small ? 100000 : static_cast<int>(std::clamp<std::size_t>((256u << 20) / bytes, 5, 50));
    const int warmup = small ? 1000 : 2;
    const std::size_t count = bytes < 4 ? 1 : bytes / 4;
    std::vector<float> data(count, static_cast<float>(rank + 1));
    for (int i = 0; i < warmup; ++i) {
      MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    for (int i = 0; i < iterations; ++i) {
      MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
    }
    double us = (MPI_Wtime() - start) / iterations * 1e6;
    MPI_Allreduce(MPI_IN_PLACE, &us, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) {
      const double busbw = count * 4.0 / us / 1e3 * 2.0 * (size - 1) / size;
      std::printf("mpi %zu %.3f %.3f\n", count * 4, us, busbw);
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
