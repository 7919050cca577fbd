//! The nccl-tests text table, reproduced byte for byte.

use std::io::{self, Write};

use crate::fmt::{c_g, c_g_width, float_str, pad_left};
use crate::record::{Cell, Footer, Row, RunHeader, Step};
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
}

impl<W: Write> TextTable<W> {
    pub fn new(out: W) -> Self {
        Self { out }
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
        "#".to_string(),
        "# Using devices".to_string(),
    ];
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
    // "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          "
    lines.push(format!(
        "# {:10}  {:12}  {:8}  {:6}  {:6}           out-of-place                       in-place          ",
        "", "", "", "", ""
    ));
    let extra = |line: String, units: bool| {
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
    lines.push(extra(
        column_line(&[
            "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
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

/// One data line without `\n`; public for the same reuse as [`header_lines`].
pub fn row_line(r: &Row) -> String {
    let mut s = format!(
        "{}  {}  {}  {}  {}",
        pad_left(&r.size.to_string(), 12),
        pad_left(&r.count.to_string(), 12),
        pad_left(&r.dtype, 8),
        pad_left(&r.redop, 6),
        pad_left(&r.root.to_string(), 6)
    );
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
        "#".to_string(),
    ];
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
    fn header(&mut self, h: &RunHeader) -> io::Result<()> {
        for l in header_lines(h) {
            self.line(&l)?;
        }
        Ok(())
    }

    fn row(&mut self, r: &Row) -> io::Result<()> {
        self.line(&row_line(r))
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
