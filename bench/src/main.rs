//! `busbw`: the binary. A thin layer over the library crates: parse flags, pick the
//! collective's descriptor, and hand over to the shared perf driver.

mod cli;
mod doctor;
mod exit;
mod harness;
mod perf;
mod plan;
mod session;
mod sizes;
mod specs;
mod verbs;

use clap::Parser;

fn main() {
    let cli = cli::Cli::parse();
    let code = match (
        &cli.command,
        cli.command.args(),
        specs::find(cli.command.program()),
    ) {
        (cli::Command::Doctor(d), _, _) => doctor::main(d),
        (_, Some(args), Some(spec)) => perf::main(spec, args),
        _ => {
            eprintln!("busbw: error: no descriptor for {}", cli.command.program());
            exit::INTERNAL
        }
    };
    std::process::exit(code);
}
