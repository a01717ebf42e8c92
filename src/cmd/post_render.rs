//! `koord-bundle post-render --config FILE`: helm's post-renderer, as `load` gives it to helm
//! (see `chart::post_render`). helm writes the rendered manifests to its stdin and applies what
//! it prints; anything on stderr and a non-zero exit make helm stop with that message.

use crate::chart::post_render::{post_render, PostRender};
use crate::cli::PostRenderArgs;
use anyhow::Context as _;
use std::io::{Read as _, Write as _};

/// Largest configuration read (it is written by `load`: a few hundred bytes).
const MAX_CONFIG: u64 = 1 << 20;

/// Read the configuration and the manifests, write the manifests helm applies.
pub fn run(args: PostRenderArgs) -> anyhow::Result<()> {
    let mut config = Vec::new();
    crate::bounded::open_input(&args.config)
        .with_context(|| {
            format!(
                "cannot open the post-renderer configuration {}",
                args.config.display()
            )
        })?
        .take(MAX_CONFIG + 1)
        .read_to_end(&mut config)
        .with_context(|| format!("cannot read {}", args.config.display()))?;
    anyhow::ensure!(
        config.len() as u64 <= MAX_CONFIG,
        "the post-renderer configuration {} is larger than {MAX_CONFIG} bytes",
        args.config.display()
    );
    let how: PostRender = serde_json::from_slice(&config).with_context(|| {
        format!(
            "{} is not a post-renderer configuration",
            args.config.display()
        )
    })?;
    let cap = crate::yaml::MANIFESTS.max_bytes as u64;
    let mut input = Vec::new();
    std::io::stdin()
        .take(cap + 1)
        .read_to_end(&mut input)
        .context("reading the rendered manifests from standard input")?;
    anyhow::ensure!(
        input.len() as u64 <= cap,
        "the rendered manifests are larger than {cap} bytes"
    );
    let text = String::from_utf8(input).context("the rendered manifests are not UTF-8")?;
    let out = post_render(&text, &how)?;
    // helm's input, not words for a terminal: the manifests as they are, on the pipe helm reads.
    #[allow(clippy::disallowed_methods)]
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
        .context("writing the manifests to standard output")?;
    Ok(())
}
