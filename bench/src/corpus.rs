//! Proof by corpus: real-world nccl-tests command lines (`tests/data/nccl-tests-corpus.txt`,
//! each with its source) go through busbw's own argument path, program name included, and
//! come out as the plan nccl-tests would run.

use crate::cli::{multicall, Cli};
use clap::Parser;
use std::ffi::OsString;

const CORPUS: &str = include_str!("../tests/data/nccl-tests-corpus.txt");

/// The program and its arguments of one corpus line: launcher words (`mpirun -np 8`,
/// `srun ...`) before the first word naming an nccl-tests program are dropped.
fn command(line: &str) -> Option<Vec<String>> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| {
        let base = w.rsplit('/').next().unwrap_or(w);
        base.strip_suffix("_mpi").unwrap_or(base).ends_with("_perf")
    })?;
    Some(words[at..].iter().map(|w| w.to_string()).collect())
}

/// The value following `flag` in `args`, if given.
fn value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let i = args.iter().position(|a| a == flag)?;
    args.get(i + 1).map(String::as_str)
}

#[test]
fn every_corpus_line_parses_into_the_plan_nccl_tests_would_run() {
    let lines: Vec<&str> = CORPUS
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert!(lines.len() >= 25, "the corpus lost lines: {}", lines.len());
    for line in lines {
        let args = command(line).unwrap_or_else(|| panic!("no nccl-tests program in: {line}"));
        let argv = multicall(args.iter().map(OsString::from).collect());
        let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{line}\n{e}"));
        let perf = cli
            .command
            .args()
            .unwrap_or_else(|| panic!("{line}: not a benchmark"));
        let spec = busbw_measure::specs::find(cli.command.program()).expect("a descriptor");
        let gpus: u32 = value(&args, "-g").map_or(0, |g| g.parse().expect("-g N"));
        let plan = match crate::plan::from_args(spec, perf) {
            Ok(p) => p,
            // Device buffers need the cuda feature and a driver; without them, the message
            // (and exit 2) says so instead of running on something else.
            Err(e) if gpus > 0 => {
                assert!(e.contains("CUDA"), "{line}: {e}");
                continue;
            }
            Err(e) => panic!("{line}: {e}"),
        };
        let num = |f: &str| value(&args, f).map(|v| v.parse::<i64>().expect("a number"));
        if let Some(n) = num("-n") {
            assert_eq!(i64::from(plan.iters), n, "{line}");
        }
        if let Some(c) = num("-c") {
            assert_eq!(i64::from(plan.check), c, "{line}");
        }
        assert_eq!(i64::from(plan.blocking), num("-z").unwrap_or(0), "{line}");
        assert_eq!(i64::from(plan.unalign), num("-u").unwrap_or(0), "{line}");
        assert_eq!(plan.memory_report, num("-M").unwrap_or(0) == 1, "{line}");
        assert_eq!(plan.parallel_init, num("-p").unwrap_or(0) == 1, "{line}");
        // -G turns -I off, as nccl-tests does.
        let per_iter = num("-I") == Some(1) && num("-G").unwrap_or(0) == 0;
        assert_eq!(plan.per_iter.is_some(), per_iter, "{line}");
        assert_eq!(plan.threads, num("-t").unwrap_or(1) as u32, "{line}");
    }
}

#[test]
fn launcher_words_are_dropped_and_mpi_builds_are_recognised() {
    let c = command("mpirun -np 8 -x A=1 ./build/all_reduce_perf_mpi -b 8").unwrap();
    assert_eq!(c, ["./build/all_reduce_perf_mpi", "-b", "8"]);
    let argv = multicall(c.iter().map(OsString::from).collect());
    assert_eq!(argv[1], "all_reduce_perf");
    // busbw's own name is left alone.
    let own = multicall(vec!["/usr/bin/busbw".into(), "doctor".into()]);
    assert_eq!(own, ["/usr/bin/busbw", "doctor"]);
    // A name that merely looks like one is not a program.
    let odd = multicall(vec!["frobnicate_perf".into(), "-b".into()]);
    assert_eq!(odd.len(), 2);
}
