//! `--export-prometheus FILE`: Prometheus text exposition (format 0.0.4) for the node-exporter
//! textfile collector, which reads `*.prom` files whole: hence the atomic rename.
//!
//! Written by hand: nine gauge families in a line format with one escaping rule for label
//! values; prometheus-client would add a registry and an encoder for one render per run, and
//! the text would be the same. Real consumers check it: a Pushgateway, the node exporter's
//! textfile collector and Prometheus itself, in bench/tests/services.rs.
//!
//! Units are Prometheus base units (seconds, bytes per second). Every sample carries `job` and
//! `host` (rank 0's host) so one collector directory can hold several benchmarks; rows of the
//! whole job have `tier="world"`, tier results their tier's name.

use crate::clock;
use crate::run::RunRecord;
use std::fmt::Write as _;

/// Label values escaped as the exposition format requires.
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn labels(pairs: &[(&str, &str)]) -> String {
    let v: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", esc(v)))
        .collect();
    format!("{{{}}}", v.join(","))
}

fn value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        }
    } else {
        format!("{v}")
    }
}

struct Family<'a> {
    out: &'a mut String,
}

impl Family<'_> {
    fn head(&mut self, name: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} gauge");
    }
    fn sample(&mut self, name: &str, l: &[(&str, &str)], v: f64) {
        let _ = writeln!(self.out, "{name}{} {}", labels(l), value(v));
    }
}

pub fn render(run: &RunRecord, job: &str) -> String {
    let host = run.world.hosts.first().map_or("", |h| h.as_str());
    let coll = run.collective();
    let mut s = String::new();
    let mut f = Family { out: &mut s };
    let base = [("job", job), ("host", host), ("collective", coll)];
    let row_labels = |r: &crate::run::RowRecord,
                      placement: &'static str,
                      size: &str|
     -> Vec<(&'static str, String)> {
        vec![
            ("algo", r.algo.clone().unwrap_or_default()),
            ("dtype", r.dtype.clone()),
            ("redop", r.redop.clone()),
            ("size", size.to_string()),
            ("placement", placement.to_string()),
            ("tier", "world".into()),
        ]
    };
    type Pick = fn(&crate::run::CellRecord) -> Option<f64>;
    let families: [(&str, &str, Pick); 4] = [
        (
            "busbw_bus_bandwidth_bytes_per_second",
            "Bus bandwidth (nccl-tests busbw) per collective, size and tier.",
            |c| Some(c.busbw * 1e9),
        ),
        (
            "busbw_algorithm_bandwidth_bytes_per_second",
            "Algorithm bandwidth (nccl-tests algbw).",
            |c| Some(c.algbw * 1e9),
        ),
        (
            "busbw_time_seconds",
            "Time per operation, combined across ranks as -a says.",
            |c| Some(c.time_us / 1e6),
        ),
        (
            "busbw_wrong_elements",
            "Wrong result elements summed over ranks (absent when not validated).",
            |c| c.wrong.map(|w| w as f64),
        ),
    ];
    for (name, help, pick) in families {
        f.head(name, help);
        for r in &run.rows {
            let size = r.size.to_string();
            for (placement, c) in r.cells() {
                if let Some(v) = pick(c) {
                    let extra = row_labels(r, placement, &size);
                    let mut l: Vec<(&str, &str)> = base.to_vec();
                    l.extend(extra.iter().map(|(k, v)| (*k, v.as_str())));
                    f.sample(name, &l, v);
                }
            }
        }
        let tier_value: Option<fn(&crate::record::TierRow) -> f64> = match name {
            "busbw_bus_bandwidth_bytes_per_second" => Some(|t| t.busbw * 1e9),
            "busbw_time_seconds" => Some(|t| t.time_us / 1e6),
            _ => None,
        };
        if let Some(value) = tier_value {
            for tier in run.tiers.iter().flat_map(|t| &t.tiers) {
                for tr in &tier.rows {
                    let size = tr.size.to_string();
                    let mut l: Vec<(&str, &str)> = base.to_vec();
                    l.extend([("size", size.as_str()), ("tier", tier.name.as_str())]);
                    f.sample(name, &l, value(tr));
                }
            }
        }
    }
    let verdicts: Vec<_> = run
        .tiers
        .iter()
        .flat_map(|t| &t.tiers)
        .filter_map(|t| t.verdict.as_ref().map(|v| (t.name.as_str(), v.pass)))
        .collect();
    if !verdicts.is_empty() {
        f.head(
            "busbw_tier_pass",
            "1 when the tier met its expectation, 0 when not.",
        );
        for (tier, pass) in verdicts {
            let mut l: Vec<(&str, &str)> = base.to_vec();
            l.push(("tier", tier));
            f.sample("busbw_tier_pass", &l, if pass { 1.0 } else { 0.0 });
        }
    }
    if let Some(v) = run.verdict.as_ref().filter(|v| !v.findings.is_empty()) {
        f.head(
            "busbw_verdict_finding",
            "1 per finding of the fabric verdict: kind (unreachable_node, slow_uplink, slow_node, slow_link, straggler, wrong_data, tier_under_threshold) and what it names.",
        );
        for x in &v.findings {
            let mut l: Vec<(&str, &str)> = base.to_vec();
            l.extend([("kind", x.kind.name()), ("subject", x.subject.as_str())]);
            f.sample("busbw_verdict_finding", &l, 1.0);
        }
    }
    if let Some(sum) = &run.summary {
        f.head(
            "busbw_avg_bus_bandwidth_bytes_per_second",
            "Mean of every busbw figure of the run (the footer's Avg bus bandwidth).",
        );
        f.sample(
            "busbw_avg_bus_bandwidth_bytes_per_second",
            &base,
            sum.avg_busbw * 1e9,
        );
        f.head(
            "busbw_out_of_bounds",
            "Result cells with at least one wrong element.",
        );
        f.sample("busbw_out_of_bounds", &base, sum.out_of_bounds as f64);
        f.head(
            "busbw_success",
            "1 when the run passed validation, the bandwidth gate and had no error.",
        );
        f.sample("busbw_success", &base, if sum.ok() { 1.0 } else { 0.0 });
    }
    if let Some(end) = run.end_time.as_deref().and_then(clock::parse_rfc3339) {
        f.head(
            "busbw_last_run_timestamp_seconds",
            "When the run ended (Unix time).",
        );
        f.sample("busbw_last_run_timestamp_seconds", &base, end);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::super::sample;
    use super::*;

    #[test]
    fn golden() {
        sample::golden("run.prom", &render(&sample::run_with_tiers(), "nightly"));
    }

    #[test]
    fn exposition_is_well_formed() {
        let mut run = sample::run_with_tiers();
        run.world.hosts[0] = "we\"ird\\host".into();
        let text = render(&run, "j");
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (metric, v) = line.rsplit_once(' ').unwrap();
            assert!(v.parse::<f64>().is_ok(), "{line}");
            assert!(
                metric.starts_with("busbw_") && metric.ends_with('}'),
                "{line}"
            );
            assert!(metric.contains("job=\"j\""), "{line}");
            assert!(metric.contains("host=\"we\\\"ird\\\\host\""), "{line}");
        }
        assert!(text.contains("tier=\"cross-rack\""));
        assert!(text.contains("busbw_tier_pass{job=\"j\",host=\"we\\\"ird\\\\host\",collective=\"all_reduce\",tier=\"cross-rack\"} 0"));
    }
}
