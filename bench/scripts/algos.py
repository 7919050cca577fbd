#!/usr/bin/env python3
"""AllReduce algorithms against each other per size, through the real binary.

Runs `busbw all_reduce_perf --np N --transport T` with every algorithm in --algos (default
ring, tree, rd and auto) in alternation, rotating the order each repetition so that load from
other processes hits all alike, and prints per size the median out-of-place time of each, the
fastest fixed algorithm, and auto's time against it (auto/best within 1.10: auto picked
well), with what auto chose. `default` in --algos runs without --algo (and NCCL_ALGO unset):
the algorithm a user gets.

Each size runs alone, with an iteration count calibrated first: one short probe of every
algorithm, and the slowest one's time per operation sets a count that runs about --target
seconds (at least 3, a tenth of it as warm-up), the same for all. A fixed count per sweep
timed 8 bytes for a few hundred microseconds, where one preemption moved a run by a third.

Usage: bench/scripts/algos.py [--reps 5] [--np 8] [--transport shm] [--algos ring,tree,rd,auto]
                              [--rotate 8M] [--target 0.15] [--bin target/release/busbw]
"""
import argparse
import os
import statistics
import subprocess
import sys

# Sizes, each with its probe's iterations: enough to leave the first, cold ones behind, few
# where one operation takes milliseconds (a 64 MiB op on 8 ranks takes a good fraction of a
# second).
SIZES = [("8", 200), ("64", 200), ("512", 200), ("4K", 100), ("32K", 50), ("256K", 10),
         ("2M", 5), ("16M", 2), ("64M", 1)]


def run(a, algo, size, iters):
    env = {k: v for k, v in os.environ.items() if k not in ("NCCL_ALGO", "RANK", "WORLD_SIZE")}
    cmd = [a.bin, "all_reduce_perf", "--np", str(a.np), "--transport", a.transport,
           "-b", size, "-e", size, "-n", str(iters), "-w", str(max(2, iters // 10)), "-c", "0",
           "--rotate", a.rotate]
    if algo != "default":
        cmd += ["--algo", algo]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    rows = {}
    for line in out.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        f = line.split()
        rows[int(f[0])] = (float(f[5]), f[-1] if algo == "auto" else algo)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--np", type=int, default=8)
    ap.add_argument("--transport", default="shm")
    ap.add_argument("--algos", default="ring,tree,rd,auto")
    ap.add_argument("--rotate", default="8M")
    ap.add_argument("--target", type=float, default=0.15,
                    help="seconds each timed run of a size should take (default 0.15)")
    ap.add_argument("--bin", default="target/release/busbw")
    a = ap.parse_args()
    algos = a.algos.split(",")
    if not os.path.exists(a.bin):
        sys.exit(f"{a.bin} not found: run `cargo build --release -p busbw` first")
    iters = {}
    for size, probe in SIZES:
        slowest = max(t for algo in algos for t, _ in run(a, algo, size, probe).values())
        iters[size] = max(3, round(a.target / (slowest * 1e-6)))
    print("# iterations per size: " + ", ".join(f"{s} {n}" for s, n in iters.items()),
          file=sys.stderr)
    times = {}   # (algo, size) -> [us]
    picks = {}   # size -> set of algorithms auto chose
    for rep in range(a.reps):
        for size, _ in SIZES:
            k = rep % len(algos)
            for algo in algos[k:] + algos[:k]:
                for b, (t, chosen) in run(a, algo, size, iters[size]).items():
                    times.setdefault((algo, b), []).append(t)
                    if algo == "auto":
                        picks.setdefault(b, set()).add(chosen)
        print(f"# rep {rep + 1}/{a.reps} done", file=sys.stderr)
    sizes = sorted({s for _, s in times})
    fixed = [al for al in algos if al not in ("auto", "default")]
    others = [al for al in algos if al in ("auto", "default")]
    print(f"np={a.np}, transport={a.transport}, --rotate {a.rotate}, reps={a.reps}, "
          "medians of out-of-place time (us)\n")
    print("| size (B) | " + " | ".join(algos) + " | best | "
          + " | ".join(f"{o}/best" for o in others) + (" | auto chose |" if "auto" in algos else " |"))
    print("|---:|" + "---:|" * (len(algos) + len(others)) + "---|" + ("---|" if "auto" in algos else ""))
    for s in sizes:
        m = {al: statistics.median(times[(al, s)]) for al in algos}
        best = min(fixed, key=lambda al: m[al]) if fixed else None
        cells = [f"{m[al]:.2f}" for al in algos]
        ratios = [f"{m[o] / m[best]:.2f}" if best else "-" for o in others]
        chose = [",".join(sorted(picks[s]))] if "auto" in algos else []
        print("| " + " | ".join([str(s)] + cells + [best or "-"] + ratios + chose) + " |")


if __name__ == "__main__":
    main()
