//! Exporters: one module per format (hyperfine's `src/export/` layout), all rendering the same
//! [`RunRecord`], and one [`ExportSink`] that keeps every requested file current.
//!
//! Each file is rewritten after every row, through a temporary file in the same directory and
//! a rename, so a reader (or a crash) only ever sees a complete document holding the rows done
//! so far: a sweep that dies at 8 GiB still leaves the 1 KiB … 4 GiB rows on disk, in every
//! format. Rendering the whole record each time costs microseconds per row; rows take
//! milliseconds at least.

pub mod csv;
pub mod json;
pub mod junit;
pub mod markdown;
pub mod nccl_json;
pub mod prometheus;
pub mod push;

use crate::clock;
use crate::record::{Cell, Footer, Row, RunHeader};
use crate::run::{CellDetail, Measured, RowRecord, RunRecord, SummaryRecord};
use crate::Sink;
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// A file format an [`ExportSink`] can keep up to date.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Format {
    /// busbw's own record (`--export-json`), the input of `report`, `compare` and `history`.
    Json,
    /// nccl-tests' `-J` document, version 3.
    NcclTests,
    Csv,
    Markdown,
    Junit,
    /// Node-exporter textfile-collector exposition; `job` becomes the `job` label.
    Prometheus {
        job: String,
    },
}

impl Format {
    pub fn render(&self, run: &RunRecord) -> io::Result<Vec<u8>> {
        Ok(match self {
            Format::Json => json::render(run)?,
            Format::NcclTests => nccl_json::render(run).into_bytes(),
            Format::Csv => csv::render(run)?,
            Format::Markdown => markdown::render(run).into_bytes(),
            Format::Junit => junit::render(run).into_bytes(),
            Format::Prometheus { job } => prometheus::render(run, job).into_bytes(),
        })
    }
}

/// One output file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub format: Format,
    pub path: PathBuf,
}

/// Replaces `path` with `bytes` atomically: readers see the old or the new file, never half.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a file name"))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let tmp = dir.join(format!(
        ".{}.busbw-tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Builds the [`RunRecord`] as the run streams by and rewrites every target after each event.
pub struct ExportSink {
    run: RunRecord,
    extra_columns: Vec<String>,
    default_algo: Option<String>,
    targets: Vec<Target>,
    push: Option<push::PushGateway>,
}

impl ExportSink {
    /// `run` carries everything known before the header (plan, versions, args, world size);
    /// `default_algo` is the algorithm of rows that do not name one in an `algo` column.
    pub fn new(
        run: RunRecord,
        targets: Vec<Target>,
        push: Option<push::PushGateway>,
        default_algo: Option<String>,
    ) -> Self {
        ExportSink {
            run,
            extra_columns: Vec::new(),
            default_algo,
            targets,
            push,
        }
    }

    pub fn record(&self) -> &RunRecord {
        &self.run
    }

    /// Writes every target now.
    pub fn flush(&mut self) -> io::Result<()> {
        for t in &self.targets {
            let bytes = t.format.render(&self.run)?;
            write_atomic(&t.path, &bytes).map_err(|e| {
                io::Error::new(e.kind(), format!("writing {}: {e}", t.path.display()))
            })?;
        }
        Ok(())
    }

    /// Everything `busbw tiers` concluded: its summary for the exporters, the full report,
    /// and the nodes' topology labels in the world. Written at once, like a row.
    pub fn set_tier_report(
        &mut self,
        report: &crate::tiers::TierReport,
        busbw_factor: &dyn Fn(usize) -> f64,
    ) -> io::Result<()> {
        let (tiers, pairwise, verdict) = report.records(busbw_factor);
        self.run.tiers = Some(tiers);
        self.run.pairwise = pairwise;
        self.run.verdict = Some(verdict);
        self.run.world.labels.extend(report.labels());
        self.run.tier_report = Some(report.clone());
        self.flush()
    }

    /// The run died: record why and when, keep the rows, and push what there is.
    pub fn fail(&mut self, error: &str) -> io::Result<()> {
        let summary = self.run.summary.get_or_insert(SummaryRecord {
            out_of_bounds: 0,
            avg_busbw: 0.0,
            min_busbw: self.run.plan.min_busbw,
            bandwidth_ok: None,
            error: None,
        });
        summary.error = Some(error.to_string());
        self.run.complete = false;
        self.finish()
    }

    fn finish(&mut self) -> io::Result<()> {
        self.run.end_time = Some(clock::rfc3339(SystemTime::now()));
        self.flush()?;
        if let Some(p) = &self.push {
            p.push(&self.run)?;
        }
        Ok(())
    }
}

impl Sink for ExportSink {
    fn header(&mut self, h: &RunHeader) -> io::Result<()> {
        self.extra_columns = h.extra_columns.clone();
        if !h.devices.is_empty() {
            self.run.world.hosts = RunRecord::hosts_of(&h.devices);
            self.run.world.devices = h.devices.clone();
        }
        self.flush()
    }

    fn row(&mut self, r: &Row) -> io::Result<()> {
        let detail = |c: &Cell| CellDetail {
            time_min_us: c.time_us,
            time_max_us: c.time_us,
            iterations: None,
        };
        self.measured(&Measured {
            out_of_place: detail(&r.out_of_place),
            in_place: detail(&r.in_place),
            row: r.clone(),
            algo: None,
        })
    }

    fn measured(&mut self, m: &Measured) -> io::Result<()> {
        self.run.rows.push(RowRecord::from_measured(
            m,
            &self.extra_columns,
            self.default_algo.as_deref(),
        ));
        self.flush()
    }

    fn footer(&mut self, f: &Footer) -> io::Result<()> {
        self.run.summary = Some(SummaryRecord::from_footer(f));
        self.run.complete = f.error.is_none();
        self.finish()
    }
}

/// Escapes text for XML and HTML content and attribute values. Line breaks and tabs become
/// character references, which an attribute value keeps (a literal one is normalized to a
/// space by every XML parser: a JUnit failure message would lose its lines); characters XML
/// 1.0 does not allow at all (other C0 controls, U+FFFE, U+FFFF) are dropped.
pub(crate) fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' => out.push_str("&#10;"),
            '\r' => out.push_str("&#13;"),
            '\t' => out.push_str("&#9;"),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => {}
            c => out.push(c),
        }
    }
    out
}

/// `1 MiB`, `512 B`: sizes as people read them in titles and tables.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 {
        format!("{v} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
pub(crate) mod sample;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let dir = std::env::temp_dir().join(format!("busbw-atomic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("out.json");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        assert!(write_atomic(&dir.join("missing/x"), b"x").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human_bytes(8), "8 B");
        assert_eq!(human_bytes(1 << 20), "1 MiB");
        assert_eq!(human_bytes(1536), "1.5 KiB");
    }

    #[test]
    fn sink_keeps_every_file_current_row_by_row() {
        let dir = std::env::temp_dir().join(format!("busbw-sink-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let targets = vec![
            Target {
                format: Format::Json,
                path: dir.join("r.json"),
            },
            Target {
                format: Format::Csv,
                path: dir.join("r.csv"),
            },
            Target {
                format: Format::NcclTests,
                path: dir.join("n.json"),
            },
        ];
        let full = sample::run();
        let mut start = full.clone();
        start.rows.clear();
        start.summary = None;
        start.end_time = None;
        let mut sink = ExportSink::new(start, targets, None, Some("ring".into()));
        sink.header(&sample::header()).unwrap();
        let first = sample::measured(&full.rows[0]);
        sink.measured(&first).unwrap();
        // After one row, each file is a complete document with exactly that row.
        let r = RunRecord::load(&dir.join("r.json")).unwrap();
        assert_eq!(r.rows.len(), 1);
        assert!(r.end_time.is_none() && r.summary.is_none());
        let csv = std::fs::read_to_string(dir.join("r.csv")).unwrap();
        assert_eq!(csv.lines().count(), 3, "{csv}");
        let n: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("n.json")).unwrap()).unwrap();
        assert_eq!(n["results"].as_array().unwrap().len(), 1);
        assert!(n.get("end_time").is_none());
        sink.measured(&sample::measured(&full.rows[1])).unwrap();
        sink.footer(&sample::footer()).unwrap();
        let r = RunRecord::load(&dir.join("r.json")).unwrap();
        assert_eq!(r.rows, full.rows);
        assert!(r.end_time.is_some());
        assert_eq!(r.summary.unwrap().avg_busbw, 1.5);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
