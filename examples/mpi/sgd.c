/* Data-parallel training's gradient allreduce: the C + MPI twin of
 * examples/src/bin/sgd.rs (same model, buckets, order and output line).
 *
 *   mpicc -O2 -o sgd_mpi examples/mpi/sgd.c -lm
 *   mpirun -np 4 ./sgd_mpi [parameters] [steps] [buckets]
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Rank r's curvature a (in [0.5, 1.5)) and target b (in [-1, 1]) for
 * parameter i. */
static void coeffs(uint64_t r, uint64_t i, float *a, float *b) {
    uint64_t h = mix((r << 32) | i);
    *a = 0.5f + (float)(h % 1000) / 1000.0f;
    *b = (float)((h >> 20) % 2001) / 1000.0f - 1.0f;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    long p = argc > 1 ? atol(argv[1]) : 1L << 20;
    int steps = argc > 2 ? atoi(argv[2]) : 50;
    long buckets = argc > 3 ? atol(argv[3]) : 4;
    if (p < 1)
        p = 1;
    if (buckets < 1)
        buckets = 1;
    if (buckets > p)
        buckets = p;
    const float lr = 0.5f;

    float *a = malloc(p * sizeof(float)), *b = malloc(p * sizeof(float));
    float *w = calloc(p, sizeof(float)), *g = malloc(p * sizeof(float));
    MPI_Request *reqs = malloc(buckets * sizeof(MPI_Request));
    if (!a || !b || !w || !g || !reqs) {
        fprintf(stderr, "sgd: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (long i = 0; i < p; i++)
        coeffs((uint64_t)rank, (uint64_t)i, &a[i], &b[i]);
    long chunk = (p + buckets - 1) / buckets;

    MPI_Barrier(MPI_COMM_WORLD);
    double started = MPI_Wtime();
    double loss = NAN;
    for (int step = 1; step <= steps; step++) {
        /* Backward pass: the last bucket's gradient is ready first, and
         * each bucket's sum starts as soon as its gradient is there. */
        for (long k = buckets - 1; k >= 0; k--) {
            long lo = k * chunk, hi = (k + 1) * chunk < p ? (k + 1) * chunk : p;
            for (long i = lo; i < hi; i++)
                g[i] = a[i] * (w[i] - b[i]);
            MPI_Iallreduce(MPI_IN_PLACE, g + lo, (int)(hi > lo ? hi - lo : 0), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                           &reqs[buckets - 1 - k]);
        }
        MPI_Waitall((int)buckets, reqs, MPI_STATUSES_IGNORE);
        for (long i = 0; i < p; i++)
            w[i] -= lr * g[i] / (float)size;
        if (step % 10 == 0 || step == steps) {
            double mine = 0.0;
            for (long i = 0; i < p; i++) {
                double d = (double)(w[i] - b[i]);
                mine += 0.5 * (double)a[i] * d * d;
            }
            MPI_Allreduce(&mine, &loss, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        }
    }
    double secs = MPI_Wtime() - started;

    /* Every rank must hold the same model. */
    double check = 0.0, lo, hi;
    for (long i = 0; i < p; i++)
        check += (double)w[i];
    MPI_Allreduce(&check, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&check, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) {
        double error = 0.0;
        for (long i = 0; i < p; i++) {
            double ab = 0.0, sa = 0.0;
            for (int r = 0; r < size; r++) {
                float ar, br;
                coeffs((uint64_t)r, (uint64_t)i, &ar, &br);
                ab += (double)ar * (double)br;
                sa += (double)ar;
            }
            double e = fabs((double)w[i] - ab / sa);
            if (e > error)
                error = e;
        }
        printf("sgd: %d ranks, %ld parameters in %ld buckets, %d steps: loss %.6e error %.1e same %s time %.3f "
               "ms/step\n",
               size, p, buckets, steps, loss, error, lo == hi ? "yes" : "no", secs * 1e3 / (steps > 0 ? steps : 1));
    }
    free(a);
    free(b);
    free(w);
    free(g);
    free(reqs);
    MPI_Finalize();
    return 0;
}
