//! `ferroplasma`: run a store, or inspect a running one (see `cli`).

fn main() {
    std::process::exit(ferroplasma_daemon::cli::main_with_args(std::env::args_os()));
}
