use clap::Parser;

fn main() -> std::process::ExitCode {
    vramlab::heap::keep_freed_pages();
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
        // A closed stdout (`vramlab presets | head -1`) ends the output, quietly.
        Err(e) if vramlab::cli::is_broken_pipe(&e) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            match e.downcast_ref::<vramlab::cli::Exit>() {
                Some(exit) => std::process::ExitCode::from(exit.code),
                None => std::process::ExitCode::FAILURE,
            }
        }
    }
}
