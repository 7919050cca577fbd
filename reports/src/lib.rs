//! Run reports for busbw, starting with the nccl-tests text table.
//!
//! The text output of nccl-tests is a de facto interface: CI jobs grep
//! "Avg bus bandwidth", dashboards split data rows on whitespace, and people
//! diff runs from different tools column by column. This crate therefore
//! reproduces that format byte for byte (including C `printf` rounding,
//! exponent spelling and trailing spaces) rather than approximating it, so
//! busbw can be dropped into existing pipelines unchanged.
//!
//! Run data lives in plain [`record`] types so the same measurements can feed
//! several [`Sink`]s (text today, JSON or test harnesses later) without each
//! one recomputing numbers.

pub mod clock;
pub mod compare;
pub mod export;
pub mod fmt;
pub mod font;
pub mod history;
pub mod html;
pub mod plot;
pub mod record;
pub mod run;
pub mod stats;
pub mod table;
pub mod tiers;

pub use record::{Cell, DeviceInfo, Footer, MemoryUsage, Row, RunHeader, Step};
pub use run::{CellDetail, Measured, RunRecord};
pub use table::{busbw_average, TextTable};
pub use tiers::TierReport;

/// Receives a run as it happens: one header, rows as sizes complete, one footer.
///
/// Streaming (rather than handing over a finished run) lets long sweeps show
/// progress and keeps the rows that did finish if a later size crashes.
pub trait Sink {
    fn header(&mut self, h: &RunHeader) -> std::io::Result<()>;
    fn row(&mut self, r: &Row) -> std::io::Result<()>;
    fn footer(&mut self, f: &Footer) -> std::io::Result<()>;
    /// The tier table, link matrix and verdict of `busbw tiers`, after the footer. Sinks
    /// that have no place for them ignore them.
    fn tiers(&mut self, report: &TierReport) -> std::io::Result<()> {
        let _ = report;
        Ok(())
    }

    /// A row with what the table does not show (per-rank spread, per-iteration statistics).
    /// The harness calls this instead of [`Sink::row`]; sinks that only print the table keep
    /// the default, which hands on the plain row.
    fn measured(&mut self, m: &Measured) -> std::io::Result<()> {
        self.row(&m.row)
    }

    /// A `#` line the table prints before the next row (alltoallv's per-rank summary).
    /// Sinks without a text table ignore it.
    fn comment(&mut self, line: &str) -> std::io::Result<()> {
        let _ = line;
        Ok(())
    }
}

/// Lets callers keep ownership of a sink (e.g. to inspect a buffer afterwards)
/// while passing it to code that is generic over `Sink`.
impl<S: Sink + ?Sized> Sink for &mut S {
    fn header(&mut self, h: &RunHeader) -> std::io::Result<()> {
        (**self).header(h)
    }
    fn row(&mut self, r: &Row) -> std::io::Result<()> {
        (**self).row(r)
    }
    fn footer(&mut self, f: &Footer) -> std::io::Result<()> {
        (**self).footer(f)
    }
    fn tiers(&mut self, report: &TierReport) -> std::io::Result<()> {
        (**self).tiers(report)
    }

    fn measured(&mut self, m: &Measured) -> std::io::Result<()> {
        (**self).measured(m)
    }
    fn comment(&mut self, line: &str) -> std::io::Result<()> {
        (**self).comment(line)
    }
}

/// Allows heterogeneous sinks to be chosen at runtime (`Box<dyn Sink>`).
impl<S: Sink + ?Sized> Sink for Box<S> {
    fn header(&mut self, h: &RunHeader) -> std::io::Result<()> {
        (**self).header(h)
    }
    fn row(&mut self, r: &Row) -> std::io::Result<()> {
        (**self).row(r)
    }
    fn footer(&mut self, f: &Footer) -> std::io::Result<()> {
        (**self).footer(f)
    }
    fn tiers(&mut self, report: &TierReport) -> std::io::Result<()> {
        (**self).tiers(report)
    }

    fn measured(&mut self, m: &Measured) -> std::io::Result<()> {
        (**self).measured(m)
    }
    fn comment(&mut self, line: &str) -> std::io::Result<()> {
        (**self).comment(line)
    }
}
