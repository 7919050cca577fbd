/*
 * memcpy_bw.c - single-core memcpy bandwidth, the physical reference for vs-openmpi.sh.
 *
 * Copies SIZE bytes (default 256 MiB) REPS times (default 10) between two pre-touched buffers
 * on one thread and prints bytes copied per second (each byte is read once and written once,
 * so DRAM traffic is about twice this figure):
 *   memcpy  bytes  reps  best_GB/s  median_GB/s
 *
 * Build: cc -O2 -o memcpy_bw bench/peer/memcpy_bw.c
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"

int main(int argc, char **argv)
{
    size_t size = (argc > 1) ? strtoull(argv[1], NULL, 0) : (size_t)256 << 20;
    int reps = (argc > 2) ? atoi(argv[2]) : 10;
    if (size == 0 || reps < 1) { fprintf(stderr, "usage: %s [bytes] [reps]\n", argv[0]); return 2; }
    char *src = malloc(size), *dst = malloc(size);
    double *gbs = malloc(sizeof(double) * reps);
    if (!src || !dst || !gbs) { fprintf(stderr, "out of memory\n"); return 3; }
    memset(src, 1, size);
    memset(dst, 2, size);
    memcpy(dst, src, size); /* warm-up */
    for (int r = 0; r < reps; r++) {
        src[(size_t)r % size] = (char)r; /* keep the copy observable */
        double t0 = now();
        memcpy(dst, src, size);
        double t = now() - t0;
        gbs[r] = (double)size / 1e9 / t;
    }
    if (dst[0] != src[0]) { fprintf(stderr, "memcpy mismatch\n"); return 7; }
    qsort(gbs, reps, sizeof(double), cmp);
    printf("memcpy %zu %d %.2f %.2f\n", size, reps, gbs[reps - 1], gbs[reps / 2]);
    free(src); free(dst); free(gbs);
    return 0;
}
