//! `build`'s settings: every flag and the environment resolved once, before any network
//! request or byte written (an error in any of them costs no download).

use crate::bundle::pack::Compression;
use crate::bundle::plan::Base;
use crate::bundle::reuse::Index;
use crate::cli::BuildArgs;
use crate::helm::Helm;
use crate::progress::Progress;
use crate::sources::{Origin, SourceMap};
use crate::store::http::HttpFetcher;
use crate::store::registry::RegistryStore;
use crate::store::{BlobCache, Registry, RegistryOptions};
use anyhow::{bail, Context as _};
use std::path::PathBuf;
use std::sync::Arc;

/// What a build needs, resolved once from the flags and the environment before any network
/// request or byte written: an error in any of them costs no download.
pub(super) struct Settings {
    /// The helm that renders the chart (`--helm`, else on `PATH`; 3.8+).
    pub(super) helm: Helm,
    pub(super) map: SourceMap,
    pub(super) sources: Vec<Origin>,
    /// The sources as given (or the default list), for the bundle manifest.
    pub(super) recorded_sources: Vec<String>,
    pub(super) platforms: Option<Vec<String>>,
    /// `--split` size and `--parity`.
    pub(super) split: Option<(u64, usize, bool)>,
    pub(super) signer: Option<(minisign::SecretKey, PathBuf)>,
    /// The bundle `--since` names.
    pub(super) base: Option<Base>,
    /// The opt-in blob store (`--cache DIR`).
    pub(super) cache: Option<BlobCache>,
    /// The index of earlier bundles, in the cache directory (`None` with `--no-cache`).
    pub(super) index: Option<Index>,
    /// Where the output goes (checked writable; `None`: named after the chart version).
    pub(super) output: Option<PathBuf>,
    pub(super) output_dir: PathBuf,
    /// `SOURCE_DATE_EPOCH`.
    pub(super) source_date_epoch: Option<u64>,
    /// The Helm repository client (CA files read).
    pub(super) http: HttpFetcher,
    /// The registries' client (credentials and CA files read).
    pub(super) registries: RegistryStore,
}

impl Settings {
    pub(super) fn resolve(args: &BuildArgs, progress: &Progress) -> anyhow::Result<Settings> {
        let map = SourceMap::builtin();
        let sources: Vec<Origin> = if args.sources.is_empty() {
            map.default_sources()
        } else {
            args.sources
                .iter()
                .map(|s| map.parse_source(s))
                .collect::<Result<_, _>>()?
        };
        let platforms = (!args.platform.is_empty()).then(|| args.platform.clone());
        for p in platforms.iter().flatten() {
            if p.split('/').count() < 2 {
                bail!("--platform {p}: expected OS/ARCH[/VARIANT], e.g. linux/amd64");
            }
        }
        crate::cmd::split::spread_needs_parity(args.parity, args.spread)?;
        let split = match args.split.as_deref() {
            Some(s) => Some((koord_splitset::parse_size(s)?, args.parity, args.spread)),
            None if args.parity > 0 => {
                bail!("--parity needs --split SIZE (parity parts are parts of a split set)")
            }
            None => None,
        };
        // helm renders the chart: without one, nothing is downloaded.
        let helm = Helm::find(
            args.helm.as_deref(),
            std::env::var_os(crate::cmd::env::PATH).as_deref(),
            &crate::helm::FOR_BUILD,
        )
        .context(
            "build needs helm to find the images the chart deploys (nothing was downloaded)",
        )?;
        crate::cmd::check_helm_inputs(&args.values, &args.set)?;
        let signer = if args.dry_run || args.unsigned {
            None
        } else {
            crate::cmd::signing_key(args.sign_key.as_deref(), true)?
        };
        let base = args.since.as_deref().map(Base::read).transpose()?;
        let output_dir = crate::cmd::output_dir_of(args.output.as_deref(), !args.dry_run)?;
        let reg = Registry::new(RegistryOptions {
            plain_http_hosts: plain_hosts(args, &sources),
            ca_files: args.ca_file.clone(),
            credentials: crate::cmd::registry_credentials()?,
            on_retry: Some(crate::cmd::retry_reporter(progress)),
            ..Default::default()
        })?;
        let index = (!args.no_cache)
            .then(crate::cmd::cache_dir)
            .transpose()?
            .map(|d| Index::new(&d));
        // Last: the only setting that creates something (the blob store's folders).
        let cache = args.cache.as_deref().map(BlobCache::open).transpose()?;
        Ok(Settings {
            helm,
            recorded_sources: if args.sources.is_empty() {
                map.default.clone()
            } else {
                args.sources.clone()
            },
            map,
            sources,
            platforms,
            split,
            signer,
            base,
            cache,
            index,
            output: args.output.clone(),
            output_dir,
            source_date_epoch: crate::cmd::source_date_epoch()?,
            http: HttpFetcher::new(&args.ca_file, Default::default())?,
            registries: RegistryStore::new(Arc::new(reg), ""),
        })
    }

    /// Where the bundle goes: `-o`, else `koordinator-VERSION.tar[.gz]` in the output directory.
    pub(super) fn output_path(&self, args: &BuildArgs, version: &str) -> PathBuf {
        self.output.clone().unwrap_or_else(|| {
            self.output_dir.join(match args.compress {
                Compression::None => format!("koordinator-{version}.tar"),
                Compression::Gzip => format!("koordinator-{version}.tar.gz"),
            })
        })
    }
}

/// Hosts spoken to over plain HTTP (`--plain-http`): custom sources and `--image` registries.
pub(super) fn plain_hosts(args: &BuildArgs, sources: &[Origin]) -> Vec<String> {
    if !args.plain_http {
        return vec![];
    }
    let custom = sources.iter().filter_map(|s| match s {
        Origin::Custom(c) => Some(c.split('/').next().unwrap_or(c).to_string()),
        _ => None,
    });
    let fixed = args.images.iter().filter_map(|i| {
        crate::oci::ImageRef::parse(i)
            .ok()
            .map(|r| r.registry.clone())
    });
    custom.chain(fixed).collect()
}
