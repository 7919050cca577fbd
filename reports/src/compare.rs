//! `busbw compare`: two run records, row by row and tier by tier.
//!
//! Rows are matched by what identifies a measurement (collective, type, op, root, algorithm,
//! size, placement), never by position, so sweeps over different ranges still compare where
//! they overlap; rows in only one file are listed, not errors. Repeated rows (`-N`) are
//! averaged. A regression is busbw down by more than the threshold, or wrong results where the
//! baseline had none.

use crate::export::human_bytes;
use crate::run::RunRecord;
use std::collections::BTreeMap;
use std::fmt::Write as _;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Regression,
    Improvement,
    Unchanged,
    /// Only in the new run.
    Added,
    /// Only in the baseline.
    Removed,
    /// A baseline too small to judge (tiny sizes: busbw near 0 GB/s).
    NotComparable,
}

impl Status {
    pub fn label(self) -> &'static str {
        match self {
            Status::Regression => "REGRESSION",
            Status::Improvement => "improved",
            Status::Unchanged => "ok",
            Status::Added => "only in new",
            Status::Removed => "only in baseline",
            Status::NotComparable => "n/a",
        }
    }
}

/// One matched (or unmatched) measurement.
#[derive(Debug, Clone, PartialEq)]
pub struct Diff {
    /// What was measured, e.g. `all_reduce float sum ring 1 MiB out-of-place`.
    pub what: String,
    pub base: Option<f64>,
    pub new: Option<f64>,
    /// Relative busbw change, percent.
    pub change_pct: Option<f64>,
    pub status: Status,
    pub note: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    pub threshold_pct: f64,
    pub rows: Vec<Diff>,
    pub tiers: Vec<Diff>,
    /// Differences of setup that make figures less comparable (rank count, hosts, plan).
    pub notes: Vec<String>,
}

/// `5%`, `5` or `2.5 %`: a percentage.
pub fn parse_threshold(s: &str) -> Result<f64, String> {
    let t = s.trim().trim_end_matches('%').trim();
    match t.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..100.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "--threshold {s}: expected a percentage from 0 to 100, such as 5%"
        )),
    }
}

struct Point {
    busbw: f64,
    n: u32,
    wrong: u64,
}

/// `with_algo`: name the algorithm in the key (only when both runs record one: nccl-tests
/// files do not).
fn points(run: &RunRecord, with_algo: bool) -> (Vec<String>, BTreeMap<String, Point>) {
    let mut order = Vec::new();
    let mut map: BTreeMap<String, Point> = BTreeMap::new();
    for r in &run.rows {
        for (placement, c) in r.cells() {
            let what = format!(
                "{} {} {}{}{} {} {}",
                run.collective(),
                r.dtype,
                r.redop,
                if r.root >= 0 {
                    format!(" root {}", r.root)
                } else {
                    String::new()
                },
                r.algo
                    .as_deref()
                    .filter(|_| with_algo)
                    .map_or(String::new(), |a| format!(" {a}")),
                human_bytes(r.size),
                placement.replace('_', "-")
            );
            let p = map.entry(what.clone()).or_insert_with(|| {
                order.push(what.clone());
                Point {
                    busbw: 0.0,
                    n: 0,
                    wrong: 0,
                }
            });
            p.busbw += c.busbw;
            p.n += 1;
            p.wrong += c.wrong.unwrap_or(0);
        }
    }
    (order, map)
}

/// Smallest baseline busbw (GB/s) that is judged. nccl-tests' JSON writes six decimals, so
/// below this its rounding alone moves a figure by more than 0.5 %; such rows (a few bytes,
/// where busbw means nothing anyway) are listed as not comparable.
const MIN_JUDGED_GBPS: f64 = 1e-4;

fn judge(what: String, base: f64, new: f64, threshold: f64) -> Diff {
    if base < MIN_JUDGED_GBPS {
        return Diff {
            what,
            base: Some(base),
            new: Some(new),
            change_pct: None,
            status: Status::NotComparable,
            note: None,
        };
    }
    let pct = (new - base) / base * 100.0;
    let status = if pct < -threshold {
        Status::Regression
    } else if pct > threshold {
        Status::Improvement
    } else {
        Status::Unchanged
    };
    Diff {
        what,
        base: Some(base),
        new: Some(new),
        change_pct: Some(pct),
        status,
        note: None,
    }
}

/// Tier point name -> (busbw, verdict passed).
type TierPoints = BTreeMap<String, (f64, Option<bool>)>;

pub fn compare(base: &RunRecord, new: &RunRecord, threshold_pct: f64) -> Comparison {
    let with_algo = base.plan.algo.is_some() && new.plan.algo.is_some();
    let (border, bmap) = points(base, with_algo);
    let (norder, nmap) = points(new, with_algo);
    let mut rows = Vec::new();
    for what in &border {
        let b = &bmap[what];
        let bbw = b.busbw / f64::from(b.n);
        match nmap.get(what) {
            None => rows.push(Diff {
                what: what.clone(),
                base: Some(bbw),
                new: None,
                change_pct: None,
                status: Status::Removed,
                note: None,
            }),
            Some(n) => {
                let mut d = judge(what.clone(), bbw, n.busbw / f64::from(n.n), threshold_pct);
                if n.wrong > 0 && b.wrong == 0 {
                    d.status = Status::Regression;
                    d.note = Some(format!("{} wrong element(s)", n.wrong));
                }
                rows.push(d);
            }
        }
    }
    for what in norder.iter().filter(|w| !bmap.contains_key(*w)) {
        let n = &nmap[what];
        rows.push(Diff {
            what: what.clone(),
            base: None,
            new: Some(n.busbw / f64::from(n.n)),
            change_pct: None,
            status: Status::Added,
            note: None,
        });
    }

    let tier_points = |r: &RunRecord| -> (Vec<String>, TierPoints) {
        let mut order = Vec::new();
        let mut m = BTreeMap::new();
        for t in r.tiers.iter().flat_map(|t| &t.tiers) {
            for row in &t.rows {
                let what = format!("tier {} {}", t.name, human_bytes(row.size));
                order.push(what.clone());
                m.insert(what, (row.busbw, t.verdict.as_ref().map(|v| v.pass)));
            }
        }
        (order, m)
    };
    let (btorder, bt) = tier_points(base);
    let (ntorder, nt) = tier_points(new);
    let mut tiers = Vec::new();
    for what in &btorder {
        let (bbw, bpass) = bt[what];
        match nt.get(what) {
            None => tiers.push(Diff {
                what: what.clone(),
                base: Some(bbw),
                new: None,
                change_pct: None,
                status: Status::Removed,
                note: None,
            }),
            Some(&(nbw, npass)) => {
                let mut d = judge(what.clone(), bbw, nbw, threshold_pct);
                if bpass == Some(true) && npass == Some(false) {
                    d.status = Status::Regression;
                    d.note = Some("verdict went from pass to fail".into());
                }
                tiers.push(d);
            }
        }
    }
    for what in ntorder.iter().filter(|w| !bt.contains_key(*w)) {
        tiers.push(Diff {
            what: what.clone(),
            base: None,
            new: Some(nt[what].0),
            change_pct: None,
            status: Status::Added,
            note: None,
        });
    }

    let mut notes = Vec::new();
    let mut differ = |name: &str, a: String, b: String| {
        if a != b {
            notes.push(format!("{name} differs: {a} (baseline) vs {b} (new)"));
        }
    };
    differ("collective", base.program.clone(), new.program.clone());
    differ(
        "ranks",
        base.world.ranks.to_string(),
        new.world.ranks.to_string(),
    );
    differ(
        "hosts",
        base.world.hosts.len().to_string(),
        new.world.hosts.len().to_string(),
    );
    differ(
        "transports",
        base.world.transports.join("+"),
        new.world.transports.join("+"),
    );
    differ(
        "iterations (-n)",
        base.plan.iters.to_string(),
        new.plan.iters.to_string(),
    );
    // Sizes below the window run from cache under one rotation and from memory under the
    // other: a change there is not the fabric's.
    let rotate = |p: &crate::run::PlanRecord| p.rotate.clone().unwrap_or_else(|| "max".into());
    differ(
        "buffer rotation (--rotate)",
        rotate(&base.plan),
        rotate(&new.plan),
    );
    Comparison {
        threshold_pct,
        rows,
        tiers,
        notes,
    }
}

impl Diff {
    /// ` (note)`, or nothing.
    fn note_suffix(&self) -> String {
        self.note
            .as_deref()
            .map_or(String::new(), |n| format!(" ({n})"))
    }
}

fn num(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2}"))
}

fn pct(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:+.1}%"))
}

impl Comparison {
    pub fn regressions(&self) -> Vec<&Diff> {
        self.rows
            .iter()
            .chain(&self.tiers)
            .filter(|d| d.status == Status::Regression)
            .collect()
    }

    fn all(&self) -> impl Iterator<Item = &Diff> {
        self.rows.iter().chain(&self.tiers)
    }

    fn verdict(&self) -> String {
        let r = self.regressions();
        if r.is_empty() {
            format!("no regression beyond {}%", self.threshold_pct)
        } else {
            let names: Vec<&str> = r.iter().map(|d| d.what.as_str()).collect();
            format!(
                "{} regression(s) beyond {}%: {}",
                r.len(),
                self.threshold_pct,
                names.join("; ")
            )
        }
    }

    /// Fixed-width text for a terminal.
    pub fn table(&self) -> String {
        let w = self.all().map(|d| d.what.len()).max().unwrap_or(4).max(4);
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<w$}  {:>12}  {:>12}  {:>8}  status",
            "measurement", "base (GB/s)", "new (GB/s)", "change"
        );
        for d in self.all() {
            let _ = writeln!(
                s,
                "{:<w$}  {:>12}  {:>12}  {:>8}  {}{}",
                d.what,
                num(d.base),
                num(d.new),
                pct(d.change_pct),
                d.status.label(),
                d.note_suffix()
            );
        }
        for n in &self.notes {
            let _ = writeln!(s, "note: {n}");
        }
        let _ = writeln!(s, "{}", self.verdict());
        s
    }

    /// GitHub-flavoured markdown, for a pull-request comment.
    pub fn markdown(&self) -> String {
        let mut s = String::from("| measurement | base busbw (GB/s) | new busbw (GB/s) | change | status |\n|---|---:|---:|---:|---|\n");
        for d in self.all() {
            let status = match d.status {
                Status::Regression => format!("**{}**", d.status.label()),
                _ => d.status.label().into(),
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {}{} |",
                d.what,
                num(d.base),
                num(d.new),
                pct(d.change_pct),
                status,
                d.note_suffix()
            );
        }
        for n in &self.notes {
            let _ = writeln!(s, "\n> note: {n}");
        }
        let _ = writeln!(s, "\n{}", self.verdict());
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::sample;

    #[test]
    fn identical_runs_pass() {
        let c = compare(&sample::run_with_tiers(), &sample::run_with_tiers(), 5.0);
        assert!(c.regressions().is_empty(), "{}", c.table());
        assert!(c.rows.iter().all(|d| d.status == Status::Unchanged));
        assert_eq!(c.rows.len(), 4);
        assert_eq!(c.tiers.len(), 4);
        assert!(c.table().contains("no regression beyond 5%"));
    }

    #[test]
    fn a_twenty_percent_drop_at_one_size_fails_and_is_named() {
        let base = sample::run();
        let mut new = base.clone();
        new.rows[1].out_of_place.busbw *= 0.8;
        let c = compare(&base, &new, 5.0);
        let r = c.regressions();
        assert_eq!(r.len(), 1, "{}", c.table());
        assert_eq!(r[0].what, "all_reduce float sum ring 1 MiB out-of-place");
        assert!((r[0].change_pct.unwrap() + 20.0).abs() < 1e-9);
        assert!(c
            .table()
            .contains("1 regression(s) beyond 5%: all_reduce float sum ring 1 MiB out-of-place"));
        assert!(c.markdown().contains("| all_reduce float sum ring 1 MiB out-of-place | 1.50 | 1.20 | -20.0% | **REGRESSION** |"), "{}", c.markdown());
        // Within the threshold it passes; a gain is an improvement.
        assert!(compare(&base, &new, 25.0).regressions().is_empty());
        let c = compare(&new, &base, 5.0);
        assert_eq!(c.rows[2].status, Status::Improvement);
    }

    #[test]
    fn rows_in_one_file_only_are_listed_not_errors() {
        let base = sample::run();
        let mut new = base.clone();
        new.rows.remove(0);
        let mut extra = new.rows[0].clone();
        extra.size = 4 << 20;
        new.rows.push(extra);
        let c = compare(&base, &new, 5.0);
        assert!(c.regressions().is_empty());
        let st: Vec<Status> = c.rows.iter().map(|d| d.status).collect();
        assert_eq!(
            st,
            [
                Status::Removed,
                Status::Removed,
                Status::Unchanged,
                Status::Unchanged,
                Status::Added,
                Status::Added
            ]
        );
    }

    #[test]
    fn wrong_results_and_failed_tiers_regress() {
        let base = sample::run_with_tiers();
        let mut new = base.clone();
        new.rows[0].in_place.wrong = Some(2);
        let t = new.tiers.as_mut().unwrap();
        t.tiers[0].verdict.as_mut().unwrap().pass = false;
        new.world.ranks = 4;
        let c = compare(&base, &new, 5.0);
        assert_eq!(c.regressions().len(), 3, "{}", c.table());
        assert!(c.table().contains("(2 wrong element(s))"));
        assert!(c
            .table()
            .contains("note: ranks differs: 2 (baseline) vs 4 (new)"));
    }

    #[test]
    fn a_different_rotation_is_noted() {
        let base = sample::run_with_tiers();
        let mut new = base.clone();
        assert!(compare(&base, &new, 5.0).notes.is_empty());
        // A record from before --rotate (or nccl-tests' own) rotated as `max` does.
        new.plan.rotate = None;
        let c = compare(&base, &new, 5.0);
        assert!(c
            .table()
            .contains("note: buffer rotation (--rotate) differs: 16M (baseline) vs max (new)"));
    }

    #[test]
    fn an_nccl_tests_baseline_compares_without_algorithms() {
        let run = sample::run();
        let nt = crate::export::nccl_json::render(&run);
        let base = RunRecord::from_slice(nt.as_bytes(), "nccl-tests.json").unwrap();
        let c = compare(&base, &run, 5.0);
        assert!(c.regressions().is_empty(), "{}", c.table());
        assert!(
            c.rows.iter().all(|d| d.status == Status::Unchanged),
            "{}",
            c.table()
        );
        assert_eq!(c.rows[0].what, "all_reduce float sum 1 KiB out-of-place");
    }

    #[test]
    fn thresholds() {
        assert_eq!(parse_threshold("5%"), Ok(5.0));
        assert_eq!(parse_threshold("2.5 %"), Ok(2.5));
        assert_eq!(parse_threshold("10"), Ok(10.0));
        assert!(parse_threshold("-1%").is_err());
        assert!(parse_threshold("five").unwrap_err().contains("percentage"));
    }
}
