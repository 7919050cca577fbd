/*
 * reduce_pattern.c - the direct AllReduce's memory traffic without its protocol: what the
 * machine allows for each of busbw's columns (roofline.sh, issue 40).
 *
 * NP processes (forked here, each timed pass started together at a shared barrier) each do
 * what one rank of the direct AllReduce of S bytes does to memory: read its slice (S/NP) of
 * NP inputs, sum them a block at a time (256 bytes, busbw's fused kernel: the block's sums
 * stay in registers and go to every output from there, while the next block's lines are
 * read), and write the sum into its slice of NP outputs. Streaming, it asks for the inputs'
 * lines 1 KiB ahead into L2, as busbw does. REDUCE_PATTERN_BLOCK=BYTES (a multiple of 64, at
 * most 16384) changes the block, summed through a scratch buffer in L1 instead: 16384 is
 * busbw's chunked path before 2026-12-05 (and still the narrow floats'). Through the scratch
 * buffer, 256-byte blocks streamed 256 MiB 16-26 % slower than from registers (2 processes,
 * 2026-12-05, three rounds alternating), which busbw's kernel does not pay.
 * Each process owns all its slices, so the job's footprint is busbw's (NP x S
 * in place, 2 x NP x S out of place) with no peer mapping and no flags, and the same buffers
 * every pass (busbw's --rotate 0). Three ways to write:
 *   ip      the outputs are the inputs (ordinary stores to lines just read)
 *   stream  separate outputs, non-temporal stores (busbw's out of place from 256 KiB)
 *   cached  separate outputs, ordinary stores (a read for ownership per line not cached)
 * Each way runs as a benchmark loop does: two untimed passes (the cache settles), then REPS
 * timed. Prints the median over passes of the slowest
 * process, in microseconds:
 *   pattern  bytes  ip_us  stream_us  cached_us
 *
 * Usage: reduce_pattern NP REPS SIZE...   (SIZE in bytes, the AllReduce's)
 * Build: cc -O3 -march=native -o reduce_pattern bench/peer/reduce_pattern.c -lpthread
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"

#define CHUNK 4096 /* floats: 16 KiB, the largest block */
#define AHEAD 256  /* floats: 1 KiB, busbw's prefetch distance */
#define MAXNP 64
#define MAXREPS 1000

struct shared {
    pthread_barrier_t bar;
    double secs[3][MAXREPS][MAXNP];
};

static void *region(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("reduce_pattern: mmap");
        exit(1);
    }
    memset(p, 1, bytes);
    return p;
}

/* Inline loops, not memcpy: a library call per 256-byte block costs more than the block. */
static void store(float *dst, const float *src, size_t n, int stream)
{
    size_t i = 0;
#ifdef __AVX512F__
    if (stream) {
        for (; i + 16 <= n; i += 16)
            _mm512_stream_ps(dst + i, _mm512_load_ps(src + i));
    } else {
        for (; i + 16 <= n; i += 16)
            _mm512_store_ps(dst + i, _mm512_load_ps(src + i));
    }
#else
    if (stream) {
        for (; i + 4 <= n; i += 4)
            _mm_stream_ps(dst + i, _mm_load_ps(src + i));
    } else {
        for (; i + 4 <= n; i += 4)
            _mm_store_ps(dst + i, _mm_load_ps(src + i));
    }
#endif
    for (; i < n; i++)
        dst[i] = src[i];
}

#if defined(__AVX512F__)
typedef __m512 vec;
#define VW 16
#define VLOAD _mm512_load_ps
#define VADD _mm512_add_ps
#define VSTORE _mm512_store_ps
#define VSTREAM _mm512_stream_ps
#elif defined(__AVX__)
typedef __m256 vec;
#define VW 8
#define VLOAD _mm256_load_ps
#define VADD _mm256_add_ps
#define VSTORE _mm256_store_ps
#define VSTREAM _mm256_stream_ps
#else
typedef __m128 vec;
#define VW 4
#define VLOAD _mm_load_ps
#define VADD _mm_add_ps
#define VSTORE _mm_store_ps
#define VSTREAM _mm_stream_ps
#endif
#define BLOCK_FLOATS 64 /* 256 bytes: four lines */

/* As busbw's streaming pass: the lines of the `len` floats AHEAD of `at` in every input asked
 * for into L2, where the slice of `per` floats still has them. */
static void prefetch_ahead(float **in, int np, size_t at, size_t len, size_t per)
{
    if (at + AHEAD + len >= per)
        return;
    for (int p = 0; p < np; p++)
        for (size_t l = 0; l < len; l += 16)
            _mm_prefetch((const char *)(in[p] + at + AHEAD + l), _MM_HINT_T1);
}

/* The default 256-byte block, as busbw's fused kernel: the block's sums stay in registers and
 * go to every output from there, so no scratch line is written and read back. Returns where
 * the whole blocks end. */
static size_t pass_regs(float **in, float **out, int np, size_t per, int stream)
{
    size_t at = 0;
    for (; at + BLOCK_FLOATS <= per; at += BLOCK_FLOATS) {
        if (stream)
            prefetch_ahead(in, np, at, BLOCK_FLOATS, per);
        vec v[BLOCK_FLOATS / VW];
        for (int k = 0; k < BLOCK_FLOATS / VW; k++)
            v[k] = VADD(VLOAD(in[0] + at + k * VW), VLOAD(in[1] + at + k * VW));
        for (int p = 2; p < np; p++)
            for (int k = 0; k < BLOCK_FLOATS / VW; k++)
                v[k] = VADD(v[k], VLOAD(in[p] + at + k * VW));
        for (int p = 0; p < np; p++) {
            if (stream)
                for (int k = 0; k < BLOCK_FLOATS / VW; k++)
                    VSTREAM(out[p] + at + k * VW, v[k]);
            else
                for (int k = 0; k < BLOCK_FLOATS / VW; k++)
                    VSTORE(out[p] + at + k * VW, v[k]);
        }
    }
    return at;
}

/* One rank's pass: its slice of `np` inputs summed into its slice of `np` outputs. */
static void pass(float **in, float **out, int np, size_t per, size_t block, int stream)
{
    static float acc[CHUNK] __attribute__((aligned(64)));
    size_t start = block == BLOCK_FLOATS ? pass_regs(in, out, np, per, stream) : 0;
    for (size_t at = start; at < per; at += block) {
        size_t len = per - at < block ? per - at : block;
        if (stream)
            prefetch_ahead(in, np, at, len, per);
        for (size_t i = 0; i < len; i++)
            acc[i] = in[0][at + i] + in[1][at + i];
        for (int p = 2; p < np; p++)
            for (size_t i = 0; i < len; i++)
                acc[i] += in[p][at + i];
        for (int p = 0; p < np; p++)
            store(out[p] + at, acc, len, stream);
    }
    _mm_sfence();
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: reduce_pattern NP REPS SIZE...\n");
        return 2;
    }
    int np = atoi(argv[1]), reps = atoi(argv[2]);
    const char *env = getenv("REDUCE_PATTERN_BLOCK");
    size_t block_bytes = env ? strtoull(env, NULL, 10) : 256;
    if (block_bytes < 64 || block_bytes > CHUNK * sizeof(float) || block_bytes % 64) {
        fprintf(stderr, "reduce_pattern: REDUCE_PATTERN_BLOCK is a multiple of 64 up to %zu\n",
                CHUNK * sizeof(float));
        return 2;
    }
    size_t block = block_bytes / sizeof(float);
    if (np < 2 || np > MAXNP || reps < 1 || reps > MAXREPS) {
        fprintf(stderr, "reduce_pattern: NP in 2..%d, REPS in 1..%d\n", MAXNP, MAXREPS);
        return 2;
    }
    struct shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        perror("reduce_pattern: mmap");
        return 1;
    }
    pthread_barrierattr_t attr;
    pthread_barrierattr_init(&attr);
    pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_barrier_init(&sh->bar, &attr, np);
    for (int a = 3; a < argc; a++) {
        size_t bytes = strtoull(argv[a], NULL, 10);
        /* Whole 64-byte lines per slice, as busbw's slices. */
        size_t per = ((bytes / sizeof(float) + np - 1) / np + 15) / 16 * 16;
        for (int r = 0; r < np; r++) {
            if (fork() == 0) {
                float *in[MAXNP], *out[MAXNP];
                for (int p = 0; p < np; p++) {
                    in[p] = region(per * sizeof(float));
                    out[p] = region(per * sizeof(float));
                }
                for (int way = 0; way < 3; way++) {
                    for (int rep = -2; rep < reps; rep++) {
                        pthread_barrier_wait(&sh->bar);
                        double t = now();
                        pass(in, way == 0 ? in : out, np, per, block, way == 1);
                        double dt = now() - t;
                        if (rep >= 0)
                            sh->secs[way][rep][r] = dt;
                    }
                }
                _exit(0);
            }
        }
        for (int r = 0; r < np; r++)
            wait(NULL);
        double med[3];
        for (int way = 0; way < 3; way++) {
            double slowest[MAXREPS];
            for (int rep = 0; rep < reps; rep++) {
                slowest[rep] = 0;
                for (int r = 0; r < np; r++)
                    if (sh->secs[way][rep][r] > slowest[rep])
                        slowest[rep] = sh->secs[way][rep][r];
            }
            qsort(slowest, reps, sizeof(double), cmp);
            med[way] = slowest[reps / 2] * 1e6;
        }
        printf("pattern %zu %.2f %.2f %.2f\n", bytes, med[0], med[1], med[2]);
        fflush(stdout);
    }
    return 0;
}
