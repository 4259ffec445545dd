use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = vramlab::cli::Cli::parse();
    let result = match cli.command {
        Some(cmd) => {
            let mut out = std::io::stdout().lock();
            vramlab::cli::run(cmd, &mut out)
        }
        None => vramlab_gui::run_gui(),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
