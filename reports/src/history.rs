//! `busbw history DIR`: the trend of saved runs (one `--export-json` file per nightly run).

use crate::clock::parse_rfc3339;
use crate::export::human_bytes;
use crate::plot::{Figure, Line, Plot};
use crate::run::RunRecord;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// One saved run.
pub struct Entry {
    pub file: String,
    pub start: f64,
    pub run: RunRecord,
}

/// Every `*.json` run record in `dir`, oldest first; files that are not run records are
/// returned with the reason, so one stray file does not hide the others.
pub fn load_dir(dir: &Path) -> std::io::Result<(Vec<Entry>, Vec<String>)> {
    let mut entries = Vec::new();
    let mut skipped = Vec::new();
    let mut paths: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("json"))
        })
        .collect();
    paths.sort();
    for p in paths {
        match RunRecord::load(&p) {
            Ok(run) => match parse_rfc3339(&run.start_time) {
                Some(start) => entries.push(Entry {
                    file: p
                        .file_name()
                        .map(|f| f.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                    start,
                    run,
                }),
                None => skipped.push(format!(
                    "{}: start_time {:?} is not RFC 3339",
                    p.display(),
                    run.start_time
                )),
            },
            Err(e) => skipped.push(e.to_string()),
        }
    }
    entries.sort_by(|a, b| a.start.total_cmp(&b.start));
    Ok((entries, skipped))
}

/// busbw of the run's largest size, out-of-place, averaged over its types and ops.
fn largest(run: &RunRecord) -> Option<(u64, f64)> {
    let max = run.rows.iter().map(|r| r.size).max()?;
    let v: Vec<f64> = run
        .rows
        .iter()
        .filter(|r| r.size == max)
        .map(|r| r.out_of_place.busbw)
        .collect();
    Some((max, v.iter().sum::<f64>() / v.len() as f64))
}

/// One trend plot per collective: the footer's average busbw and the largest size's busbw.
pub fn plots(entries: &[Entry]) -> Vec<Plot> {
    let mut by: BTreeMap<String, Vec<&Entry>> = BTreeMap::new();
    for e in entries {
        by.entry(e.run.program.clone()).or_default().push(e);
    }
    by.into_iter()
        .map(|(program, es)| {
            let avg = Line {
                label: "avg busbw".into(),
                points: es
                    .iter()
                    .filter_map(|e| e.run.summary.as_ref().map(|s| (e.start, s.avg_busbw)))
                    .collect(),
            };
            let mut sizes: BTreeMap<u64, Vec<(f64, f64)>> = BTreeMap::new();
            for e in &es {
                if let Some((size, bw)) = largest(&e.run) {
                    sizes.entry(size).or_default().push((e.start, bw));
                }
            }
            let mut lines = vec![avg];
            lines.extend(sizes.into_iter().map(|(size, points)| Line {
                label: format!("busbw at {} (out-of-place)", human_bytes(size)),
                points,
            }));
            Plot {
                name: format!(
                    "history-{}",
                    program.trim_end_matches("_perf").replace('_', "-")
                ),
                figure: Figure::Trend {
                    title: format!("{program}: {} run(s)", es.len()),
                    lines,
                },
            }
        })
        .collect()
}

/// The runs as a table, oldest first.
pub fn table(entries: &[Entry]) -> String {
    let w = entries
        .iter()
        .map(|e| e.file.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let mut s = format!(
        "{:<20}  {:<w$}  {:<18}  {:>5}  {:>14}  {:>22}  {}\n",
        "start (UTC)", "file", "collective", "ranks", "avg busbw", "largest size busbw", "result"
    );
    for e in entries {
        let sum = e.run.summary.as_ref();
        let _ = writeln!(
            s,
            "{:<20}  {:<w$}  {:<18}  {:>5}  {:>14}  {:>22}  {}",
            e.run.start_time,
            e.file,
            e.run.program,
            e.run.world.ranks,
            sum.map_or("-".into(), |s| format!("{:.3} GB/s", s.avg_busbw)),
            largest(&e.run).map_or("-".into(), |(size, bw)| format!(
                "{bw:.3} GB/s @ {}",
                human_bytes(size)
            )),
            match sum {
                None => "partial",
                Some(s) if s.ok() => "ok",
                Some(_) => "FAILED",
            }
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::{json, sample};

    #[test]
    fn trend_of_a_directory_oldest_first_skipping_strays() {
        let dir = std::env::temp_dir().join(format!("busbw-history-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (i, day) in ["03", "01", "02"].iter().enumerate() {
            let mut r = sample::run();
            r.start_time = format!("2026-12-{day}T02:00:00Z");
            r.summary.as_mut().unwrap().avg_busbw = 1.0 + i as f64;
            std::fs::write(dir.join(format!("run-{i}.json")), json::render(&r).unwrap()).unwrap();
        }
        std::fs::write(dir.join("notes.json"), "{\"a\": 1}").unwrap();
        std::fs::write(dir.join("readme.txt"), "not json").unwrap();
        let (entries, skipped) = load_dir(&dir).unwrap();
        assert_eq!(
            entries.iter().map(|e| e.file.as_str()).collect::<Vec<_>>(),
            ["run-1.json", "run-2.json", "run-0.json"]
        );
        assert_eq!(skipped.len(), 1, "{skipped:?}");
        assert!(skipped[0].contains("notes.json"));
        let p = plots(&entries);
        assert_eq!(p.len(), 1);
        let Figure::Trend { lines, .. } = &p[0].figure else {
            panic!()
        };
        assert_eq!(
            lines[0].points.iter().map(|p| p.1).collect::<Vec<_>>(),
            [2.0, 3.0, 1.0]
        );
        assert_eq!(lines[1].label, "busbw at 1 MiB (out-of-place)");
        assert!(p[0].svg().unwrap().matches("<circle").count() >= 6);
        assert!(table(&entries)
            .lines()
            .nth(1)
            .unwrap()
            .starts_with("2026-12-01T02:00:00Z"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
