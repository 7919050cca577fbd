#!/usr/bin/env python3
"""Shared memory vs TCP loopback for local ranks, through the real binary.

Runs `busbw all_reduce_perf --np N` with --transport shm and tcp in alternation, repeats, and
prints median out-of-place time and busbw per size with the shm/tcp time ratio.

Usage: bench/scripts/shm-vs-tcp.py [--reps N] [--np N] [--bin PATH]
"""
import argparse
import os
import statistics
import subprocess
import sys

SWEEPS = [("8", "32K", 200), ("256K", "64M", 5)]
TRANSPORTS = ["shm", "tcp"]


def run(binary, np_, transport, first, last, iters):
    env = {"PATH": os.environ.get("PATH", "")}
    out = subprocess.run(
        [binary, "all_reduce_perf", "--np", str(np_), "-b", first, "-e", last, "-f", "8",
         "-n", str(iters), "-w", "2", "-c", "0", "--transport", transport],
        check=True, capture_output=True, text=True, env=env,
    ).stdout
    rows = {}
    for line in out.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        f = line.split()
        rows[int(f[0])] = (float(f[5]), float(f[7]))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--bin", default="target/release/busbw")
    a = ap.parse_args()
    if not os.path.exists(a.bin):
        sys.exit(f"{a.bin} not found: run `cargo build --release -p busbw` first")
    t, bw = {}, {}
    for rep in range(a.reps):
        for first, last, iters in SWEEPS:
            for tr in (TRANSPORTS if rep % 2 == 0 else TRANSPORTS[::-1]):
                for size, (us, b) in run(a.bin, a.np, tr, first, last, iters).items():
                    t.setdefault((tr, size), []).append(us)
                    bw.setdefault((tr, size), []).append(b)
        print(f"# rep {rep + 1}/{a.reps} done", file=sys.stderr)
    sizes = sorted({s for _, s in t})
    med = lambda d, k: statistics.median(d[k])
    print(f"np={a.np}, reps={a.reps}, medians (out-of-place)\n")
    print("| size (B) | shm time (us) | tcp time (us) | shm busbw | tcp busbw | shm/tcp time |")
    print("|---:|---:|---:|---:|---:|---:|")
    for s in sizes:
        ts, tt = med(t, ("shm", s)), med(t, ("tcp", s))
        print(f"| {s} | {ts:.1f} | {tt:.1f} | {med(bw, ('shm', s)):.2f} | {med(bw, ('tcp', s)):.2f} | {ts / tt:.2f} |")


if __name__ == "__main__":
    main()
