//! `busbw`: the binary. A thin layer over the library crates: parse flags, pick the
//! collective's descriptor, and hand over to the shared perf driver.

mod cli;
mod exit;
mod harness;
mod perf;
mod plan;
mod session;
mod sizes;
mod specs;
mod tiers;

use clap::Parser;

fn main() {
    let cli = cli::Cli::parse();
    if let cli::Command::Tiers(t) = &cli.command {
        std::process::exit(tiers::main(t));
    }
    let code = match specs::find(cli.command.program()) {
        Some(spec) => perf::main(spec, cli.command.args()),
        None => {
            eprintln!("busbw: error: no descriptor for {}", cli.command.program());
            exit::INTERNAL
        }
    };
    std::process::exit(code);
}
