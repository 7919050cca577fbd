//! Flags and subcommands for reports: the `--export-*` family of every `*_perf` subcommand,
//! the terminal's style, and `report`, `compare`, `history` over saved runs.

use clap::{Args, Subcommand, ValueEnum};
use std::path::PathBuf;

/// hyperfine's `--style`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Style {
    /// `full` when stderr is a terminal, else `basic`.
    Auto,
    /// No progress bar, no colour.
    Basic,
    /// Progress bar and colour.
    Full,
    /// Progress bar without colour.
    Nocolor,
    /// Colour without progress bar.
    Color,
    /// Neither, and no warnings (as --quiet).
    None,
}

#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Reports")]
pub struct ReportArgs {
    /// Write busbw's run record (JSON; the input of `busbw report`, `compare`, `history`),
    /// rewritten atomically after every row.
    #[arg(long = "export-json", value_name = "FILE")]
    pub export_json: Option<PathBuf>,
    /// nccl-tests JSON (version 3 layout) for tools that parse it. As in nccl-tests the name must
    /// end in .json (else nothing is written, with a warning) and an existing file is never
    /// overwritten: FILE.0, FILE.1, ... are tried.
    #[arg(short = 'J', long = "output_file", value_name = "FILE.json")]
    pub nccl_json: Option<PathBuf>,
    /// Write the rows as CSV (one line per size and placement).
    #[arg(long = "export-csv", value_name = "FILE")]
    pub export_csv: Option<PathBuf>,
    /// Write the rows as a markdown table.
    #[arg(long = "export-markdown", value_name = "FILE")]
    pub export_markdown: Option<PathBuf>,
    /// Write JUnit XML: one test case per row (fails on wrong data) and per tier verdict.
    #[arg(long = "export-junit", value_name = "FILE")]
    pub export_junit: Option<PathBuf>,
    /// Write Prometheus text exposition for the node-exporter textfile collector
    /// (name it *.prom inside the collector's directory).
    #[arg(long = "export-prometheus", value_name = "FILE")]
    pub export_prometheus: Option<PathBuf>,
    /// PUT the metrics to a Prometheus Pushgateway at the end of the run (http://HOST[:PORT],
    /// or https:// through an ingress, verified against SSL_CERT_FILE or the Mozilla roots).
    /// Basic auth: http[s]://USER@HOST with the password in BUSBW_PUSH_GATEWAY_PASSWORD.
    #[arg(long = "push-gateway", value_name = "URL", env = "BUSBW_PUSH_GATEWAY")]
    pub push_gateway: Option<String>,
    /// `job` label of the Prometheus metrics (and the Pushgateway grouping key).
    #[arg(long = "prometheus-job", value_name = "NAME", default_value = "busbw")]
    pub prometheus_job: String,
    /// Link rate in GB/s (1e9 B/s): a reference line in plots, and a warning when busbw exceeds it.
    #[arg(long = "link-rate", value_name = "GBPS")]
    pub link_rate: Option<f64>,
    /// No progress bar and no warnings (the table and exports are unchanged).
    #[arg(short = 'q', long = "quiet")]
    pub quiet: bool,
    /// Terminal style: auto, basic, full, nocolor, color or none.
    #[arg(long = "style", value_enum, default_value = "auto")]
    pub style: Style,
}

/// Image format of plots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ImageFormat {
    Svg,
    Png,
}

/// Subcommands that read saved runs instead of running one.
#[derive(Subcommand, Debug)]
pub enum ToolCommand {
    /// Plots and an HTML page from a run saved with --export-json.
    Report(ReportCmd),
    /// Compare two saved runs row by row and tier by tier; exit 8 on a regression.
    Compare(CompareCmd),
    /// Trend of the runs saved in a directory (nightly --export-json files).
    History(HistoryCmd),
}

#[derive(Args, Debug)]
pub struct ReportCmd {
    /// A file written by --export-json (or an nccl-tests -J file).
    pub run: PathBuf,
    /// Write the plots into this directory (created if missing).
    #[arg(long = "plot", value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// Plot format.
    #[arg(long = "format", value_enum, default_value = "svg")]
    pub format: ImageFormat,
    /// Write one self-contained HTML page with the plots and tables.
    #[arg(long = "html", value_name = "FILE")]
    pub html: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct CompareCmd {
    /// The reference run (--export-json file, or an nccl-tests -J file).
    pub baseline: PathBuf,
    /// The run to judge.
    pub new: PathBuf,
    /// busbw drop (percent) that counts as a regression.
    #[arg(long = "threshold", default_value = "5%")]
    pub threshold: String,
    /// Also write the comparison as markdown to this file.
    #[arg(long = "markdown", value_name = "FILE")]
    pub markdown: Option<PathBuf>,
    /// Print markdown instead of the text table.
    #[arg(long = "format", value_parser = ["table", "markdown"], default_value = "table")]
    pub format: String,
}

#[derive(Args, Debug)]
pub struct HistoryCmd {
    /// Directory of --export-json (or nccl-tests -J) files.
    pub dir: PathBuf,
    /// Where to write the trend plot [default: DIR/history.svg].
    #[arg(long = "plot", value_name = "FILE")]
    pub plot: Option<PathBuf>,
}
