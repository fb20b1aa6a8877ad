/*
 * startup_mpi: the Open MPI side of ci/bench/startup.sh, the same steps as
 * examples/src/bin/startup.rs: MPI_Init, a barrier and an 8-byte
 * allreduce, timed from the start of main on every rank; rank 0 prints
 * the slowest rank's times as JSON.
 *
 *   mpicc -O2 -o target/bench/startup_mpi ci/bench/startup_mpi.c
 *   mpirun -np 16 target/bench/startup_mpi
 */
#include <mpi.h>
#include <stdio.h>
#include <time.h>

static double ms(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0->tv_sec) * 1e3 + (t.tv_nsec - t0->tv_nsec) / 1e6;
}

int main(int argc, char **argv)
{
    struct timespec t0;
    double one = 1.0, sum = 0.0, mine[2], slowest[2];
    int rank, size;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    MPI_Init(&argc, &argv);
    mine[0] = ms(&t0);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Allreduce(&one, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    if (sum != size)
        MPI_Abort(MPI_COMM_WORLD, 1);
    mine[1] = ms(&t0);
    MPI_Allreduce(mine, slowest, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0)
        printf("{\"tool\":\"startup_mpi\",\"ranks\":%d,\"init_ms\":%.1f,\"total_ms\":%.1f}\n", size, slowest[0], slowest[1]);
    MPI_Finalize();
    return 0;
}
