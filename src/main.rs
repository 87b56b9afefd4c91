//! Entry point: parses the command line and runs the chosen command.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    local_static_provisioner::memory::tune();
    let cli = local_static_provisioner::cli::Cli::parse();
    local_static_provisioner::cli::main(cli)
}
