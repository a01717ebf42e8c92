//! `koord-bundle serve`: a read-only OCI registry straight from a bundle.

use crate::cli::ServeArgs;

/// Serve a bundle.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    anyhow::bail!("serve {}: not implemented yet", args.bundle.display())
}
