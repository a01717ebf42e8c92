//! The koord-bundle executable: parse, run, map the error chain to an exit code.

use clap::Parser;
use koord_bundle::cli::{Cli, Command};
use koord_bundle::cmd;

fn main() {
    // A panic anywhere (this thread, a task, a thread of the blocking pool) is a bug: one
    // message saying so, exit 3 (cmd::EXIT_INTERNAL), never Rust's 101 or an abort.
    cmd::install_panic_hook();
    // clap exits 2 on a usage error (cmd::EXIT_USAGE) and 0 for --help and --version; a
    // usage error of a command line with --json prints the JSON error document too.
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            if e.use_stderr() && std::env::args_os().any(|a| a == "--json") {
                cmd::usage_error_json(&e);
            }
            e.exit()
        }
    };
    cmd::set_json_errors(cli.command.json());
    std::process::exit(run(cli));
}

fn run(cli: Cli) -> i32 {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            koord_bundle::tell!("error: cannot start the async runtime: {e}");
            return cmd::EXIT_INTERNAL;
        }
    };
    // SIGINT and SIGTERM end every command, also one started with them ignored (a background
    // job of a script inherits SIGINT ignored) and one waiting on a thread: its children are
    // ended with it, and it exits 130 or 143. build and load listen themselves (they say what
    // they kept); serve ends gracefully on SIGTERM.
    let listened = match &cli.command {
        Command::Build(_) | Command::Load(_) | Command::Serve(_) => None,
        _ => {
            let _inside = runtime.enter();
            cmd::interrupt_signals().ok()
        }
    };
    if let Some(signals) = listened {
        runtime.spawn(async move {
            let signal = signals.await;
            koord_bundle::child::kill_all();
            let e = anyhow::Error::from(cmd::Interrupted {
                signal,
                kept: "stopped where it was: run the command again".into(),
            });
            std::process::exit(cmd::fail(&e));
        });
    }
    let result = runtime.block_on(async {
        cmd::test_panic().await;
        match cli.command {
            Command::Keygen(a) => cmd::keygen::run(a),
            Command::Build(a) => cmd::build::run(*a).await,
            Command::Inspect(a) => cmd::inspect::run(a),
            Command::Verify(a) => cmd::verify::run(a).await,
            Command::Diff(a) => tokio::task::block_in_place(|| cmd::diff::run(a)),
            Command::Load(a) => cmd::load::run(*a).await,
            Command::Split(a) => tokio::task::block_in_place(|| cmd::split::run_split(a)),
            Command::Join(a) => tokio::task::block_in_place(|| cmd::split::run_join(a)),
            Command::Repair(a) => tokio::task::block_in_place(|| cmd::split::run_repair(a)),
            Command::Serve(a) => cmd::serve::run(a).await,
            Command::PostRender(a) => cmd::post_render::run(a),
        }
    });
    // Leave tasks still blocked (a stdin read, a stalled download) behind rather than wait.
    runtime.shutdown_background();
    match result {
        Ok(()) => cmd::EXIT_OK,
        Err(e) => cmd::fail(&e),
    }
}
