//! `--export-markdown`: the results as GitHub-flavoured tables, for pull requests and wikis.

use super::human_bytes;
use crate::run::{CellRecord, RunRecord};
use std::fmt::Write as _;

fn wrong(c: &CellRecord) -> String {
    c.wrong.map_or("N/A".into(), |w| w.to_string())
}

fn p99(c: &CellRecord) -> String {
    c.iterations
        .as_ref()
        .map_or("".into(), |i| format!("{:.2}", i.p99_us))
}

fn cv(c: &CellRecord) -> String {
    c.iterations
        .as_ref()
        .map_or("".into(), |i| format!("{:.1}", i.cv_pct))
}

/// Header line and run facts, shared with the HTML page's wording.
pub fn title(run: &RunRecord) -> String {
    format!(
        "{} on {} rank(s), {} host(s), transport {}",
        run.program,
        run.world.ranks,
        run.world.hosts.len(),
        run.world.transports.join("+")
    )
}

pub fn render(run: &RunRecord) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "## {}\n", title(run));
    let _ = writeln!(
        s,
        "busbw {} (nccl-tests {} semantics), started {}{}.\n",
        run.versions.busbw,
        run.versions.nccl_tests,
        run.start_time,
        run.end_time
            .as_deref()
            .map_or(" (in progress)".into(), |e| format!(", ended {e}"))
    );
    s.push_str(
        "| size | count | type | redop | root | algo | placement | time (us) | min..max rank (us) | p99 (us) | cv (%) | algbw (GB/s) | busbw (GB/s) | #wrong |\n",
    );
    s.push_str("|---:|---:|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in &run.rows {
        for (placement, c) in r.cells() {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {:.2} | {:.2}..{:.2} | {} | {} | {:.2} | {:.2} | {} |",
                human_bytes(r.size),
                r.count,
                r.dtype,
                r.redop,
                r.root,
                r.algo.as_deref().unwrap_or("-"),
                placement.replace('_', "-"),
                c.time_us,
                c.time_min_us,
                c.time_max_us,
                p99(c),
                cv(c),
                c.algbw,
                c.busbw,
                wrong(c)
            );
        }
    }
    if let Some(t) = &run.tiers {
        s.push_str("\n### Tiers\n\n| tier | groups | size | busbw (GB/s) | link rate (GB/s) | verdict |\n|---|---:|---:|---:|---:|---|\n");
        for tier in &t.tiers {
            for row in &tier.rows {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {:.2} | {} | {} |",
                    tier.name,
                    tier.groups,
                    human_bytes(row.size),
                    row.busbw,
                    tier.link_rate_gbps.map_or("".into(), |l| format!("{l:.2}")),
                    tier.verdict.as_ref().map_or("".into(), |v| format!(
                        "{}: {}",
                        if v.pass { "pass" } else { "FAIL" },
                        v.reason
                    ))
                );
            }
        }
    }
    if let Some(sum) = &run.summary {
        let _ = writeln!(
            s,
            "\nOut of bounds values: {} {}. Avg bus bandwidth: {:.4} GB/s{}.{}",
            sum.out_of_bounds,
            if sum.out_of_bounds == 0 {
                "OK"
            } else {
                "FAILED"
            },
            sum.avg_busbw,
            match (sum.min_busbw, sum.bandwidth_ok) {
                (Some(m), Some(ok)) =>
                    format!(" (gate {m} GB/s: {})", if ok { "OK" } else { "FAILED" }),
                _ => String::new(),
            },
            sum.error
                .as_deref()
                .map_or(String::new(), |e| format!(" Error: {e}."))
        );
    }
    if let Some(v) = &run.verdict {
        let _ = writeln!(
            s,
            "\nVerdict: {} ({}).",
            if v.pass { "pass" } else { "FAIL" },
            v.reason
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::super::sample;
    use super::*;

    #[test]
    fn golden() {
        sample::golden("run.md", &render(&sample::run_with_tiers()));
    }
}
