//! From `--export-*` flags to the files rank 0 keeps current, and the sink that feeds the
//! table, the terminal and the exporters from one stream of rows.

use crate::cli_report::ReportArgs;
use crate::terminal::Terminal;
use busbw_measure::plan::Average;
use busbw_measure::report::NCCL_TESTS_COMPAT;
use busbw_measure::Plan;
use busbw_reports::export::push::{self, PushGateway};
use busbw_reports::export::{nccl_json, ExportSink, Format, Target};
use busbw_reports::run::{PlanRecord, RunRecord, Versions, WorldRecord, SCHEMA, SCHEMA_VERSION};
use busbw_reports::{clock, DeviceInfo, Footer, Measured, Row, RunHeader, Sink, TextTable};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The checked export flags.
#[derive(Debug, Default)]
pub struct Requested {
    pub targets: Vec<Target>,
    /// `-J`, before its file name is reserved (nccl-tests never overwrites).
    pub nccl_json: Option<PathBuf>,
    pub push: Option<PushGateway>,
    /// Said once by rank 0 (e.g. a `-J` name nccl-tests would ignore).
    pub warnings: Vec<String>,
}

fn check_dir(flag: &str, p: &Path) -> Result<(), String> {
    let dir = p
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if p.file_name().is_none() {
        return Err(format!("{flag} {}: give a file name", p.display()));
    }
    if !dir.is_dir() {
        return Err(format!(
            "{flag} {}: directory {} does not exist; create it first",
            p.display(),
            dir.display()
        ));
    }
    Ok(())
}

/// Checks every report flag before anything runs, so a typo in a path costs no benchmark time.
pub fn requested(a: &ReportArgs) -> Result<Requested, String> {
    let mut r = Requested::default();
    let files = [
        ("--export-json", &a.export_json, Format::Json),
        ("--export-csv", &a.export_csv, Format::Csv),
        ("--export-markdown", &a.export_markdown, Format::Markdown),
        ("--export-junit", &a.export_junit, Format::Junit),
        (
            "--export-prometheus",
            &a.export_prometheus,
            Format::Prometheus {
                job: a.prometheus_job.clone(),
            },
        ),
    ];
    for (flag, path, format) in files {
        if let Some(p) = path {
            check_dir(flag, p)?;
            r.targets.push(Target {
                format,
                path: p.clone(),
            });
        }
    }
    if let Some(p) = &a.nccl_json {
        if nccl_json::accepts(p) {
            check_dir("-J", p)?;
            r.nccl_json = Some(p.clone());
        } else {
            r.warnings.push(format!(
                "-J {}: nccl-tests writes JSON only to a name ending in .json and ignores others, \
                 so no JSON is written; use -J FILE.json, or --export-json for busbw's own record",
                p.display()
            ));
        }
    }
    if let Some(url) = &a.push_gateway {
        let password = std::env::var(push::PASSWORD_ENV).ok();
        r.push = Some(PushGateway::parse(
            url,
            &a.prometheus_job,
            password.as_deref(),
        )?);
    }
    if let Some(l) = a.link_rate {
        if !l.is_finite() || l <= 0.0 {
            return Err(format!(
                "--link-rate {l}: give the link's rate in GB/s, above 0"
            ));
        }
    }
    Ok(r)
}

/// The command line as recorded: the program by its name (a path to it says where one
/// developer built it, not what was run), values of secret flags and URL credentials masked.
pub fn redacted_args() -> Vec<String> {
    redact(std::env::args())
}

fn redact(mut args: impl Iterator<Item = String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut hide_next = false;
    if let Some(program) = args.next() {
        let name = std::path::Path::new(&program)
            .file_name()
            .map_or(program.clone(), |n| n.to_string_lossy().into_owned());
        out.push(name);
    }
    for a in args {
        if hide_next {
            out.push("***".into());
            hide_next = false;
            continue;
        }
        if a == "--job-token" {
            hide_next = true;
            out.push(a);
        } else if a.starts_with("--job-token=") {
            out.push("--job-token=***".into());
        } else if let (Some(s), Some(at)) = (a.find("://"), a.find('@')) {
            if at > s {
                out.push(format!("{}***{}", &a[..s + 3], &a[at..]));
            } else {
                out.push(a);
            }
        } else {
            out.push(a);
        }
    }
    out
}

/// What is known of the run before its first row.
pub fn start_record(
    plan: &Plan,
    ranks: usize,
    devices: &[DeviceInfo],
    transport: &str,
    link_rate: Option<f64>,
) -> RunRecord {
    RunRecord {
        complete: false,
        schema: SCHEMA.into(),
        schema_version: SCHEMA_VERSION,
        versions: Versions {
            busbw: env!("CARGO_PKG_VERSION").into(),
            nccl_tests: NCCL_TESTS_COMPAT.into(),
        },
        program: plan.spec.program.into(),
        args: redacted_args(),
        start_time: clock::rfc3339(std::time::SystemTime::now()),
        end_time: None,
        plan: PlanRecord {
            min_bytes: plan.min_bytes,
            max_bytes: plan.max_bytes,
            step: plan.step,
            warmup_iters: plan.warmup_iters,
            iters: plan.iters,
            agg_iters: plan.agg_iters,
            check: plan.check,
            dtypes: plan.dtypes.iter().map(|d| d.name().to_string()).collect(),
            ops: plan.ops.iter().map(|o| o.name().to_string()).collect(),
            root: plan.root,
            algo: plan.spec.algos.then(|| plan.algo.name().to_string()),
            average: match plan.average {
                Average::Rank0 => "rank0",
                Average::Mean => "mean",
                Average::Min => "min",
                Average::Max => "max",
            }
            .into(),
            cycles: plan.cycles,
            timeout_s: plan.timeout.as_secs(),
            min_busbw: plan.min_busbw,
            link_rate_gbps: link_rate,
            per_iter_skip: plan.per_iter.unwrap_or(0),
            cputime: plan.cputime,
            blocking: plan.blocking,
            unalign: plan.unalign,
            rotate: Some(plan.rotation.to_string()),
            parallel_init: plan.parallel_init,
        },
        world: WorldRecord {
            ranks,
            hosts: RunRecord::hosts_of(devices),
            labels: Default::default(),
            transports: transports(devices, transport),
            devices: devices.to_vec(),
        },
        rows: Vec::new(),
        summary: None,
        tiers: None,
        pairwise: None,
        verdict: None,
        tier_report: None,
    }
}

/// The transports ranks actually use: with `auto` each device line says which (`host memory
/// via shm+tcp`); otherwise the one asked for.
fn transports(devices: &[DeviceInfo], asked: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for d in devices {
        if let Some((_, via)) = d.name.rsplit_once(" via ") {
            for t in via.split('+') {
                if !out.iter().any(|o| o == t) {
                    out.push(t.to_string());
                }
            }
        }
    }
    if out.is_empty() {
        out.push(asked.to_string());
    }
    out
}

/// Rank 0's outputs: the nccl-tests table on stdout (unchanged to the byte), progress and
/// warnings on stderr, and the export files.
pub struct Outputs<W: Write> {
    pub table: TextTable<W>,
    pub term: Terminal,
    pub exports: Option<ExportSink>,
}

impl<W: Write> Outputs<W> {
    pub fn note(&mut self, line: &str) -> io::Result<()> {
        let table = &mut self.table;
        self.term.suspend(|| table.note(line))
    }

    /// The run failed: keep what the files hold, marked with the error.
    pub fn fail(&mut self, error: &str) {
        self.term.clear();
        if let Some(e) = &mut self.exports {
            if let Err(io) = e.fail(error) {
                eprintln!("busbw: error: {io}");
            }
        }
    }
}

impl<W: Write> Sink for Outputs<W> {
    fn comment(&mut self, line: &str) -> io::Result<()> {
        self.note(line)
    }

    fn header(&mut self, h: &RunHeader) -> io::Result<()> {
        let table = &mut self.table;
        self.term.suspend(|| table.header(h))?;
        if let Some(e) = &mut self.exports {
            e.header(h)?;
        }
        Ok(())
    }

    fn row(&mut self, r: &Row) -> io::Result<()> {
        let table = &mut self.table;
        self.term.suspend(|| table.row(r))?;
        if let Some(e) = &mut self.exports {
            e.row(r)?;
        }
        self.term.advance(None);
        Ok(())
    }

    fn measured(&mut self, m: &Measured) -> io::Result<()> {
        let table = &mut self.table;
        self.term.suspend(|| table.measured(m))?;
        if let Some(e) = &mut self.exports {
            e.measured(m)?;
        }
        self.term.advance(Some(m));
        Ok(())
    }

    fn footer(&mut self, f: &Footer) -> io::Result<()> {
        self.term.clear();
        self.table.footer(f)?;
        if let Some(e) = &mut self.exports {
            e.footer(f)?;
        }
        self.term.warnings();
        Ok(())
    }
}

/// Rank 0: the export files a run's report flags ask for, opened with what is known before
/// the first row (warnings about the flags said once).
pub fn for_run<W: Write>(
    report: &ReportArgs,
    plan: &Plan,
    session: &busbw_job::Session,
    table: &mut TextTable<W>,
) -> anyhow::Result<Option<ExportSink>> {
    use anyhow::Context;
    let req = requested(report).map_err(anyhow::Error::msg)?;
    for w in &req.warnings {
        eprintln!("busbw: warning: {w}");
    }
    let record = start_record(
        plan,
        session.comm.size(),
        &session.devices,
        &session.transport_name,
        report.link_rate,
    );
    let algo = plan.spec.algos.then(|| plan.algo.name().to_string());
    open(req, record, algo, table).context("opening the export files")
}

/// Reserves the `-J` file (announcing it on stdout as nccl-tests does) and opens every target.
pub fn open<W: Write>(
    req: Requested,
    record: RunRecord,
    default_algo: Option<String>,
    table: &mut TextTable<W>,
) -> io::Result<Option<ExportSink>> {
    let mut targets = req.targets;
    if let Some(p) = &req.nccl_json {
        let path = nccl_json::reserve(p)
            .map_err(|e| io::Error::new(e.kind(), format!("-J {}: {e}", p.display())))?;
        table.note(&format!("# Writing JSON output to {}", path.display()))?;
        targets.push(Target {
            format: Format::NcclTests,
            path,
        });
    }
    if targets.is_empty() && req.push.is_none() {
        return Ok(None);
    }
    Ok(Some(ExportSink::new(
        record,
        targets,
        req.push,
        default_algo,
    )))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_program_is_recorded_by_name_and_secrets_are_masked() {
        let args = [
            "../../target/release/busbw",
            "all_reduce_perf",
            "--job-token",
            "s3cret",
            "--push-url=https://user:pw@gw:9091",
        ];
        assert_eq!(
            super::redact(args.iter().map(|a| a.to_string())),
            [
                "busbw",
                "all_reduce_perf",
                "--job-token",
                "***",
                "--push-url=https://***@gw:9091"
            ]
        );
    }
}
