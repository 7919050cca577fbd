/*
 * mpi_allreduce.c - busbw's own MPI_Allreduce peer benchmark.
 *
 * float32 sum over MPI_COMM_WORLD, sizes from -b to -e (bytes, count = bytes/4) multiplied by -f,
 * -n timed iterations and -w warmup iterations per size.  Per size: barrier, time n iterations
 * with MPI_Wtime, mean per-op time on each rank, MAX over ranks.  -r WINDOW moves iteration k's
 * buffers by bytes * (k mod floor(WINDOW/bytes)), as busbw's --rotate does (default 0: the
 * buffers never move), so both sides run from the same caches.  Then one more call whose
 * result is checked element by element (inputs are small integers, so the sum is exact);
 * any wrong element fails the run with exit 7.  -i 1 measures in place as well, after out of
 * place, as nccl-tests' rows do: MPI_IN_PLACE on the receive buffer, which each call leaves
 * holding the sum (the values grow from call to call, as in nccl-tests' in-place loop), then
 * checked the same way from a fresh copy of the input.
 *
 * Rank 0 prints:  bytes  count  time_us  algbw  busbw  wrong  [ip_time_us ip_algbw ip_busbw ip_wrong]
 *   algbw = bytes / 1e9 / time_s,  busbw = algbw * 2(n-1)/n   (nccl-tests arithmetic)
 *
 * Build: mpicc -O2 -o mpi_allreduce bench/peer/mpi_allreduce.c
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ctype.h>

static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (toupper((unsigned char)*end)) {
    case 'K': v *= 1024.0; break;
    case 'M': v *= 1024.0 * 1024.0; break;
    case 'G': v *= 1024.0 * 1024.0 * 1024.0; break;
    default: break;
    }
    return (size_t)v;
}

static void usage(const char *p)
{
    fprintf(stderr, "usage: %s [-b minbytes] [-e maxbytes] [-f factor] [-n iters] [-w warmup] [-r window] [-i 0|1]\n", p);
}

/* small integers: the sum over any realistic rank count is exact in float32 */
static float input(size_t i, int rank) { return (float)((i * 7u + (size_t)rank * 3u) % 16u); }

/* Mean time per operation of `iters` calls, the max over ranks; in place when `in_place`
 * (the receive buffer is the input then). Iteration k moves the buffers by k mod `positions`
 * counts, as busbw's --rotate. */
static double timed(float *send, float *recv, size_t count, long iters, size_t positions,
                    int in_place)
{
    int icount = (int)count;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (long it = 0; it < iters; it++) {
        size_t off = count * ((size_t)it % positions);
        MPI_Allreduce(in_place ? MPI_IN_PLACE : (void *)(send + off), recv + off, icount,
                      MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    double mine = (MPI_Wtime() - t0) / (double)iters, t;
    MPI_Allreduce(&mine, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return t;
}

/* One more call, checked element by element against the exact sum: wrong elements over all
 * ranks. In place, the receive buffer is first refilled with this rank's input. */
static long checked(float *send, float *recv, size_t count, int rank, int nranks, int in_place)
{
    for (size_t i = 0; i < count; i++) recv[i] = in_place ? input(i, rank) : -1.0f;
    MPI_Allreduce(in_place ? MPI_IN_PLACE : (void *)send, recv, (int)count, MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
    long wrong = 0, allwrong = 0;
    for (size_t i = 0; i < count; i++) {
        float want = 0.0f;
        for (int r = 0; r < nranks; r++) want += input(i, r);
        if (recv[i] != want) wrong++;
    }
    MPI_Allreduce(&wrong, &allwrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    return allwrong;
}

int main(int argc, char **argv)
{
    size_t minb = 32u << 20, maxb = 32u << 20;
    double factor = 2.0;
    long iters = 20, warmup = 1;
    size_t window = 0;
    int both = 0;

    MPI_Init(&argc, &argv);
    int rank, nranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);

    for (int a = 1; a < argc; a++) {
        const char *o = argv[a];
        const char *v = (a + 1 < argc) ? argv[a + 1] : NULL;
        if (!v) { if (rank == 0) usage(argv[0]); MPI_Abort(MPI_COMM_WORLD, 2); }
        if (!strcmp(o, "-b")) minb = parse_size(v);
        else if (!strcmp(o, "-e")) maxb = parse_size(v);
        else if (!strcmp(o, "-f")) factor = atof(v);
        else if (!strcmp(o, "-n")) iters = atol(v);
        else if (!strcmp(o, "-w")) warmup = atol(v);
        else if (!strcmp(o, "-r")) window = parse_size(v);
        else if (!strcmp(o, "-i")) both = atoi(v);
        else { if (rank == 0) usage(argv[0]); MPI_Abort(MPI_COMM_WORLD, 2); }
        a++;
    }
    if (factor <= 1.0 || iters < 1 || warmup < 0 || minb > maxb || (both != 0 && both != 1)) {
        if (rank == 0) usage(argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }

    size_t maxcount = (maxb > window ? maxb : window) / sizeof(float);
    if (maxcount == 0) maxcount = 1;
    float *send = malloc(maxcount * sizeof(float));
    float *recv = malloc(maxcount * sizeof(float));
    if (!send || !recv) { fprintf(stderr, "rank %d: out of memory\n", rank); MPI_Abort(MPI_COMM_WORLD, 3); }
    for (size_t i = 0; i < maxcount; i++) { send[i] = input(i, rank); recv[i] = 0.0f; }

    if (rank == 0) {
        printf("# mpi_allreduce: float32 sum, nranks %d, iters %ld, warmup %ld, time = max over ranks of mean per op%s\n",
               nranks, iters, warmup, both ? ", out of place then in place" : "");
        printf("#%11s %12s %12s %9s %9s %7s", "bytes", "count", "time_us", "algbw", "busbw", "wrong");
        if (both)
            printf(" %12s %9s %9s %7s", "ip_time_us", "ip_algbw", "ip_busbw", "ip_wrong");
        printf("\n");
    }

    long total_wrong = 0;
    size_t bytes = minb;
    for (;;) {
        size_t count = bytes / sizeof(float);
        size_t positions = count ? window / (count * sizeof(float)) : 1;
        if (positions < 1) positions = 1;
        double t[2] = {0, 0};
        long wrong[2] = {0, 0};
        for (int ip = 0; ip <= both; ip++) {
            for (long w = 0; w < warmup; w++)
                MPI_Allreduce(ip ? MPI_IN_PLACE : (void *)send, recv, (int)count, MPI_FLOAT,
                              MPI_SUM, MPI_COMM_WORLD);
            t[ip] = timed(send, recv, count, iters, positions, ip);
            wrong[ip] = checked(send, recv, count, rank, nranks, ip);
            total_wrong += wrong[ip];
        }

        if (rank == 0) {
            printf("%12zu %12zu", bytes, count);
            for (int ip = 0; ip <= both; ip++) {
                double algbw = (double)bytes / 1e9 / t[ip];
                double busbw = algbw * 2.0 * (nranks - 1) / nranks;
                printf(" %12.2f %9.3f %9.3f %7ld", t[ip] * 1e6, algbw, busbw, wrong[ip]);
            }
            printf("\n");
            fflush(stdout);
        }

        size_t next = (size_t)((double)bytes * factor);
        if (next <= bytes || next > maxb) break;
        bytes = next;
    }

    if (rank == 0) printf("# total wrong: %ld %s\n", total_wrong, total_wrong ? "FAIL" : "OK");
    free(send);
    free(recv);
    MPI_Finalize();
    return total_wrong ? 7 : 0;
}
