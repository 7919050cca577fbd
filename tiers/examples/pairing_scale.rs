//! The adaptive pairing schedule over synthetic fabrics of 8 to 16,384 nodes (issue 39,
//! point 4): rounds, pairs measured (against the round robin's), and precision and recall
//! per fault kind, fixed seeds. `cargo run --release -p busbw-tiers --example pairing_scale`
//! prints the table docs/tiers.md shows.

use busbw_tiers::fabric::{table_row, Mix};

fn main() {
    let trials: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20);
    println!(
        "| nodes | slow nodes | slow uplinks | slow paths | stragglers | trials | rounds (median / max) | pairs measured (median) | round robin's pairs | node P / R | uplink P / R | path P / R | straggler P / R | undecided |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---|---|---|---:|");
    for n in [8usize, 64, 512, 4096, 16384] {
        for (nodes, uplinks, paths, stragglers) in [
            (0, 0, 0, 0),
            (1, 0, 0, 0),
            (0, 1, 0, 0),
            (0, 0, 1, 0),
            (0, 0, 0, 1),
            (4, 0, 0, 0),
            (0, 4, 0, 0),
            (0, 0, 0, 4),
            (2, 2, 0, 0),
            (1, 1, 1, 1),
            (2, 0, 0, 2),
        ] {
            let mix = Mix {
                nodes,
                uplinks,
                paths,
                stragglers,
            };
            // Faults on a quarter of the nodes or more touch half of a round's pairs: no
            // healthy median is left to judge by.
            if 4 * mix.nodes_touched() >= n {
                continue;
            }
            let r = table_row(n, mix, trials, 0x5eed ^ n as u64);
            let pr = |c: busbw_tiers::fabric::Counts| {
                format!("{:.2} / {:.2}", c.precision(), c.recall())
            };
            println!(
                "| {} | {} | {} | {} | {} | {} | {} / {} | {} | {} | {} | {} | {} | {} | {} |",
                r.n,
                nodes,
                uplinks,
                paths,
                stragglers,
                r.trials,
                r.rounds_median,
                r.rounds_max,
                r.pairs_median,
                r.full_pairs,
                pr(r.nodes),
                pr(r.uplinks),
                pr(r.links),
                pr(r.stragglers),
                r.undecided
            );
        }
    }
}
