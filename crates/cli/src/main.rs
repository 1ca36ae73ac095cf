//! The `ambidex` binary: the command line with the built-in workloads.

fn main() -> std::process::ExitCode {
    ambidex_cli::main_with(ambidex_workloads::registry())
}
