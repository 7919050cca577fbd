//! The nccl-tests text table, reproduced byte for byte.

use std::io::{self, Write};

use crate::fmt::{c_g, c_g_width, float_str, pad_left};
use crate::record::{Cell, Footer, MemoryUsage, Row, RunHeader, Step};
use crate::Sink;

/// Widths of the time and bandwidth columns in `getFloatStr` calls.
const TIME_WIDTH: usize = 7;
const BW_WIDTH: usize = 6;

/// Writes the nccl-tests text report to any [`Write`].
///
/// Each line is flushed as soon as it is complete: people `tail -f` long
/// sweeps and wrapper scripts stream-parse rows, and nccl-tests' stdout is
/// line-buffered, so a block-buffered writer would change observable timing.
#[derive(Debug)]
pub struct TextTable<W: Write> {
    out: W,
    /// The header's `-I`/`-K` and `-S`, which shape every row.
    per_iter: Option<u32>,
    timestamps: bool,
}

impl<W: Write> TextTable<W> {
    pub fn new(out: W) -> Self {
        Self {
            out,
            per_iter: None,
            timestamps: false,
        }
    }

    pub fn get_ref(&self) -> &W {
        &self.out
    }

    /// A line outside the table's grammar that nccl-tests also prints in place of rows
    /// (e.g. hypercube's "nRanks 6 is not a power of 2, skipping").
    pub fn note(&mut self, line: &str) -> std::io::Result<()> {
        writeln!(self.out, "{line}")?;
        self.out.flush()
    }

    pub fn into_inner(self) -> W {
        self.out
    }

    /// `-S`: now, as nccl-tests stamps rows (UTC here, local time there).
    fn stamp(&self) -> Option<String> {
        self.timestamps
            .then(|| crate::clock::nccl_tests_stamp(std::time::SystemTime::now()))
    }

    /// Writes one complete line (without its `\n`) and flushes it.
    fn line(&mut self, text: &str) -> io::Result<()> {
        self.out.write_all(text.as_bytes())?;
        self.out.write_all(b"\n")?;
        self.out.flush()
    }
}

/// Header block, one string per line without `\n`.
///
/// Exposed apart from [`TextTable`] so other sinks (logs, JSON that embeds the
/// text device lines) reuse the exact bytes instead of re-deriving them.
pub fn header_lines(h: &RunHeader) -> Vec<String> {
    let step = match h.step {
        Step::Factor(f) => format!("{f}(factor)"),
        Step::Bytes(b) => format!("{b}(bytes)"),
    };
    let mut lines = vec![
        format!("# {}", h.version_line),
        format!("# Collective test starting: {}", h.program),
        format!(
            "# nThread {} nGpus {} minBytes {} maxBytes {} step: {} warmup iters: {} iters: {} \
             agg iters: {} validation: {} graph: {} unalign: {}",
            h.nthreads,
            h.ngpus,
            h.min_bytes,
            h.max_bytes,
            step,
            h.warmup_iters,
            h.iters,
            h.agg_iters,
            h.validation,
            h.graph,
            h.unalign
        ),
    ];
    match h.blocking {
        1 => lines.push(
            "# Blocking Enabled: wait and barrier after each inner iteration (-m) ".to_string(),
        ),
        2 => lines.push(
            "# Blocking Enabled: wait after each inner iteration (-m), no barrier ".to_string(),
        ),
        3 => lines.push(
            "# Blocking Enabled: wait and barrier after each outer iteration (-n); time \
             excludes barrier "
                .to_string(),
        ),
        _ => {}
    }
    if let Some(skip) = h.per_iter {
        // nccl-tests names its clock (CUDA events); busbw laps the host clock.
        let mut l =
            "# Per-Iteration Report: host clock timing; i_* uses max over process rows".to_string();
        if skip > 0 {
            l += &format!("; summary skips first {skip} iterations");
        }
        lines.push(l + " ");
    }
    if h.parallel_init {
        // nccl-tests' words; busbw's ranks each join the job on their own thread.
        lines.push(
            "# Parallel Init Enabled: threads call into NcclInitRank concurrently ".to_string(),
        );
    }
    if let Some(p) = &h.data_path {
        lines.push(format!("# Data path: {p} "));
    }
    lines.push("#".to_string());
    lines.push("# Using devices".to_string());
    for d in &h.devices {
        lines.push(format!(
            "#  Rank {} Group {} Pid {} on {} device {} [{}] {}",
            pad_left(&d.rank.to_string(), 2),
            pad_left(&d.group.to_string(), 2),
            pad_left(&d.pid.to_string(), 6),
            pad_left(&d.hostname, 10),
            pad_left(&d.device.to_string(), 2),
            d.pci,
            d.name
        ));
    }
    lines.push("#".to_string());
    if h.per_iter.is_some() {
        lines.push(format!(
            "# {:10}  {:12}  {:8}  {:6}  {:6}              out-of-place (+ per-iteration)                                in-place (+ per-iteration)",
            "", "", "", "", ""
        ));
        let time = if h.cputime { "cputime" } else { "time" };
        let ts = |label: &str| {
            if h.timestamps {
                format!(" {}", pad_left(label, TIMESTAMP_WIDTH))
            } else {
                " ".to_string()
            }
        };
        let per_iter_line = |labels: [&str; 21], ts_label: &str| {
            const W: [usize; 21] = [
                10, 12, 8, 6, 6, 7, 6, 6, 6, 7, 7, 7, 7, 7, 6, 6, 6, 7, 7, 7, 7,
            ];
            let f: Vec<String> = labels.iter().zip(W).map(|(l, w)| pad_left(l, w)).collect();
            format!("# {}{}", f.join("  "), ts(ts_label))
        };
        lines.push(per_iter_line(
            [
                "size", "count", "type", "redop", "root", time, "algbw", "busbw", "#wrong",
                "i_min", "i_max", "i_p99", "i_cv%", time, "algbw", "busbw", "#wrong", "i_min",
                "i_max", "i_p99", "i_cv%",
            ],
            "timestamp",
        ));
        lines.push(per_iter_line(
            [
                "(B)",
                "(elements)",
                "",
                "",
                "",
                "(us)",
                "(GB/s)",
                "(GB/s)",
                "",
                "(us)",
                "(us)",
                "(us)",
                "(%)",
                "(us)",
                "(GB/s)",
                "(GB/s)",
                "",
                "(us)",
                "(us)",
                "(us)",
                "(%)",
            ],
            TIMESTAMP_FORMAT,
        ));
        return lines;
    }
    // "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          "
    lines.push(format!(
        "# {:10}  {:12}  {:8}  {:6}  {:6}           out-of-place                       in-place          ",
        "", "", "", "", ""
    ));
    let extra = |line: String, units: bool| {
        let line = if h.timestamps {
            // `%*s` at width 19 in place of the empty timestamp field.
            let label = if units { TIMESTAMP_FORMAT } else { "timestamp" };
            format!("{}{}", line, pad_left(label, TIMESTAMP_WIDTH))
        } else {
            line
        };
        if h.extra_columns.is_empty() {
            return line;
        }
        // The trailing space is nccl-tests' empty timestamp column; extra columns take its
        // place.
        let mut l = line.strip_suffix(' ').unwrap_or(&line).to_string();
        for label in &h.extra_columns {
            l.push_str("  ");
            l.push_str(&pad_left(if units { "" } else { label }, EXTRA_WIDTH));
        }
        l
    };
    let time = if h.cputime { "cputime" } else { "time" };
    lines.push(extra(
        column_line(&[
            "size", "count", "type", "redop", "root", time, "algbw", "busbw", "#wrong", time,
            "algbw", "busbw", "#wrong",
        ]),
        false,
    ));
    lines.push(extra(
        column_line(&[
            "(B)",
            "(elements)",
            "",
            "",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
        ]),
        true,
    ));
    lines
}

/// Width of each column appended after nccl-tests' own.
const EXTRA_WIDTH: usize = 6;
/// `-S`: the header's timestamp field width and the format its units line shows; rows print
/// the time `%21s`.
const TIMESTAMP_WIDTH: usize = 19;
const TIMESTAMP_FORMAT: &str = "%Y-%m-%d %H:%M:%S";
const TIMESTAMP_ROW_WIDTH: usize = 21;

/// `"# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s"`
/// with the trailing timestamp column at width 0, hence the final space.
fn column_line(labels: &[&str; 13]) -> String {
    const WIDTHS: [usize; 13] = [10, 12, 8, 6, 6, 7, 6, 6, 6, 7, 6, 6, 6];
    let fields: Vec<String> = labels
        .iter()
        .zip(WIDTHS)
        .map(|(label, width)| pad_left(label, width))
        .collect();
    format!("# {} ", fields.join("  "))
}

/// nccl-tests' `-I` summary of one placement: min, max, p99 (nearest rank) and CV (population
/// standard deviation over the mean) of the iterations after the first `skip`.
fn per_iter_cols(times_us: &[f64], skip: usize) -> String {
    let Some(s) = crate::stats::NcclIterSummary::of(times_us.get(skip..).unwrap_or_default())
    else {
        return format!("  {0:>7}  {0:>7}  {0:>7}  {0:>7}", "N/A");
    };
    [s.min, s.max, s.p99, s.cv_pct]
        .iter()
        .map(|x| format!("  {}", float_str(*x, TIME_WIDTH)))
        .collect()
}

/// A data line as [`row_line`] writes it, with `-I` columns from each placement's iteration
/// times (`per_iter`: `-K` and the two placements' times) and `-S`'s `timestamp`.
pub fn row_line_with(
    r: &Row,
    per_iter: Option<(u32, [&[f64]; 2])>,
    timestamp: Option<&str>,
) -> String {
    let Some((skip, times)) = per_iter else {
        let mut s = row_line(r);
        if let Some(t) = timestamp {
            s.push_str(&pad_left(t, TIMESTAMP_ROW_WIDTH));
        }
        return s;
    };
    let mut s = row_preamble(r);
    for (cell, t) in [&r.out_of_place, &r.in_place].into_iter().zip(times) {
        push_cell(&mut s, cell);
        s.push_str(&per_iter_cols(t, skip as usize));
    }
    if let Some(t) = timestamp {
        s.push_str(&pad_left(t, TIMESTAMP_ROW_WIDTH));
    }
    for v in &r.extra {
        s.push_str("  ");
        s.push_str(&pad_left(v, EXTRA_WIDTH));
    }
    s
}

fn row_preamble(r: &Row) -> String {
    format!(
        "{}  {}  {}  {}  {}",
        pad_left(&r.size.to_string(), 12),
        pad_left(&r.count.to_string(), 12),
        pad_left(&r.dtype, 8),
        pad_left(&r.redop, 6),
        pad_left(&r.root.to_string(), 6)
    )
}

/// One data line without `\n`; public for the same reuse as [`header_lines`].
pub fn row_line(r: &Row) -> String {
    let mut s = row_preamble(r);
    for cell in [&r.out_of_place, &r.in_place] {
        push_cell(&mut s, cell);
    }
    for v in &r.extra {
        s.push_str("  ");
        s.push_str(&pad_left(v, EXTRA_WIDTH));
    }
    s
}

/// `"  %7s  %6s  %6s  %6g"`, or `"  %7s  %6s  %6s    N/A"` when the placement
/// was not validated. The N/A form is one byte narrower than the numeric
/// column; that misalignment is nccl-tests' and is kept deliberately.
fn push_cell(s: &mut String, c: &Cell) {
    s.push_str("  ");
    s.push_str(&float_str(c.time_us, TIME_WIDTH));
    s.push_str("  ");
    s.push_str(&float_str(c.algbw, BW_WIDTH));
    s.push_str("  ");
    s.push_str(&float_str(c.busbw, BW_WIDTH));
    s.push_str("  ");
    match c.wrong {
        // nccl-tests passes the count as a double to %6g, so counts of a
        // million or more switch to exponent form; u64 -> f64 mirrors that.
        Some(n) => s.push_str(&c_g_width(n as f64, 6)),
        None => s.push_str("  N/A"),
    }
}

/// Footer block, one string per line without `\n`; public for the same
/// reuse as [`header_lines`].
pub fn footer_lines(f: &Footer) -> Vec<String> {
    let oob_status = if f.out_of_bounds == 0 { "OK" } else { "FAILED" };
    let bw_status = match f.bandwidth_ok() {
        None => "",
        Some(true) => "OK",
        Some(false) => "FAILED",
    };
    let mut lines = vec![
        format!(
            "# {:<20} : {} {}",
            "Out of bounds values", f.out_of_bounds, oob_status
        ),
        format!(
            "# {:<20} : {} {}",
            "Avg bus bandwidth",
            c_g(f.avg_busbw),
            bw_status
        ),
        "#".to_string(),
        format!("# Collective test concluded: {}", f.program),
    ];
    if let Some(m) = &f.memory {
        lines.push(memory_line(m));
    }
    lines.push("#".to_string());
    match &f.error {
        None => lines.push(String::new()),
        Some(msg) => {
            // Keep continuation lines commented so a multi-line error can
            // never be mistaken for a data row by scripts that skip '#'.
            let mut parts = msg.split('\n');
            let first = parts.next().unwrap_or_default();
            lines.push(format!("# error: {first}"));
            lines.extend(parts.map(|p| format!("# {p}")));
        }
    }
    lines
}

/// nccl-tests' memory line: each part, then the total, in 1024-based units.
pub fn memory_line(m: &MemoryUsage) -> String {
    let parts = [
        ("Initialization", m.initialization),
        ("User-Allocated", m.user_allocated),
        ("Collective", m.collective),
    ];
    let listed: Vec<String> = parts
        .iter()
        .map(|(name, b)| format!("{name} {} ", mem_string(*b)))
        .collect();
    let total: i64 = parts.iter().map(|(_, b)| b).sum();
    format!(
        "# {:<20} : {}| Total  {}",
        format!("{} memory usage", m.kind),
        listed.join("| "),
        mem_string(total)
    )
}

/// A byte count as nccl-tests prints it: B, KB, MB or GB (1024-based), two decimals below
/// 10, one below 100, none above.
pub fn mem_string(bytes: i64) -> String {
    let mut v = bytes as f64;
    let mut unit = "B";
    for (scale, u) in [(1u64 << 30, "GB"), (1 << 20, "MB"), (1 << 10, "KB")] {
        if v.abs() >= scale as f64 {
            v /= scale as f64;
            unit = u;
            break;
        }
    }
    let decimals = if v.abs() < 10.0 {
        2
    } else if v.abs() < 100.0 {
        1
    } else {
        0
    };
    format!("{v:.decimals$} {unit}")
}

/// Mean of every busbw value the table prints (both placements of every
/// row), which is what nccl-tests reports as "Avg bus bandwidth".
///
/// Tiny latency-bound sizes weigh as much as large ones, so the figure
/// depends on `-b/-e`; it is reproduced, not "fixed", because CI gates
/// (`NCCL_TESTS_MIN_BW`) were tuned against this definition.
pub fn busbw_average(rows: &[Row]) -> f64 {
    if rows.is_empty() {
        return 0.0;
    }
    let sum: f64 = rows
        .iter()
        .map(|r| r.out_of_place.busbw + r.in_place.busbw)
        .sum();
    sum / (2 * rows.len()) as f64
}

impl<W: Write> Sink for TextTable<W> {
    fn comment(&mut self, line: &str) -> io::Result<()> {
        self.line(line)
    }

    fn header(&mut self, h: &RunHeader) -> io::Result<()> {
        self.per_iter = h.per_iter;
        self.timestamps = h.timestamps;
        for l in header_lines(h) {
            self.line(&l)?;
        }
        Ok(())
    }

    fn row(&mut self, r: &Row) -> io::Result<()> {
        let empty: &[f64] = &[];
        let stamp = self.stamp();
        let line = row_line_with(
            r,
            self.per_iter.map(|k| (k, [empty, empty])),
            stamp.as_deref(),
        );
        self.line(&line)
    }

    fn measured(&mut self, m: &crate::run::Measured) -> io::Result<()> {
        fn times(d: &crate::run::CellDetail) -> &[f64] {
            d.iterations.as_ref().map_or(&[], |i| &i.times_us[..])
        }
        let stamp = self.stamp();
        let line = row_line_with(
            &m.row,
            self.per_iter
                .map(|k| (k, [times(&m.out_of_place), times(&m.in_place)])),
            stamp.as_deref(),
        );
        self.line(&line)
    }

    fn footer(&mut self, f: &Footer) -> io::Result<()> {
        for l in footer_lines(f) {
            self.line(&l)?;
        }
        Ok(())
    }

    fn tiers(&mut self, report: &crate::TierReport) -> io::Result<()> {
        for l in crate::tiers::tier_lines(report) {
            self.line(&l)?;
        }
        Ok(())
    }
}
