//! `busbw report`, `busbw compare`, `busbw history`: tools over saved run records.

use crate::cli_report::{CompareCmd, HistoryCmd, ImageFormat, ReportCmd, ToolCommand};
use crate::exit;
use busbw_reports::compare::{compare, parse_threshold};
use busbw_reports::export::write_atomic;
use busbw_reports::{history, html, plot, RunRecord};

pub fn main(t: &ToolCommand) -> i32 {
    match t {
        ToolCommand::Report(c) => report(c),
        ToolCommand::Compare(c) => compare_cmd(c),
        ToolCommand::History(c) => history(c),
    }
}

fn load(path: &std::path::Path) -> Result<RunRecord, i32> {
    RunRecord::load(path).map_err(|e| {
        eprintln!("busbw: error: {e}");
        exit::USAGE
    })
}

fn compare_cmd(c: &CompareCmd) -> i32 {
    let threshold = match parse_threshold(&c.threshold) {
        Ok(t) => t,
        Err(msg) => {
            eprintln!("busbw: error: {msg}");
            return exit::USAGE;
        }
    };
    let (base, new) = match (load(&c.baseline), load(&c.new)) {
        (Ok(b), Ok(n)) => (b, n),
        (Err(code), _) | (_, Err(code)) => return code,
    };
    let cmp = compare(&base, &new, threshold);
    if c.format == "markdown" {
        print!("{}", cmp.markdown());
    } else {
        print!("{}", cmp.table());
    }
    if let Some(p) = &c.markdown {
        if let Err(e) = write_atomic(p, cmp.markdown().as_bytes()) {
            eprintln!("busbw: error: writing {}: {e}", p.display());
            return exit::INTERNAL;
        }
    }
    if cmp.regressions().is_empty() {
        exit::OK
    } else {
        exit::REGRESSION
    }
}

fn report(c: &ReportCmd) -> i32 {
    if c.plot.is_none() && c.html.is_none() {
        eprintln!("busbw: error: report needs --plot DIR and/or --html FILE: say what to write");
        return exit::USAGE;
    }
    let run = match load(&c.run) {
        Ok(r) => r,
        Err(code) => return code,
    };
    if let Some(dir) = &c.plot {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("busbw: error: creating {}: {e}", dir.display());
            return exit::USAGE;
        }
        for p in plot::plots(&run) {
            let path = dir.join(format!(
                "{}.{}",
                p.name,
                match c.format {
                    ImageFormat::Svg => "svg",
                    ImageFormat::Png => "png",
                }
            ));
            let written = match c.format {
                ImageFormat::Svg => p
                    .svg()
                    .map_err(|e| e.to_string())
                    .and_then(|s| write_atomic(&path, s.as_bytes()).map_err(|e| e.to_string())),
                ImageFormat::Png => p.png(&path).map_err(|e| e.to_string()),
            };
            if let Err(e) = written {
                eprintln!("busbw: error: writing {}: {e}", path.display());
                return exit::INTERNAL;
            }
            println!("{}", path.display());
        }
    }
    if let Some(path) = &c.html {
        let written = html::render(&run)
            .map_err(|e| e.to_string())
            .and_then(|page| write_atomic(path, page.as_bytes()).map_err(|e| e.to_string()));
        if let Err(e) = written {
            eprintln!("busbw: error: writing {}: {e}", path.display());
            return exit::INTERNAL;
        }
        println!("{}", path.display());
    }
    exit::OK
}

fn history(c: &HistoryCmd) -> i32 {
    let (entries, skipped) = match history::load_dir(&c.dir) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("busbw: error: reading {}: {e}", c.dir.display());
            return exit::USAGE;
        }
    };
    for s in &skipped {
        eprintln!("busbw: warning: skipped {s}");
    }
    if entries.is_empty() {
        eprintln!(
            "busbw: error: no run records in {}: save runs there with --export-json",
            c.dir.display()
        );
        return exit::USAGE;
    }
    print!("{}", history::table(&entries));
    let plots = history::plots(&entries);
    for (i, p) in plots.iter().enumerate() {
        let path = match (&c.plot, i) {
            (Some(f), 0) => f.clone(),
            (Some(f), _) => f.with_file_name(format!("{}.svg", p.name)),
            (None, 0) => c.dir.join("history.svg"),
            (None, _) => c.dir.join(format!("{}.svg", p.name)),
        };
        let written = p
            .svg()
            .map_err(|e| e.to_string())
            .and_then(|s| write_atomic(&path, s.as_bytes()).map_err(|e| e.to_string()));
        if let Err(e) = written {
            eprintln!("busbw: error: writing {}: {e}", path.display());
            return exit::INTERNAL;
        }
        println!("{}", path.display());
    }
    exit::OK
}
