//! `--export-junit`: JUnit XML for CI systems that chart test results. One test case per row
//! (failing when a placement has wrong elements), one for the bandwidth gate when there is
//! one, and one per tier verdict.
//!
//! Written by hand: a flat document of four element kinds, whose only hazard is escaping
//! (`xml_escape`: markup characters, line breaks kept in attributes, XML 1.0's forbidden
//! characters dropped). An XML writer crate would replace a few `writeln!` lines with its
//! builder calls and still leave the content rules to us; a strict parser (roxmltree, in the
//! tests) checks the result instead.

use super::{human_bytes, xml_escape};
use crate::run::RunRecord;
use std::fmt::Write as _;

struct Case {
    class: String,
    name: String,
    time_s: f64,
    failure: Option<String>,
}

fn cases(run: &RunRecord) -> Vec<Case> {
    let mut out = Vec::new();
    let coll = run.collective();
    for r in &run.rows {
        let mut failures = Vec::new();
        for (placement, c) in r.cells() {
            if let Some(w) = c.wrong.filter(|&w| w > 0) {
                failures.push(format!(
                    "{w} wrong element(s) {}",
                    placement.replace('_', "-")
                ));
            }
        }
        let iters = f64::from(run.plan.iters.max(1) * run.plan.agg_iters.max(1));
        out.push(Case {
            class: format!("busbw.{coll}.{}.{}", r.dtype, r.redop),
            // Names carry no figures: CI keys a case's history by its name.
            name: format!(
                "{} root {}{}",
                human_bytes(r.size),
                r.root,
                r.algo.as_deref().map_or(String::new(), |a| format!(" {a}")),
            ),
            time_s: (r.out_of_place.time_us + r.in_place.time_us) * iters / 1e6,
            failure: (!failures.is_empty()).then(|| failures.join("; ")),
        });
    }
    if let Some(sum) = &run.summary {
        if let (Some(min), Some(ok)) = (sum.min_busbw, sum.bandwidth_ok) {
            out.push(Case {
                class: format!("busbw.{coll}.gate"),
                name: format!("avg busbw >= 0.9 x {min} GB/s"),
                time_s: 0.0,
                failure: (!ok).then(|| {
                    format!(
                        "average bus bandwidth {:.4} GB/s is under 0.9 x {min}",
                        sum.avg_busbw
                    )
                }),
            });
        }
        if let Some(e) = &sum.error {
            out.push(Case {
                class: format!("busbw.{coll}.run"),
                name: "run completed".into(),
                time_s: 0.0,
                failure: Some(e.clone()),
            });
        }
    }
    if let Some(t) = &run.tiers {
        for tier in &t.tiers {
            if let Some(v) = &tier.verdict {
                out.push(Case {
                    class: format!("busbw.{coll}.tier"),
                    name: format!("tier {}", tier.name),
                    time_s: 0.0,
                    failure: (!v.pass).then(|| v.reason.clone()),
                });
            }
        }
    }
    if let Some(v) = &run.verdict {
        out.push(Case {
            class: format!("busbw.{coll}.fabric"),
            name: "verdict (slow nodes and links, stragglers, tiers)".into(),
            time_s: 0.0,
            failure: (!v.pass).then(|| v.reason.clone()),
        });
        // One case per finding, named by what it blames, so a CI dashboard lists the node.
        for f in &v.findings {
            out.push(Case {
                class: format!("busbw.{coll}.fabric.{}", f.kind.name()),
                name: f.subject.clone(),
                time_s: 0.0,
                failure: Some(f.detail.clone()),
            });
        }
    }
    out
}

pub fn render(run: &RunRecord) -> String {
    let cases = cases(run);
    let failures = cases.iter().filter(|c| c.failure.is_some()).count();
    let time: f64 = cases.iter().map(|c| c.time_s).sum();
    let mut s = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        s,
        "<testsuites name=\"busbw\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" time=\"{time:.6}\">",
        cases.len()
    );
    let _ = writeln!(
        s,
        "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" skipped=\"0\" time=\"{time:.6}\" timestamp=\"{}\" hostname=\"{}\">",
        xml_escape(&run.program),
        cases.len(),
        xml_escape(run.start_time.trim_end_matches('Z')),
        xml_escape(run.world.hosts.first().map_or("", |h| h.as_str()))
    );
    s.push_str("    <properties>\n");
    let props = [
        ("busbw.version", run.versions.busbw.clone()),
        ("ranks", run.world.ranks.to_string()),
        ("hosts", run.world.hosts.join(",")),
        ("transports", run.world.transports.join(",")),
    ];
    for (k, v) in props {
        let _ = writeln!(
            s,
            "      <property name=\"{k}\" value=\"{}\"/>",
            xml_escape(&v)
        );
    }
    s.push_str("    </properties>\n");
    for c in &cases {
        let head = format!(
            "    <testcase classname=\"{}\" name=\"{}\" time=\"{:.6}\"",
            xml_escape(&c.class),
            xml_escape(&c.name),
            c.time_s
        );
        match &c.failure {
            None => {
                let _ = writeln!(s, "{head}/>");
            }
            Some(f) => {
                let _ = writeln!(
                    s,
                    "{head}>\n      <failure message=\"{}\" type=\"busbw\"/>\n    </testcase>",
                    xml_escape(f)
                );
            }
        }
    }
    s.push_str("  </testsuite>\n</testsuites>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::super::sample;
    use super::*;

    #[test]
    fn golden() {
        sample::golden("run.junit.xml", &render(&sample::run_with_tiers()));
    }

    #[test]
    fn wrong_rows_and_failed_tiers_fail() {
        let mut run = sample::run_with_tiers();
        run.rows[0].in_place.wrong = Some(3);
        let x = render(&run);
        assert!(x.contains("failures=\"6\""), "{x}");
        assert!(x.contains("3 wrong element(s) in-place"), "{x}");
        assert!(
            x.contains("name=\"tier cross-rack\" time=\"0.000000\">\n      <failure message=\"0.52 GB/s &lt; 0.8 x 1 GB/s\""),
            "{x}"
        );
        // Rows, two tiers, the fabric verdict and each of its three findings, named by what
        // it blames.
        assert_eq!(x.matches("<testcase ").count(), 8);
        assert!(
            x.contains("classname=\"busbw.all_reduce.fabric.straggler\" name=\"node-b\""),
            "{x}"
        );
        assert!(x.contains("name=\"1 KiB root -1 ring\""), "{x}");
    }

    /// A strict XML parser reads what CI systems will: every case, the counts, and a failure
    /// message with markup characters, line breaks and a control character intact (less the
    /// control character, which XML cannot carry).
    #[test]
    fn a_strict_parser_reads_it_back() {
        let mut run = sample::run_with_tiers();
        run.rows[0].in_place.wrong = Some(1);
        let error = "rank 3 on \"gpu<7>\" & co: lost\nline two\u{1b}[0m\tend";
        run.summary.as_mut().unwrap().error = Some(error.into());
        let x = render(&run);
        let doc = roxmltree::Document::parse(&x).unwrap_or_else(|e| panic!("{e}\n{x}"));
        let suite = doc
            .descendants()
            .find(|n| n.has_tag_name("testsuite"))
            .unwrap();
        let cases: Vec<_> = suite
            .children()
            .filter(|n| n.has_tag_name("testcase"))
            .collect();
        assert_eq!(suite.attribute("tests"), Some(&*cases.len().to_string()));
        let failures: Vec<&str> = cases
            .iter()
            .filter_map(|c| c.children().find(|n| n.has_tag_name("failure")))
            .filter_map(|f| f.attribute("message"))
            .collect();
        assert_eq!(
            suite.attribute("failures"),
            Some(&*failures.len().to_string())
        );
        assert!(
            failures.contains(&"rank 3 on \"gpu<7>\" & co: lost\nline two[0m\tend"),
            "{failures:?}"
        );
    }
}
