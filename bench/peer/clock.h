/*
 * clock.h - what every peer program times with: a monotonic clock in seconds, and the
 * comparison qsort needs for a median of doubles. Included by the single-file peers, which
 * each build with one cc command from bench/peer.
 */
#ifndef BUSBW_PEER_CLOCK_H
#define BUSBW_PEER_CLOCK_H
#include <time.h>

static inline double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
#endif
