/* What the MPI programs of ci/bench/ share: the usage exit and the number
 * parser for their options. */
#ifndef FABRIC_MSG_BENCH_ARGS_H
#define FABRIC_MSG_BENCH_ARGS_H

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

/* On rank 0, say what is wrong and how to call `prog`; end MPI. Returns
 * the exit status (2). */
static int bench_usage(int rank, const char *prog, const char *usage, const char *what)
{
    if (rank == 0)
        fprintf(stderr, "%s: %s\nusage: %s %s\n", prog, what, prog, usage);
    MPI_Finalize();
    return 2;
}

/* A non-negative decimal number, or -1 if `s` is not one. */
static long bench_number(const char *s)
{
    char *end;
    long v;
    if (*s == '\0')
        return -1;
    v = strtol(s, &end, 10);
    return (*end != '\0' || v < 0) ? -1 : v;
}

#endif
