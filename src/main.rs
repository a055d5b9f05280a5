//! The `preflight` binary: the library's command line, and its exit code.

fn main() {
    std::process::exit(preflight::cli::main());
}
