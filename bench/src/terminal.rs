//! Rank 0's terminal: a progress bar on stderr and, after the table, hyperfine-style warnings
//! about figures that deserve suspicion. stdout (the nccl-tests table) is never touched here.

use crate::cli_report::{ReportArgs, Style};
use busbw_reports::export::human_bytes;
use busbw_reports::Measured;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// Coefficient of variation (percent) above which a row is called noisy.
const HIGH_CV_PCT: f64 = 20.0;
/// First timed iteration this many times the median of the rest: warmup was too short.
const SLOW_FIRST: f64 = 3.0;
/// busbw this much above `--link-rate` cannot have crossed that link.
const ABOVE_LINK: f64 = 1.05;

/// One suspicious row.
struct Finding {
    what: String,
    detail: String,
}

pub struct Terminal {
    bar: ProgressBar,
    warn: bool,
    color: bool,
    link_rate: Option<f64>,
    noisy: Vec<Finding>,
    slow_first: Vec<Finding>,
    above_link: Vec<Finding>,
    rows: usize,
}

impl Terminal {
    /// `total`: rows the sweep will produce (`None`: unbounded, `-N 0`).
    pub fn new(a: &ReportArgs, total: Option<u64>, program: &str, active: bool) -> Terminal {
        let tty = std::io::stderr().is_terminal();
        let style = match a.style {
            Style::Auto if tty => Style::Full,
            Style::Auto => Style::Basic,
            s => s,
        };
        let quiet = a.quiet || style == Style::None || !active;
        let bar_on = !quiet && tty && matches!(style, Style::Full | Style::Nocolor);
        let color =
            matches!(style, Style::Full | Style::Color) && std::env::var_os("NO_COLOR").is_none();
        let bar = if bar_on {
            let (bar, template) = match total {
                Some(n) => (
                    ProgressBar::new(n),
                    "{prefix} {wide_bar} {pos}/{len} rows, {msg}, ETA {eta}",
                ),
                None => (
                    ProgressBar::new_spinner(),
                    "{prefix} {spinner} {pos} rows, {msg}",
                ),
            };
            bar.set_draw_target(ProgressDrawTarget::stderr());
            if let Ok(s) = ProgressStyle::with_template(template) {
                bar.set_style(s);
            }
            bar.set_prefix(program.to_string());
            bar.set_message("starting");
            bar
        } else {
            ProgressBar::hidden()
        };
        Terminal {
            bar,
            warn: !quiet,
            color,
            link_rate: a.link_rate,
            noisy: Vec::new(),
            slow_first: Vec::new(),
            above_link: Vec::new(),
            rows: 0,
        }
    }

    /// Runs `f` (which prints to stdout) with the bar out of the way.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        self.bar.suspend(f)
    }

    pub fn clear(&self) {
        self.bar.finish_and_clear();
    }

    /// One row done: move the bar and look at its figures.
    pub fn advance(&mut self, m: Option<&Measured>) {
        self.rows += 1;
        self.bar.inc(1);
        let Some(m) = m else { return };
        let r = &m.row;
        self.bar
            .set_message(format!("last {} {}", human_bytes(r.size), r.dtype));
        for (placement, cell, detail) in [
            ("out-of-place", &r.out_of_place, &m.out_of_place),
            ("in-place", &r.in_place, &m.in_place),
        ] {
            let what = format!("{} {placement}", human_bytes(r.size));
            if let Some(it) = &detail.iterations {
                let outliers = it.outliers();
                if it.cv_pct > HIGH_CV_PCT || outliers > 0 {
                    self.noisy.push(Finding {
                        what: what.clone(),
                        detail: format!("cv {:.0}%, {outliers} outlier(s)", it.cv_pct),
                    });
                }
                if let Some(ratio) = it.first_iteration_ratio().filter(|&x| x > SLOW_FIRST) {
                    self.slow_first.push(Finding {
                        what: what.clone(),
                        detail: format!("{ratio:.1}x the median"),
                    });
                }
            }
            if let Some(link) = self.link_rate {
                if cell.busbw > link * ABOVE_LINK {
                    self.above_link.push(Finding {
                        what,
                        detail: format!("{:.2} GB/s", cell.busbw),
                    });
                }
            }
        }
    }

    /// Prints the warnings gathered over the run (stderr), unless quiet.
    pub fn warnings(&self) {
        if !self.warn {
            return;
        }
        let cells = self.rows * 2;
        let list = |f: &[Finding]| {
            let shown: Vec<String> = f
                .iter()
                .take(4)
                .map(|x| format!("{} ({})", x.what, x.detail))
                .collect();
            let more = if f.len() > 4 {
                format!(" and {} more", f.len() - 4)
            } else {
                String::new()
            };
            format!("{}{more}", shown.join(", "))
        };
        if !self.noisy.is_empty() {
            self.say(&format!(
                "high variance between iterations in {} of {cells} results: {}. Other load on \
                 the hosts or the network disturbs the figures; rerun on a quiet system with \
                 more iterations (-n) and warmup (-w).",
                self.noisy.len(),
                list(&self.noisy)
            ));
        }
        if !self.slow_first.is_empty() {
            self.say(&format!(
                "the first timed iteration was much slower than the rest in {} result(s): {}. \
                 Connections, page faults or caches were still cold; raise -w.",
                self.slow_first.len(),
                list(&self.slow_first)
            ));
        }
        if let (Some(link), false) = (self.link_rate, self.above_link.is_empty()) {
            self.say(&format!(
                "busbw above the link rate of {link} GB/s in {} result(s): {}. The data did \
                 not cross that link (same-host shared memory or loopback), or --link-rate is \
                 wrong.",
                self.above_link.len(),
                list(&self.above_link)
            ));
        }
    }

    fn say(&self, text: &str) {
        if self.color {
            eprintln!("\x1b[1;33mWarning\x1b[0m: {text}");
        } else {
            eprintln!("Warning: {text}");
        }
    }
}
