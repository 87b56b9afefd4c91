//! Entry point: parses the command line and runs the chosen command. Started as
//! `kubectl-local_storage` (a symlink kubectl finds on PATH for `kubectl local-storage`), the
//! binary is the kubectl plugin instead, with its own commands (cli::kubectl).

use std::process::ExitCode;

use clap::Parser;

use local_static_provisioner::cli;

fn main() -> ExitCode {
    // A short-lived command on an operator's machine: none of the agent's allocator tuning.
    if cli::kubectl::invoked_as_plugin(std::env::args_os().next().as_deref()) {
        return cli::kubectl::main(cli::kubectl::Plugin::parse());
    }
    local_static_provisioner::memory::tune();
    let cli = cli::Cli::parse();
    cli::main(cli)
}
