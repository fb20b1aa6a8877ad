/* The C + MPI twin of examples/src/bin/jacobi.rs: a 1-D Jacobi heat
 * stencil, halos exchanged with non-blocking messages every step, the
 * residual reduced every `check` steps, the field gathered to rank 0.
 * Prints the same line as the Rust program for the same arguments.
 *
 *   mpicc -O2 -o jacobi_mpi examples/mpi/jacobi.c
 *   mpirun -np 4 ./jacobi_mpi [cells per rank] [steps]
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    int steps = argc > 2 ? atoi(argv[2]) : 500;
    int check = 50;

    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int left = rank > 0 ? rank - 1 : MPI_PROC_NULL;
    int right = rank + 1 < size ? rank + 1 : MPI_PROC_NULL;

    /* u[0] and u[n + 1] are the halos; the rod's ends are held at 0 and 1. */
    double *u = calloc(n + 2, sizeof(double));
    double *next = calloc(n + 2, sizeof(double));
    if (!u || !next) {
        fprintf(stderr, "jacobi: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (right == MPI_PROC_NULL) {
        u[n + 1] = 1.0;
        next[n + 1] = 1.0;
    }
    double residual = INFINITY;
    for (int step = 1; step <= steps; step++) {
        MPI_Request reqs[4];
        MPI_Irecv(&u[0], 1, MPI_DOUBLE, left, 0, MPI_COMM_WORLD, &reqs[0]);
        MPI_Irecv(&u[n + 1], 1, MPI_DOUBLE, right, 1, MPI_COMM_WORLD, &reqs[1]);
        MPI_Isend(&u[1], 1, MPI_DOUBLE, left, 1, MPI_COMM_WORLD, &reqs[2]);
        MPI_Isend(&u[n], 1, MPI_DOUBLE, right, 0, MPI_COMM_WORLD, &reqs[3]);
        MPI_Waitall(4, reqs, MPI_STATUSES_IGNORE);
        double local = 0.0;
        for (int i = 1; i <= n; i++) {
            next[i] = 0.5 * (u[i - 1] + u[i + 1]);
            local += fabs(next[i] - u[i]);
        }
        double *t = u;
        u = next;
        next = t;
        if (step % check == 0)
            MPI_Allreduce(&local, &residual, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    }
    double *all = rank == 0 ? malloc((size_t)n * size * sizeof(double)) : NULL;
    MPI_Gather(&u[1], n, MPI_DOUBLE, all, n, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        double sum = 0.0;
        for (long i = 0; i < (long)n * size; i++)
            sum += all[i];
        printf("jacobi: %d ranks x %d cells, %d steps: sum %.12e residual %.6e\n", size, n, steps, sum, residual);
        free(all);
    }
    free(u);
    free(next);
    MPI_Finalize();
    return 0;
}
