/*
 * tcp_exchange.c - the floor of a two-rank exchange over TCP loopback, the physical reference
 * for small TCP AllReduces in vs-openmpi.sh.
 *
 * Two processes joined by one TCP connection on 127.0.0.1 (TCP_NODELAY) each send BYTES and
 * then spin on a non-blocking recv(2) until the peer's BYTES are in, ITERS times after WARMUP
 * untimed ones. That is what any two-rank AllReduce of BYTES must at least do over TCP: one
 * send and one receive per rank, no framing, no reduction, no bookkeeping. Prints the mean
 * time per exchange, the slower of the two processes:
 *   tcp_exchange  bytes  iters  sockets  us_per_exchange
 *
 * SOCKETS 2 sends each direction over a connection of its own, as NCCL's net API (and busbw's
 * TCP transport) opens a send and a receive connection per peer: each connection then
 * acknowledges in a segment of its own instead of in the data going the other way.
 *
 *   tcp_exchange [BYTES=8] [ITERS=10000] [WARMUP=100] [SOCKETS=1]
 *
 * Build: cc -O2 -o tcp_exchange bench/peer/tcp_exchange.c
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"

static void die(const char *what)
{
    perror(what);
    exit(1);
}

/* ITERS timed exchanges after WARMUP, sending on SFD and receiving on RFD (the same socket or
 * two); returns seconds per exchange. */
static double run(int sfd, int rfd, char *out, char *in, size_t bytes, long warmup, long iters)
{
    double t0 = 0;
    for (long i = 0; i < warmup + iters; i++) {
        if (i == warmup)
            t0 = now();
        size_t sent = 0;
        while (sent < bytes) {
            ssize_t n = send(sfd, out + sent, bytes - sent, MSG_NOSIGNAL);
            if (n < 0 && errno != EINTR)
                die("send");
            if (n > 0)
                sent += (size_t)n;
        }
        size_t got = 0;
        while (got < bytes) {
            ssize_t n = recv(rfd, in + got, bytes - got, MSG_DONTWAIT);
            if (n == 0) {
                fprintf(stderr, "tcp_exchange: peer closed\n");
                exit(1);
            }
            if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                die("recv");
            if (n > 0)
                got += (size_t)n;
        }
    }
    return (now() - t0) / (double)iters;
}

int main(int argc, char **argv)
{
    size_t bytes = argc > 1 ? strtoull(argv[1], NULL, 10) : 8;
    long iters = argc > 2 ? atol(argv[2]) : 10000;
    long warmup = argc > 3 ? atol(argv[3]) : 100;
    int sockets = argc > 4 ? atoi(argv[4]) : 1;
    if (bytes == 0 || iters <= 0 || warmup < 0 || (sockets != 1 && sockets != 2)) {
        fprintf(stderr, "usage: tcp_exchange [BYTES>0] [ITERS>0] [WARMUP>=0] [SOCKETS=1|2]\n");
        return 2;
    }
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    if (ls < 0)
        die("socket");
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    if (bind(ls, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(ls, 1) < 0 ||
        getsockname(ls, (struct sockaddr *)&sa, &len) < 0)
        die("listen");
    int report[2];
    if (pipe(report) < 0)
        die("pipe");
    pid_t child = fork();
    if (child < 0)
        die("fork");
    /* fds[0]: the first connection, fds[1]: the second (or the first again). The child sends
     * on fds[0] and receives on fds[1]; the parent the other way round. */
    int fds[2];
    for (int i = 0; i < sockets; i++) {
        if (child == 0) {
            fds[i] = socket(AF_INET, SOCK_STREAM, 0);
            if (fds[i] < 0 || connect(fds[i], (struct sockaddr *)&sa, sizeof sa) < 0)
                die("connect");
        } else {
            fds[i] = accept(ls, NULL, NULL);
            if (fds[i] < 0)
                die("accept");
        }
        int one = 1;
        setsockopt(fds[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    if (sockets == 1)
        fds[1] = fds[0];
    close(ls);
    char *out = calloc(1, bytes), *in = calloc(1, bytes);
    if (!out || !in)
        die("calloc");
    double secs = child == 0 ? run(fds[0], fds[1], out, in, bytes, warmup, iters)
                             : run(fds[1], fds[0], out, in, bytes, warmup, iters);
    if (child == 0) {
        if (write(report[1], &secs, sizeof secs) != sizeof secs)
            die("write");
        return 0;
    }
    double theirs = 0;
    if (read(report[0], &theirs, sizeof theirs) != sizeof theirs)
        die("read");
    int status = 0;
    waitpid(child, &status, 0);
    if (theirs > secs)
        secs = theirs;
    printf("tcp_exchange %zu %ld %d %.3f\n", bytes, iters, sockets, secs * 1e6);
    return 0;
}
