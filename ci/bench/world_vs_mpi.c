/*
 * world_vs_mpi: the Open MPI side of ci/bench/world_vs_mpi.sh.
 *
 * Times MPI_Barrier, MPI_Bcast (root 0, bytes), MPI_Allreduce and MPI_Scan
 * (MPI_FLOAT, MPI_SUM, separate send and receive buffers), MPI_Scatter (root
 * 0, bytes per rank) and MPI_Alltoall (bytes per pair) exactly as world_bench times
 * the World's collectives, which is how the OSU micro-benchmarks time them:
 * every call timed on its own, an untimed MPI_Barrier between calls (none
 * for barrier), WARMUP calls first; each rank's mean time per call is
 * gathered on rank 0, which prints one JSON object per size with the mean
 * over ranks (avg_us), the fastest (rank_min_us) and the slowest rank's
 * mean (rank_max_us), as `world_bench --json` does; and, also as it does,
 * the distribution of each call's slowest rank (p50_us, p99_us, p999_us,
 * min_us, max_us): every rank keeps its call times, and one MPI_Reduce
 * (MPI_MAX) after the timed loop finds each call's slowest rank.
 *
 *   mpicc -O2 -o target/bench/world_vs_mpi ci/bench/world_vs_mpi.c
 *   mpirun -np 4 target/bench/world_vs_mpi allreduce -S 8,65536 [-I 1000] [-W 100]
 *
 * Defaults as world_bench: 1000 iterations and 100 warm-up calls, 100 and
 * 10 above 8 KiB.
 */
#include "bench_args.h"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SIZES 64
#define LARGE 8192

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile of n sorted values (nearest rank). */
static double quantile(const double *sorted, long n, double q)
{
    long k = (long)(q * (double)n + 0.999999);
    if (k < 1)
        k = 1;
    return sorted[(k > n ? n : k) - 1];
}

static int fail(int rank, const char *what)
{
    return bench_usage(rank, "world_vs_mpi", "barrier|bcast|allreduce|scatter|alltoall|scan [-S SIZES] [-I ITERATIONS] [-W WARMUP]", what);
}

int main(int argc, char **argv)
{
    int rank, size, i, k, nsizes = 0, nonblocking = 0;
    long sizes[MAX_SIZES], iters_opt = -1, warm_opt = -1;
    const char *bench;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 2)
        return fail(rank, "name a benchmark");
    bench = argv[1];
    if (strcmp(bench, "barrier") && strcmp(bench, "bcast") && strcmp(bench, "allreduce") &&
        strcmp(bench, "scatter") && strcmp(bench, "alltoall") && strcmp(bench, "scan"))
        return fail(rank, "unknown benchmark");
    for (i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--nonblocking")) {
            /* MPI_Ibarrier, MPI_Ibcast, MPI_Iallreduce, each followed by
               MPI_Wait: world_bench's --by-value (barrier: ibarrier). */
            if (strcmp(bench, "barrier") && strcmp(bench, "bcast") && strcmp(bench, "allreduce"))
                return fail(rank, "--nonblocking: barrier, bcast or allreduce");
            nonblocking = 1;
            continue;
        }
        if (i + 1 >= argc)
            return fail(rank, "an option needs a value");
        if (!strcmp(argv[i], "-S")) {
            char *list = argv[++i], *tok;
            for (tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
                if (nsizes == MAX_SIZES || (sizes[nsizes] = bench_number(tok)) < 0)
                    return fail(rank, "-S: sizes in bytes, comma-separated, at most 64");
                nsizes++;
            }
        } else if (!strcmp(argv[i], "-I")) {
            if ((iters_opt = bench_number(argv[++i])) < 1)
                return fail(rank, "-I: at least one iteration");
        } else if (!strcmp(argv[i], "-W")) {
            if ((warm_opt = bench_number(argv[++i])) < 0)
                return fail(rank, "-W: a number of warm-up calls");
        } else {
            return fail(rank, "unknown option");
        }
    }
    if (!strcmp(bench, "barrier") || nsizes == 0) {
        nsizes = 1;
        sizes[0] = strcmp(bench, "barrier") ? 8 : 0;
    }
    if (rank == 0) {
        char version[MPI_MAX_LIBRARY_VERSION_STRING];
        int len, n;
        MPI_Get_library_version(version, &len);
        for (n = 0; n < len && version[n] != ',' && version[n] != '\n'; n++)
            ;
        printf("{\"tool\":\"world_vs_mpi\",\"benchmark\":\"%s\",\"ranks\":%d,\"mpi\":\"%.*s\"}\n", bench, size,
               n, version);
        fflush(stdout);
    }
    for (k = 0; k < nsizes; k++) {
        long bytes = sizes[k];
        long iters = iters_opt > 0 ? iters_opt : (bytes > LARGE ? 100 : 1000);
        long warm = warm_opt >= 0 ? warm_opt : (bytes > LARGE ? 10 : 100);
        int count = (int)(bytes / (long)sizeof(float));
        char *buf = calloc((size_t)bytes + 1, 1);
        char *blocks = calloc((size_t)bytes * (size_t)size + 1, 1), *got = calloc((size_t)bytes * (size_t)size + 1, 1);
        float *in = calloc((size_t)count + 1, sizeof(float));
        float *out = calloc((size_t)count + 1, sizeof(float));
        double total = 0.0, mine, *all = NULL;
        double *times = calloc((size_t)iters, sizeof(double)), *slowest = calloc((size_t)iters, sizeof(double));
        if (!buf || !blocks || !got || !in || !out || !times || !slowest) {
            fprintf(stderr, "world_vs_mpi: out of memory for %ld bytes\n", bytes);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        for (i = 0; i < warm + iters; i++) {
            double t0 = MPI_Wtime();
            MPI_Request req;
            if (nonblocking && !strcmp(bench, "barrier")) {
                MPI_Ibarrier(MPI_COMM_WORLD, &req);
                MPI_Wait(&req, MPI_STATUS_IGNORE);
            } else if (nonblocking && !strcmp(bench, "bcast")) {
                MPI_Ibcast(buf, (int)bytes, MPI_CHAR, 0, MPI_COMM_WORLD, &req);
                MPI_Wait(&req, MPI_STATUS_IGNORE);
            } else if (nonblocking) {
                MPI_Iallreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
                MPI_Wait(&req, MPI_STATUS_IGNORE);
            } else if (!strcmp(bench, "barrier"))
                MPI_Barrier(MPI_COMM_WORLD);
            else if (!strcmp(bench, "bcast"))
                MPI_Bcast(buf, (int)bytes, MPI_CHAR, 0, MPI_COMM_WORLD);
            else if (!strcmp(bench, "scatter"))
                MPI_Scatter(blocks, (int)bytes, MPI_CHAR, got, (int)bytes, MPI_CHAR, 0, MPI_COMM_WORLD);
            else if (!strcmp(bench, "alltoall"))
                MPI_Alltoall(blocks, (int)bytes, MPI_CHAR, got, (int)bytes, MPI_CHAR, MPI_COMM_WORLD);
            else if (!strcmp(bench, "scan"))
                MPI_Scan(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            else
                MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            if (i >= warm) {
                double took = MPI_Wtime() - t0;
                total += took;
                times[i - warm] = took * 1e6;
            }
            if (strcmp(bench, "barrier"))
                MPI_Barrier(MPI_COMM_WORLD);
        }
        mine = total * 1e6 / (double)iters;
        MPI_Reduce(times, slowest, (int)iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0)
            all = malloc(sizeof(double) * (size_t)size);
        MPI_Gather(&mine, 1, MPI_DOUBLE, all, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            double sum = 0.0, lo = all[0], hi = all[0];
            for (i = 0; i < size; i++) {
                sum += all[i];
                lo = all[i] < lo ? all[i] : lo;
                hi = all[i] > hi ? all[i] : hi;
            }
            qsort(slowest, (size_t)iters, sizeof(double), by_value);
            printf("{\"bytes\":%ld,\"avg_us\":%.3f,\"rank_min_us\":%.3f,\"rank_max_us\":%.3f,\"iterations\":%ld,"
                   "\"p50_us\":%.3f,\"p99_us\":%.3f,\"p999_us\":%.3f,\"min_us\":%.3f,\"max_us\":%.3f}\n",
                   bytes, sum / size, lo, hi, iters, quantile(slowest, iters, 0.5), quantile(slowest, iters, 0.99),
                   quantile(slowest, iters, 0.999), slowest[0], slowest[iters - 1]);
            fflush(stdout);
            free(all);
        }
        free(times);
        free(slowest);
        free(buf);
        free(blocks);
        free(got);
        free(in);
        free(out);
    }
    MPI_Finalize();
    return 0;
}
