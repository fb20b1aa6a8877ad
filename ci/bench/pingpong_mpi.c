/*
 * pingpong_mpi: the Open MPI side of ci/bench/ab.sh's `peers` section.
 *
 * Two ranks, measured the way our `pingpong` and `bandwidth` measure:
 *
 *   latency  rank 0 sends SIZE bytes and waits for SIZE bytes back, ITERS
 *            times (blocking MPI_Send / MPI_Recv, the same tag); one-way
 *            microseconds = elapsed / ITERS / 2, as fi_pingpong's usec/xfer
 *            and ucx_perftest's tag_lat.
 *   rate     rank 0 keeps a window of WINDOW MPI_Isend in flight, rank 1 a
 *            window of MPI_Irecv; once rank 1 has the whole window it sends
 *            a 4-byte ack, which lets rank 0 send the next window (our
 *            `bandwidth` and OSU's bandwidth tests do the same). Messages
 *            per second and MB/sec (10^6 B/s, one way) = ITERS messages
 *            over the elapsed time.
 *
 * WARMUP untimed iterations (whole windows for `rate`) come first. Rank 0
 * prints one JSON line: {"bench", "bytes", "iters", "usec_per_xfer",
 * "msgs_per_sec", "mb_per_sec"}.
 *
 *   mpicc -O2 -o target/bench/pingpong_mpi ci/bench/pingpong_mpi.c
 *   mpirun -np 2 target/bench/pingpong_mpi latency -S 8 -I 10000 [-W 1000]
 *   mpirun -np 2 target/bench/pingpong_mpi rate -S 8 -I 1000000 [-w 64] [-W 6400]
 */
#include "bench_args.h"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage(int rank, const char *what)
{
    return bench_usage(rank, "pingpong_mpi", "latency|rate -S BYTES -I ITERS [-W WARMUP] [-w WINDOW]", what);
}

/* ITERS round trips of SIZE bytes from rank 0; returns the elapsed seconds on rank 0. */
static double latency(int rank, char *buf, long size, long iters)
{
    double t0 = MPI_Wtime();
    for (long i = 0; i < iters; i++) {
        if (rank == 0) {
            MPI_Send(buf, (int)size, MPI_CHAR, 1, 1, MPI_COMM_WORLD);
            MPI_Recv(buf, (int)size, MPI_CHAR, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(buf, (int)size, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, (int)size, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
        }
    }
    return MPI_Wtime() - t0;
}

/* ITERS messages in windows of WINDOW, one ack per window; elapsed seconds on rank 0. */
static double rate(int rank, char *buf, long size, long iters, long window, MPI_Request *req)
{
    int ack = 0;
    double t0 = MPI_Wtime();
    for (long done = 0; done < iters; done += window) {
        long n = iters - done < window ? iters - done : window;
        for (long j = 0; j < n; j++) {
            /* Each message of a window has its own slot of the buffer. */
            char *slot = buf + j * size;
            if (rank == 0)
                MPI_Isend(slot, (int)size, MPI_CHAR, 1, 2, MPI_COMM_WORLD, &req[j]);
            else
                MPI_Irecv(slot, (int)size, MPI_CHAR, 0, 2, MPI_COMM_WORLD, &req[j]);
        }
        MPI_Waitall((int)n, req, MPI_STATUSES_IGNORE);
        if (rank == 0)
            MPI_Recv(&ack, 1, MPI_INT, 1, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        else
            MPI_Send(&ack, 1, MPI_INT, 0, 3, MPI_COMM_WORLD);
    }
    return MPI_Wtime() - t0;
}

int main(int argc, char **argv)
{
    int rank, nranks, is_rate;
    long size = -1, iters = -1, warmup = -1, window = 64;
    double secs;
    char *buf;
    MPI_Request *req;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (nranks != 2)
        return usage(rank, "run with exactly 2 ranks");
    if (argc < 2 || (strcmp(argv[1], "latency") && strcmp(argv[1], "rate")))
        return usage(rank, "name a benchmark: latency or rate");
    is_rate = strcmp(argv[1], "rate") == 0;
    for (int i = 2; i < argc; i += 2) {
        long v;
        if (i + 1 >= argc)
            return usage(rank, "an option without its value");
        v = bench_number(argv[i + 1]);
        if (v < 0)
            return usage(rank, "a value that is not a number");
        if (!strcmp(argv[i], "-S"))
            size = v;
        else if (!strcmp(argv[i], "-I"))
            iters = v;
        else if (!strcmp(argv[i], "-W"))
            warmup = v;
        else if (!strcmp(argv[i], "-w"))
            window = v;
        else
            return usage(rank, "unknown option");
    }
    if (size < 1 || size > (1L << 30) || iters < 1 || window < 1)
        return usage(rank, "-S and -I are required and positive, -w is positive");
    if (warmup < 0)
        warmup = iters / 10;

    buf = malloc((size_t)size * (is_rate ? (size_t)window : 1));
    req = malloc(sizeof(*req) * (size_t)window);
    if (buf == NULL || req == NULL)
        return usage(rank, "out of memory");
    memset(buf, rank + 1, (size_t)size * (is_rate ? (size_t)window : 1));

    if (is_rate) {
        warmup = (warmup + window - 1) / window * window;
        if (warmup)
            rate(rank, buf, size, warmup, window, req);
        MPI_Barrier(MPI_COMM_WORLD);
        secs = rate(rank, buf, size, iters, window, req);
    } else {
        if (warmup)
            latency(rank, buf, size, warmup);
        MPI_Barrier(MPI_COMM_WORLD);
        secs = latency(rank, buf, size, iters);
    }

    if (rank == 0) {
        double xfers = is_rate ? (double)iters : 2.0 * (double)iters;
        printf("{\"bench\": \"%s\", \"bytes\": %ld, \"iters\": %ld, \"window\": %ld, "
               "\"usec_per_xfer\": %.4f, \"msgs_per_sec\": %.1f, \"mb_per_sec\": %.2f}\n",
               argv[1], size, iters, is_rate ? window : 1, secs * 1e6 / xfers, xfers / secs,
               xfers * (double)size / secs / 1e6);
        fflush(stdout);
    }
    free(req);
    free(buf);
    MPI_Finalize();
    return 0;
}
