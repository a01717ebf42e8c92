//! The koord-bundle executable: parse, run, map the error chain to an exit code.

use clap::Parser;
use koord_bundle::cli::{Cli, Command};
use koord_bundle::cmd;

fn main() {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(cmd::EXIT_INTERNAL);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Keygen(a) => cmd::keygen::run(a),
            Command::Build(a) => cmd::build::run(*a).await,
            Command::Inspect(a) => cmd::inspect::run(a),
            Command::Verify(a) => tokio::task::block_in_place(|| cmd::verify::run(a)),
            Command::Load(a) => cmd::load::run(*a).await,
            Command::Split(a) => tokio::task::block_in_place(|| cmd::split::run_split(a)),
            Command::Join(a) => tokio::task::block_in_place(|| cmd::split::run_join(a)),
            Command::Serve(a) => cmd::serve::run(a).await,
        }
    });
    if let Err(e) = result {
        eprintln!("error: {e}");
        for cause in e.chain().skip(1) {
            eprintln!("  caused by: {cause}");
        }
        std::process::exit(cmd::exit_code(&e));
    }
}
