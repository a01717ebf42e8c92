//! The chart archive `build` bundles: from the Helm repository's index (the version resolved
//! there, its archive downloaded and checked against the index's digest), or a file given by
//! hand. Prints nothing: what the command should say comes back as data.

use super::{index_url, resolve_chart_url, ChartError, RepoIndex, VersionSpec};
use koord_base::bounded::read_file_bounded;
use koord_base::oci::Digest;
use koord_store::store::http::{HttpError, HttpFetcher};
use std::path::{Path, PathBuf};

/// The chart's name in Koordinator's repository.
pub const CHART: &str = "koordinator";

/// The chart, fetched and checked.
#[derive(Debug, Clone)]
pub struct FetchedChart {
    /// The archive's bytes.
    pub bytes: Vec<u8>,
    /// Their sha256.
    pub digest: Digest,
    /// Where it was downloaded from (`None` for a file).
    pub url: Option<String>,
    /// The index entry's `digest`, if any.
    pub index_digest: Option<String>,
    /// The index entry's `created`, if any.
    pub index_created: Option<String>,
    /// The archive did not match the index digest and the caller allowed that.
    pub mismatch_allowed: bool,
    /// The version the index resolved (`None` for a file).
    pub version: Option<String>,
}

/// Why the chart could not be had.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The chart file given by hand.
    #[error("cannot read chart archive {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The repository index could not be downloaded.
    #[error("cannot read the Helm repository index {url} (use --repo URL, or --chart FILE with an archive downloaded by hand): {source}")]
    Index {
        /// The index URL.
        url: String,
        /// What failed.
        source: HttpError,
    },
    /// The archive could not be downloaded.
    #[error("cannot download the chart archive {url}: {source}")]
    Archive {
        /// The archive URL.
        url: String,
        /// What failed.
        source: HttpError,
    },
    /// The index, the version or the entry is wrong.
    #[error("{context}: {source}")]
    Chart {
        /// What was being read.
        context: String,
        /// What is wrong.
        source: ChartError,
    },
    /// The index entry has no download URL.
    #[error("index entry {CHART} {version} has no urls")]
    NoUrls {
        /// The version.
        version: String,
    },
    /// The archive does not match the index digest.
    #[error("chart archive {url} has sha256 {actual}, but the repository index says {expected}: refusing it.\nIf you trust this archive (upstream's 1.7.0 and 1.8.0 index entries predate a moved tag), re-run with --allow-chart-digest-mismatch (recorded in the bundle), or pass --chart FILE")]
    DigestMismatch {
        /// The archive URL.
        url: String,
        /// Its sha256.
        actual: String,
        /// The index's.
        expected: String,
    },
    /// The index entry gives no digest: the archive cannot be checked against it.
    #[error("the repository index gives no digest for {CHART} {version}, so the chart archive {url} (sha256 {actual}) cannot be checked against it: refusing it.\nIf you trust this archive, re-run with --allow-chart-digest-mismatch (recorded in the bundle), or pass --chart FILE")]
    NoDigest {
        /// The version.
        version: String,
        /// The archive URL.
        url: String,
        /// Its sha256.
        actual: String,
    },
}

impl koord_base::exit::Classify for FetchError {
    fn exit_class(&self) -> Option<koord_base::exit::ExitClass> {
        match self {
            // Reading the archive given, or the repository: the cause decides (an I/O
            // error's kind; the HTTP client's transient or not).
            FetchError::Read { .. } | FetchError::Index { .. } | FetchError::Archive { .. } => None,
            // The chart's own fault: the cause says which.
            FetchError::Chart { .. } => None,
            // An index entry with no archive, an archive not as the index says, or no digest
            // to check it by: refused until the user says otherwise.
            FetchError::NoUrls { .. }
            | FetchError::DigestMismatch { .. }
            | FetchError::NoDigest { .. } => Some(koord_base::exit::ExitClass::Input),
        }
    }
}

/// A chart archive given by hand (`--chart FILE`).
pub fn read_file(path: &Path) -> Result<FetchedChart, FetchError> {
    let bytes =
        read_file_bounded(path, super::archive::MAX_UNCOMPRESSED as usize).map_err(|source| {
            FetchError::Read {
                path: path.to_path_buf(),
                source,
            }
        })?;
    Ok(FetchedChart {
        digest: Digest::of(&bytes),
        bytes,
        url: None,
        index_digest: None,
        index_created: None,
        mismatch_allowed: false,
        version: None,
    })
}

/// Resolve `version` (`1.8.0`, `latest`, `~1.7`) in the repository `repo` and download its
/// archive, checked against the index's digest (a mismatch, or an entry with no digest, is
/// refused unless `allow_mismatch`; then [`FetchedChart::mismatch_allowed`] says so).
pub async fn from_repository(
    http: &HttpFetcher,
    repo: &str,
    version: &str,
    allow_mismatch: bool,
) -> Result<FetchedChart, FetchError> {
    let url = index_url(repo);
    let index_bytes = http
        .get(&url, koord_base::yaml::INDEX.max_bytes)
        .await
        .map_err(|source| FetchError::Index {
            url: url.clone(),
            source,
        })?;
    let chart_err = |context: String| move |source| FetchError::Chart { context, source };
    let index = RepoIndex::parse_chart(&index_bytes, CHART).map_err(chart_err(url.clone()))?;
    let spec = VersionSpec::parse(version).map_err(chart_err("--version".into()))?;
    let entry = index
        .resolve(CHART, &spec)
        .map_err(chart_err(url.clone()))?;
    let url_text = entry.urls.first().ok_or_else(|| FetchError::NoUrls {
        version: entry.version.clone(),
    })?;
    let archive_url = resolve_chart_url(repo, url_text);
    let bytes = http
        .get(&archive_url, super::archive::MAX_UNCOMPRESSED as usize)
        .await
        .map_err(|source| FetchError::Archive {
            url: archive_url.clone(),
            source,
        })?;
    let digest = Digest::of(&bytes);
    // An archive the index does not vouch for (another digest, or none) is taken only when
    // the user says so, and the bundle records it.
    let mismatch_allowed = match &entry.digest {
        Some(expected) => {
            let expected = expected.trim().trim_start_matches("sha256:").to_lowercase();
            if expected != digest.hex() && !allow_mismatch {
                return Err(FetchError::DigestMismatch {
                    url: archive_url,
                    actual: digest.hex().to_string(),
                    expected,
                });
            }
            expected != digest.hex()
        }
        None if !allow_mismatch => {
            return Err(FetchError::NoDigest {
                version: entry.version.clone(),
                url: archive_url,
                actual: digest.hex().to_string(),
            })
        }
        None => true,
    };
    Ok(FetchedChart {
        bytes,
        digest,
        url: Some(archive_url),
        index_digest: entry.digest.clone(),
        index_created: entry.created.clone(),
        mismatch_allowed,
        version: Some(entry.version.clone()),
    })
}

/// The newest modification time of the entries of a gzipped chart archive (for a chart given
/// by hand, whose index entry is unknown): `None` when it cannot be read. Call it on an archive
/// [`super::ChartArchive::from_tgz`] took: that bounds what it unpacks to.
pub fn archive_mtime(bytes: &[u8]) -> Option<u64> {
    let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(bytes));
    let mut newest = None;
    for e in ar.entries().ok()? {
        let m = e.ok()?.header().mtime().ok()?;
        newest = Some(newest.map_or(m, |n: u64| n.max(m)));
    }
    newest
}
