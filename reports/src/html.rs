//! `busbw report --html`: one self-contained page (inline SVG, inline CSS, no scripts, no
//! external requests) that can be attached to a ticket or opened from an artefact store.

use crate::export::markdown::title;
use crate::export::{human_bytes, xml_escape as esc};
use crate::plot::{plots, PlotError};
use crate::run::{CellRecord, RunRecord};
use std::fmt::Write as _;

const STYLE: &str = "body{font-family:sans-serif;margin:2em;color:#222;max-width:1100px}\
table{border-collapse:collapse;margin:1em 0;font-size:14px}\
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}\
th{background:#f0f0f0}td.l,th.l{text-align:left}.bad{color:#b00;font-weight:bold}\
figure{margin:1.5em 0}figcaption{font-size:14px;color:#555}dl{display:grid;grid-template-columns:max-content auto;gap:2px 1em}\
dt{font-weight:bold}";

fn cells(c: &CellRecord) -> String {
    let it = c.iterations.as_ref();
    format!(
        "<td>{:.2}</td><td>{:.2}..{:.2}</td><td>{}</td><td>{}</td><td>{:.2}</td><td>{:.2}</td><td{}>{}</td>",
        c.time_us,
        c.time_min_us,
        c.time_max_us,
        it.map_or(String::new(), |i| format!("{:.2}", i.p99_us)),
        it.map_or(String::new(), |i| format!("{:.1}", i.cv_pct)),
        c.algbw,
        c.busbw,
        if c.wrong.unwrap_or(0) > 0 { " class=\"bad\"" } else { "" },
        c.wrong.map_or("N/A".into(), |w| w.to_string())
    )
}

pub fn render(run: &RunRecord) -> Result<String, PlotError> {
    let mut s = String::new();
    let t = esc(&title(run));
    let _ = write!(
        s,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>busbw: {t}</title><style>{STYLE}</style></head><body>\n<h1>{t}</h1>\n<dl>"
    );
    let facts = [
        (
            "busbw",
            format!(
                "{} (nccl-tests {} semantics)",
                run.versions.busbw, run.versions.nccl_tests
            ),
        ),
        ("started", run.start_time.clone()),
        (
            "ended",
            run.end_time
                .clone()
                .unwrap_or_else(|| "not finished (partial run)".into()),
        ),
        ("hosts", run.world.hosts.join(", ")),
        ("command", run.args.join(" ")),
        (
            "sweep",
            format!(
                "{} to {}, {} iterations (+{} warmup), {} check(s), time combined by {}",
                human_bytes(run.plan.min_bytes),
                human_bytes(run.plan.max_bytes),
                run.plan.iters,
                run.plan.warmup_iters,
                run.plan.check,
                run.plan.average
            ),
        ),
    ];
    for (k, v) in facts {
        let _ = write!(s, "<dt>{k}</dt><dd>{}</dd>", esc(&v));
    }
    if let Some(sum) = &run.summary {
        let bad = if sum.ok() { "" } else { " class=\"bad\"" };
        let _ = write!(
            s,
            "<dt>result</dt><dd{bad}>out of bounds values: {}; avg bus bandwidth {:.4} GB/s{}{}</dd>",
            sum.out_of_bounds,
            sum.avg_busbw,
            match (sum.min_busbw, sum.bandwidth_ok) {
                (Some(m), Some(ok)) => format!(" (gate {m} GB/s: {})", if ok { "OK" } else { "FAILED" }),
                _ => String::new(),
            },
            sum.error.as_deref().map_or(String::new(), |e| format!("; error: {}", esc(e)))
        );
    }
    if let Some(v) = &run.verdict {
        let _ = write!(
            s,
            "<dt>verdict</dt><dd{}>{}: {}</dd>",
            if v.pass { "" } else { " class=\"bad\"" },
            if v.pass { "pass" } else { "FAIL" },
            esc(&v.reason)
        );
    }
    s.push_str("</dl>\n<h2>Plots</h2>\n");
    for p in plots(run) {
        let svg = p.svg()?;
        let _ = writeln!(
            s,
            "<figure id=\"{}\">{svg}<figcaption>{}</figcaption></figure>",
            esc(&p.name),
            esc(&p.name)
        );
    }
    s.push_str("<h2>Results</h2>\n<table><tr><th>size</th><th>count</th><th class=\"l\">type</th><th class=\"l\">redop</th><th>root</th><th class=\"l\">algo</th><th class=\"l\">placement</th><th>time (us)</th><th>rank min..max (us)</th><th>p99 (us)</th><th>cv (%)</th><th>algbw (GB/s)</th><th>busbw (GB/s)</th><th>#wrong</th></tr>\n");
    for r in &run.rows {
        for (placement, c) in r.cells() {
            let _ = writeln!(
                s,
                "<tr><td>{}</td><td>{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td>{}</tr>",
                human_bytes(r.size),
                r.count,
                esc(&r.dtype),
                esc(&r.redop),
                r.root,
                esc(r.algo.as_deref().unwrap_or("-")),
                placement.replace('_', "-"),
                cells(c)
            );
        }
    }
    s.push_str("</table>\n");
    if let Some(t) = &run.tiers {
        s.push_str("<h2>Tiers</h2>\n<table><tr><th class=\"l\">tier</th><th>groups</th><th>size</th><th>time (us)</th><th>busbw (GB/s)</th><th>link rate (GB/s)</th><th class=\"l\">verdict</th></tr>\n");
        for tier in &t.tiers {
            for row in &tier.rows {
                let (cls, verdict) =
                    tier.verdict
                        .as_ref()
                        .map_or((String::new(), String::new()), |v| {
                            (
                                if v.pass {
                                    String::new()
                                } else {
                                    " class=\"l bad\"".into()
                                },
                                format!(
                                    "{}: {}",
                                    if v.pass { "pass" } else { "FAIL" },
                                    esc(&v.reason)
                                ),
                            )
                        });
                let cls = if cls.is_empty() {
                    " class=\"l\"".to_string()
                } else {
                    cls
                };
                let _ = writeln!(
                    s,
                    "<tr><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{:.2}</td><td>{:.2}</td><td>{}</td><td{cls}>{verdict}</td></tr>",
                    esc(&tier.name),
                    tier.groups,
                    human_bytes(row.size),
                    row.time_us,
                    row.busbw,
                    tier.link_rate_gbps.map_or(String::new(), |l| format!("{l:.2}"))
                );
            }
        }
        s.push_str("</table>\n");
    }
    if let Some(p) = &run.pairwise {
        let _ = write!(
            s,
            "<h2>Pairwise busbw (GB/s) at {}</h2>\n<table><tr><th></th>",
            human_bytes(p.size)
        );
        for n in &p.nodes {
            let _ = write!(s, "<th>{}</th>", esc(n));
        }
        s.push_str("</tr>\n");
        for (i, row) in p.busbw.iter().enumerate() {
            let _ = write!(
                s,
                "<tr><th class=\"l\">{}</th>",
                esc(p.nodes.get(i).map_or("?", |n| n.as_str()))
            );
            for (j, v) in row.iter().enumerate() {
                let slow = p
                    .slow
                    .iter()
                    .any(|l| (l.a, l.b) == (i, j) || (l.a, l.b) == (j, i));
                let _ = write!(
                    s,
                    "<td{}>{}</td>",
                    if slow { " class=\"bad\"" } else { "" },
                    v.map_or("-".into(), |v| format!("{v:.2}"))
                );
            }
            s.push_str("</tr>\n");
        }
        s.push_str("</table>\n<ul>");
        for l in &p.slow {
            let name = |k: usize| p.nodes.get(k).map_or("?".to_string(), |n| esc(n));
            let _ = write!(
                s,
                "<li class=\"bad\">{} - {}: {}</li>",
                name(l.a),
                name(l.b),
                esc(&l.reason)
            );
        }
        s.push_str("</ul>\n");
    }
    s.push_str("</body></html>\n");
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::sample;

    #[test]
    fn page_is_self_contained_with_plots_and_tables() {
        let h = render(&sample::run_with_tiers()).unwrap();
        assert_eq!(h.matches("<svg").count(), 2);
        assert!(!h.contains("<script"));
        // The only URLs are the SVG namespace declarations: nothing is fetched.
        assert_eq!(
            h.matches("http").count(),
            h.matches("xmlns=\"http://www.w3.org/2000/svg\"").count()
        );
        assert!(!h.contains("src=") && !h.contains("href="));
        assert_eq!(h.matches("<tr>").count(), 1 + 4 + 1 + 4 + 1 + 3);
        assert!(h.contains("<li class=\"bad\">node-a - node-c: 0.4 GB/s, 21% of the median</li>"));
        assert!(h.contains("--job-token ***"));
    }
}
