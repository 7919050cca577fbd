/*
 * shm_exchange.c - the bare two-process exchange through shared memory: the floor under any
 * shared-memory collective of two ranks (issue 40's roofline).
 *
 * Two processes (fork) share one anonymous mapping with a mailbox and two counters per
 * direction. Each exchange, both at once: copy SIZE bytes from a private buffer into the
 * outgoing mailbox, publish it (release store), wait for the peer's (acquire load), copy the
 * incoming mailbox into another private buffer, and tell the peer its mailbox is free again.
 * Nothing else: no reduction, no protocol, no allocation. Iterations are calibrated to about
 * 0.2 s per size after a warm-up, and the median of 5 such runs is printed, per size:
 *   exchange  bytes  iterations  us_per_exchange
 *
 * Build: cc -O2 -o shm_exchange bench/peer/shm_exchange.c
 * Run:   shm_exchange [bytes ...]   (default 8 64 512 4096 32768 262144 2097152 16777216)
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"

struct side {
    _Alignas(64) _Atomic uint64_t posted; /* exchanges whose data is in this side's mailbox */
    _Alignas(64) _Atomic uint64_t taken;  /* exchanges the peer has copied out */
};

/* Shared between the two processes: per side its counters, then both mailboxes. */
static struct side *sides;
static char *mailbox[2];

/* `iters` exchanges of `size` bytes as side `me`, counters starting after `base`. */
static void exchange(int me, size_t size, uint64_t base, uint64_t iters, char *src, char *dst)
{
    int peer = 1 - me;
    for (uint64_t i = base + 1; i <= base + iters; i++) {
        /* The peer has copied out the previous exchange before this one overwrites it. */
        while (atomic_load_explicit(&sides[me].taken, memory_order_acquire) < i - 1)
            ;
        memcpy(mailbox[me], src, size);
        atomic_store_explicit(&sides[me].posted, i, memory_order_release);
        while (atomic_load_explicit(&sides[peer].posted, memory_order_acquire) < i)
            ;
        memcpy(dst, mailbox[peer], size);
        atomic_store_explicit(&sides[peer].taken, i, memory_order_release);
    }
}

int main(int argc, char **argv)
{
    static const size_t defaults[] = {8, 64, 512, 4096, 32768, 262144, 2097152, 16777216};
    size_t nsizes = argc > 1 ? (size_t)(argc - 1) : sizeof defaults / sizeof defaults[0];
    size_t *sizes = malloc(nsizes * sizeof *sizes), largest = 0;
    if (!sizes) return 3;
    for (size_t k = 0; k < nsizes; k++) {
        sizes[k] = argc > 1 ? strtoull(argv[k + 1], NULL, 0) : defaults[k];
        if (sizes[k] == 0) { fprintf(stderr, "usage: %s [bytes ...]\n", argv[0]); return 2; }
        if (sizes[k] > largest) largest = sizes[k];
    }
    size_t head = 2 * sizeof(struct side);
    char *shared = mmap(NULL, head + 2 * largest + 64, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    /* Both sides agree on every size's iteration count through this word. */
    _Atomic uint64_t *plan = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED || plan == MAP_FAILED) { perror("mmap"); return 3; }
    memset(shared, 0, head + 2 * largest + 64);
    sides = (struct side *)shared;
    mailbox[0] = shared + head;
    mailbox[1] = shared + head + ((largest + 63) & ~(size_t)63);
    pid_t child = fork();
    if (child < 0) { perror("fork"); return 3; }
    int me = child == 0 ? 1 : 0;
    char *src = malloc(largest), *dst = malloc(largest);
    if (!src || !dst) return 3;
    memset(src, me + 1, largest);
    memset(dst, 0, largest);
    uint64_t base = 0;
    for (size_t k = 0; k < nsizes; k++) {
        size_t size = sizes[k];
        /* Calibrate on side 0: a warm-up, then double until a run takes 0.02 s. */
        uint64_t iters = 1;
        for (;;) {
            if (me == 0) {
                double t0 = now();
                exchange(0, size, base, iters, src, dst);
                double t = now() - t0;
                base += iters;
                uint64_t next = t >= 0.02 ? iters : iters * 2;
                atomic_store(&plan[1], next);
                atomic_store(&plan[0], base); /* iteration count published with the base */
                if (t >= 0.02) break;
                iters = next;
            } else {
                exchange(1, size, base, iters, src, dst);
                base += iters;
                while (atomic_load(&plan[0]) < base)
                    ;
                uint64_t next = atomic_load(&plan[1]);
                if (next == iters) break;
                iters = next;
            }
        }
        /* About 0.2 s per run, five runs. */
        iters *= 10;
        double us[5];
        for (int r = 0; r < 5; r++) {
            double t0 = now();
            exchange(me, size, base, iters, src, dst);
            us[r] = (now() - t0) * 1e6 / (double)iters;
            base += iters;
        }
        if (dst[size - 1] != (char)(2 - me)) { fprintf(stderr, "exchange mismatch\n"); return 7; }
        qsort(us, 5, sizeof(double), cmp);
        if (me == 0) {
            printf("exchange %zu %llu %.3f\n", size, (unsigned long long)iters, us[2]);
            fflush(stdout);
        }
    }
    if (child > 0) {
        int st;
        waitpid(child, &st, 0);
        return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
    }
    return 0;
}
