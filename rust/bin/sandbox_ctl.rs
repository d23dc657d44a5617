//! `sandbox-ctl`: run inside a sandbox to spawn and drive child sandboxes
//! through the orchestrator's per-parent socket (see `sandbox_ctl`).
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = sandbox_ctl::cli::run(&args, &mut std::io::stdout(), &mut std::io::stderr());
    std::process::exit(code);
}
