//! Command lines: clap parsing of every subcommand, then `plan` and `max-batch` for real
//! (built-in models only: file paths would make the fuzzer read or write files).
#![no_main]

use clap::Parser;
use libfuzzer_sys::fuzz_target;
use vramlab::cli::{Cli, Command, run};
use vramlab::model::preset::find_builtin;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let args = std::iter::once("vramlab").chain(text.split('\n'));
    let Ok(cli) = Cli::try_parse_from(args) else {
        return;
    };
    let train = match &cli.command {
        Some(Command::Plan(a)) => &a.train,
        Some(Command::MaxBatch(a)) => &a.train,
        _ => return,
    };
    let builtin = train
        .model
        .as_deref()
        .is_some_and(|m| find_builtin(m).is_ok());
    if train.config.is_some() || !builtin {
        return;
    }
    if let Some(cmd) = cli.command {
        let _ = run(cmd, &mut std::io::sink());
    }
});
