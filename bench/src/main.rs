//! `busbw`: the binary. A thin layer over the library crates: parse flags, pick the
//! collective's descriptor, and hand over to the shared perf driver.

mod cli;
mod cli_report;
#[cfg(test)]
mod corpus;
mod doctor;
mod exit;
mod exports;
mod gpu_bench;
mod k8s;
mod perf;
mod plan;
mod report_cmd;
mod terminal;
mod tiers;
mod verbs;

use clap::Parser;

fn main() {
    busbw_measure::resident::mark_start();
    let cli = cli::Cli::parse_from(cli::argv());
    if let cli::Command::Tiers(t) = &cli.command {
        std::process::exit(tiers::main(t));
    }
    let code = match (
        &cli.command,
        busbw_measure::specs::find(cli.command.program()),
    ) {
        (cli::Command::Tools(t), _) => report_cmd::main(t),
        (cli::Command::Doctor(d), _) => doctor::main(d),
        (cli::Command::K8s(k), _) => k8s::main(k, &std::env::args().collect::<Vec<_>>()),
        (cli::Command::GpuBench(g), _) => gpu_bench::bench_main(g),
        (c, Some(spec)) => match c.args() {
            Some(args) => perf::main(spec, args),
            None => exit::INTERNAL,
        },
        (_, None) => {
            eprintln!("busbw: error: no descriptor for {}", cli.command.program());
            exit::INTERNAL
        }
    };
    std::process::exit(code);
}
