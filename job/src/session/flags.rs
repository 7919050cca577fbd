//! Ranks started with different flags or binaries, in words.

use busbw_launchers::bootstrap::Disagreement;
use busbw_launchers::rendezvous::ranks_that;

/// Ranks started with different flags or binaries: a usage error (exit 2) that names each
/// flag that differs and its value on both sides.
#[derive(Debug)]
pub struct FlagsDiffer(String);

impl FlagsDiffer {
    /// Rank 0 judged every rank's flags against its own; a rank that agrees with rank 0
    /// names the ranks that do not, a rank that does not names its own differences.
    pub(super) fn new(d: &Disagreement) -> FlagsDiffer {
        let rank = d.rank;
        let (mut msg, others) = if d.mine != d.reference {
            (
                format!(
                    "rank {rank} runs with different flags or another busbw version than rank 0:"
                ),
                vec![(0, d.reference.clone())],
            )
        } else {
            (
                format!(
                    "{} with different flags or another busbw version than rank {rank}:",
                    ranks_that(&d.ranks, "runs", "run")
                ),
                d.examples.clone(),
            )
        };
        // The first few ranks are enough to see the pattern.
        for (r, theirs) in &others {
            for (flag, here, there) in busbw_measure::plan::fingerprint_diff(&d.mine, theirs) {
                msg += &format!("\n  {flag}: {here} on rank {rank}, {there} on rank {r}");
            }
        }
        if d.ranks.len() > others.len() && d.mine == d.reference {
            msg += &format!("\n  ... and {} more ranks", d.ranks.len() - others.len());
        }
        msg += "\nstart every rank with the same command line and binary";
        FlagsDiffer(msg)
    }
}

impl std::fmt::Display for FlagsDiffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for FlagsDiffer {}

#[cfg(test)]
mod tests {
    use super::*;

    fn disagreement(rank: usize, mine: &str) -> Disagreement {
        Disagreement {
            rank,
            mine: mine.into(),
            reference: "-n/--iters\t20\n-d/--datatype\tfloat".into(),
            examples: vec![(3, "-n/--iters\t50\n-d/--datatype\tfloat".into())],
            ranks: vec![3, 5, 6],
        }
    }

    #[test]
    fn each_side_names_the_flags_against_rank_0() {
        let cases = [
            // A rank that agrees with rank 0 names the ranks that do not, and their flags.
            (
                1,
                "-n/--iters\t20\n-d/--datatype\tfloat",
                "ranks 3, 5-6 run with different flags or another busbw version than rank 1:",
                "\n  -n/--iters: 20 on rank 1, 50 on rank 3",
                true,
            ),
            // A rank that differs names its own flags against rank 0's.
            (
                5,
                "-n/--iters\t20\n-d/--datatype\thalf",
                "rank 5 runs with different flags or another busbw version than rank 0:",
                "\n  -d/--datatype: half on rank 5, float on rank 0",
                false,
            ),
        ];
        for (rank, mine, head, line, more) in cases {
            let text = FlagsDiffer::new(&disagreement(rank, mine)).to_string();
            assert!(text.starts_with(head), "{text}");
            assert!(text.contains(line), "{text}");
            assert_eq!(text.contains("\n  ... and 2 more ranks"), more, "{text}");
        }
    }
}
