//! The adaptive pairing schedule over synthetic fabrics of 8 to 16,384 nodes (issue 39,
//! point 4): rounds, pairs measured (against the round robin's), and precision and recall
//! per fault kind, fixed seeds. `cargo run --release -p busbw-tiers --example pairing_scale`
//! prints the table docs/tiers.md shows.

use busbw_tiers::fabric::table_row;

fn main() {
    let trials: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20);
    println!(
        "| nodes | slow nodes | slow links | stragglers | trials | rounds (median / max) | pairs measured (median) | round robin's pairs | node precision / recall | link precision / recall | straggler precision / recall | undecided |"
    );
    println!("|---:|---:|---:|---:|---:|---|---:|---:|---|---|---|---:|");
    for n in [8usize, 64, 512, 4096, 16384] {
        for (k, m, s) in [
            (0, 0, 0),
            (1, 0, 0),
            (0, 1, 0),
            (0, 0, 1),
            (4, 0, 0),
            (0, 0, 4),
            (2, 2, 0),
            (2, 0, 2),
        ] {
            // Faults on half the nodes or more leave no healthy median to judge by.
            if 2 * (k + 2 * m + s) >= n {
                continue;
            }
            let r = table_row(n, (k, m, s), trials, 0x5eed ^ n as u64);
            println!(
                "| {} | {} | {} | {} | {} | {} / {} | {} | {} | {:.2} / {:.2} | {:.2} / {:.2} | {:.2} / {:.2} | {} |",
                r.n,
                r.k,
                r.m,
                r.s,
                r.trials,
                r.rounds_median,
                r.rounds_max,
                r.pairs_median,
                r.full_pairs,
                r.nodes.precision(),
                r.nodes.recall(),
                r.links.precision(),
                r.links.recall(),
                r.stragglers.precision(),
                r.stragglers.recall(),
                r.undecided
            );
        }
    }
}
