/* A distributed hash table on an MPI window: the C + MPI twin of
 * examples/src/bin/dht.rs (same keys, hash, probing and output line).
 *
 *   mpicc -O2 -o dht_mpi examples/mpi/dht.c
 *   mpirun -np 4 ./dht_mpi [keys per rank] [slots per rank]
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int r, s;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &s);
    uint64_t rank = (uint64_t)r, size = (uint64_t)s;
    uint64_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 100000;
    uint64_t slots = argc > 2 ? strtoull(argv[2], NULL, 10) : 2 * n + 1;

    uint64_t *table;
    MPI_Win win;
    MPI_Win_allocate((MPI_Aint)(slots * 16), 8, MPI_INFO_NULL, MPI_COMM_WORLD, &table, &win);
    memset(table, 0, slots * 16);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Win_lock_all(0, win);

    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    for (uint64_t i = 0; i < n; i++) {
        uint64_t k = rank * n + i + 1, zero = 0, old, v = 3 * k;
        int owner = (int)(mix(k) % size);
        uint64_t slot = (mix(k) >> 32) % slots;
        for (;;) {
            MPI_Compare_and_swap(&k, &zero, &old, MPI_UINT64_T, owner, (MPI_Aint)(slot * 2), win);
            MPI_Win_flush(owner, win);
            if (old == 0 || old == k) {
                MPI_Put(&v, 1, MPI_UINT64_T, owner, (MPI_Aint)(slot * 2 + 1), 1, MPI_UINT64_T, win);
                MPI_Win_flush(owner, win);
                break;
            }
            slot = (slot + 1) % slots;
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    uint64_t sums[2] = {0, 0}; /* checksum, missing */
    for (uint64_t i = 0; i < n; i++) {
        uint64_t k = rank * n + i + 1, entry[2];
        int owner = (int)(mix(k) % size);
        uint64_t slot = (mix(k) >> 32) % slots;
        for (;;) {
            MPI_Get(entry, 2, MPI_UINT64_T, owner, (MPI_Aint)(slot * 2), 2, MPI_UINT64_T, win);
            MPI_Win_flush(owner, win);
            if (entry[0] == k) {
                sums[0] += entry[1];
                break;
            }
            if (entry[0] == 0) {
                sums[1]++;
                break;
            }
            slot = (slot + 1) % slots;
        }
    }
    double secs = MPI_Wtime() - start, slowest;
    MPI_Reduce(&secs, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    uint64_t total[2];
    MPI_Reduce(sums, total, 2, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
    if (r == 0) {
        double ops = 2.0 * (double)(n * size);
        printf("dht ranks %llu keys %llu slots %llu checksum %llu missing %llu time %.4f s rate %.3f Mops/s\n",
               (unsigned long long)size, (unsigned long long)n, (unsigned long long)slots,
               (unsigned long long)total[0], (unsigned long long)total[1], slowest, ops / slowest / 1e6);
    }
    MPI_Win_unlock_all(win);
    MPI_Win_free(&win);
    MPI_Finalize();
    return 0;
}
