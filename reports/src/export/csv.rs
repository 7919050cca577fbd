//! `--export-csv`: one line per row and placement (long format), for spreadsheets and
//! dataframes. Empty `wrong` means not validated (the table's `N/A`); empty `iter_*` means no
//! per-iteration data.

use crate::run::RunRecord;
use serde::{Deserialize, Serialize};
use std::io;

/// One CSV line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CsvRow {
    pub collective: String,
    pub algo: Option<String>,
    pub dtype: String,
    pub redop: String,
    pub root: i64,
    pub size: u64,
    pub count: u64,
    pub placement: String,
    pub time_us: f64,
    pub time_min_us: f64,
    pub time_max_us: f64,
    pub algbw_gbps: f64,
    pub busbw_gbps: f64,
    pub wrong: Option<u64>,
    pub iter_p50_us: Option<f64>,
    pub iter_p99_us: Option<f64>,
    pub iter_cv_pct: Option<f64>,
}

/// The lines [`render`] writes, as values.
pub fn rows_of(run: &RunRecord) -> Vec<CsvRow> {
    let mut out = Vec::new();
    for r in &run.rows {
        for (placement, c) in r.cells() {
            let it = c.iterations.as_ref();
            out.push(CsvRow {
                collective: run.collective().into(),
                algo: r.algo.clone(),
                dtype: r.dtype.clone(),
                redop: r.redop.clone(),
                root: r.root,
                size: r.size,
                count: r.count,
                placement: placement.into(),
                time_us: c.time_us,
                time_min_us: c.time_min_us,
                time_max_us: c.time_max_us,
                algbw_gbps: c.algbw,
                busbw_gbps: c.busbw,
                wrong: c.wrong,
                iter_p50_us: it.map(|i| i.p50_us),
                iter_p99_us: it.map(|i| i.p99_us),
                iter_cv_pct: it.map(|i| i.cv_pct),
            });
        }
    }
    out
}

pub fn render(run: &RunRecord) -> io::Result<Vec<u8>> {
    let mut w = ::csv::Writer::from_writer(Vec::new());
    for row in rows_of(run) {
        w.serialize(row).map_err(io::Error::other)?;
    }
    if run.rows.is_empty() {
        // Still a valid CSV with its header, so readers can start before the first row.
        w.write_record(HEADER).map_err(io::Error::other)?;
    }
    w.into_inner().map_err(|e| io::Error::other(e.to_string()))
}

const HEADER: [&str; 17] = [
    "collective",
    "algo",
    "dtype",
    "redop",
    "root",
    "size",
    "count",
    "placement",
    "time_us",
    "time_min_us",
    "time_max_us",
    "algbw_gbps",
    "busbw_gbps",
    "wrong",
    "iter_p50_us",
    "iter_p99_us",
    "iter_cv_pct",
];

/// Reads what [`render`] wrote.
pub fn parse(text: &str) -> Result<Vec<CsvRow>, ::csv::Error> {
    ::csv::Reader::from_reader(text.as_bytes())
        .deserialize()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::sample;
    use super::*;

    #[test]
    fn golden() {
        let s = String::from_utf8(render(&sample::run()).unwrap()).unwrap();
        sample::golden("run.csv", &s);
    }

    #[test]
    fn round_trips() {
        let mut run = sample::run();
        run.rows[1].in_place.wrong = None;
        run.rows[1].in_place.iterations = None;
        run.rows[0].algo = None;
        let text = String::from_utf8(render(&run).unwrap()).unwrap();
        assert_eq!(parse(&text).unwrap(), rows_of(&run));
        assert!(text.lines().nth(4).unwrap().contains(",in_place,"));
    }

    #[test]
    fn empty_run_has_a_header() {
        let mut run = sample::run();
        run.rows.clear();
        let text = String::from_utf8(render(&run).unwrap()).unwrap();
        assert_eq!(text.trim(), HEADER.join(","));
        assert!(parse(&text).unwrap().is_empty());
    }
}
