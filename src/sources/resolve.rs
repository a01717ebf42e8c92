//! Each image resolved from the first source that serves it: its candidate references in the
//! order of the sources, each tried in turn; a source that does not have the image, refuses
//! access or cannot be reached is passed over (and named), a graph that is found but cannot be
//! used (platforms, a manifest beyond a bound) stops the build.

use super::{NoSourceError, Origin, SourceError, SourceMap};
use crate::copy::{self, Budget, Graph, WalkError};
use crate::oci::{Digest, DigestError, ImageRef, RefError};
use crate::store::{Reference, Source};
use futures_util::{StreamExt, TryStreamExt};

/// An image to bundle: what the chart deploys, or an `--image` added by hand.
#[derive(Debug, Clone)]
pub struct Wanted {
    /// Name in the layout (`koordinator-sh/koordlet:v1.8.0`).
    pub ref_name: String,
    /// Values path of the component, or `manual` for `--image`.
    pub component: String,
    /// Registry host as the chart renders it (may be empty: Docker Hub).
    pub host: String,
    /// Repository path as in the chart.
    pub repository: String,
    /// Tag.
    pub tag: String,
    /// The reference as the chart renders it (or as given).
    pub original: String,
    /// `--image`: this exact reference, no source mapping.
    pub fixed: Option<ImageRef>,
}

impl Wanted {
    /// An image given by hand (`--image REF`): it needs a tag (the bundle names images by
    /// repository and tag).
    pub fn manual(text: &str) -> Result<Wanted, ResolveError> {
        let r = ImageRef::parse(text)?;
        let tag = r.tag.clone().ok_or_else(|| ResolveError::NoTag {
            image: text.to_string(),
        })?;
        Ok(Wanted {
            ref_name: format!("{}:{tag}", r.repository),
            component: "manual".into(),
            host: r.registry.clone(),
            repository: r.repository.clone(),
            tag,
            original: text.to_string(),
            fixed: Some(r),
        })
    }
}

/// An image, resolved: its graph and the source that served it.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The graph.
    pub graph: Graph,
    /// Label of the source (`ghcr`, `aliyun`, `127.0.0.1:5000`).
    pub source: String,
    /// The reference it was read by.
    pub source_ref: ImageRef,
    /// Sources tried before, with why they did not serve it.
    pub fallbacks: Vec<String>,
}

/// Why an image could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// `--image` without a tag.
    #[error("--image {image}: give a tag (the bundle names images by repository:tag)")]
    NoTag {
        /// As given.
        image: String,
    },
    /// A reference that does not parse.
    #[error("{0}")]
    Ref(#[from] RefError),
    /// A digest that does not parse.
    #[error("{0}")]
    Digest(#[from] DigestError),
    /// A source that cannot be mapped.
    #[error("{0}")]
    Source(#[from] SourceError),
    /// No source served it.
    #[error("{0}")]
    NoSource(#[from] NoSourceError),
    /// A graph that was found but cannot be used.
    #[error("{0}")]
    Walk(#[from] WalkError),
    /// The same, with the image named.
    #[error("image {image} (component {component}): {source}")]
    Image {
        /// As the chart names it.
        image: String,
        /// Its component.
        component: String,
        /// What failed.
        source: Box<ResolveError>,
    },
}

impl crate::exit::Classify for ResolveError {
    fn exit_class(&self) -> Option<crate::exit::ExitClass> {
        match self {
            ResolveError::NoTag { .. } => Some(crate::exit::ExitClass::Input),
            // Each wraps the error that happened (a reference, a source, the walk): it
            // decides.
            ResolveError::Ref(_)
            | ResolveError::Digest(_)
            | ResolveError::Source(_)
            | ResolveError::NoSource(_)
            | ResolveError::Walk(_)
            | ResolveError::Image { .. } => None,
        }
    }
}

/// The candidate references of an image, in order of preference: (label, reference).
pub fn candidates(
    map: &SourceMap,
    sources: &[Origin],
    w: &Wanted,
) -> Result<Vec<(String, ImageRef)>, ResolveError> {
    if let Some(r) = &w.fixed {
        return Ok(vec![(r.registry.clone(), r.clone())]);
    }
    let mut c: Vec<(String, ImageRef)> = Vec::new();
    for s in sources {
        let r = map.map(s, &w.host, &w.repository, &w.tag)?;
        if !c.iter().any(|(_, x)| x == &r) {
            c.push((map.label(s, &r, &w.repository), r));
        }
    }
    Ok(c)
}

/// Resolve one image from the first candidate that serves it.
pub async fn resolve_image<S: Source>(
    store: &S,
    w: &Wanted,
    candidates: &[(String, ImageRef)],
    platforms: Option<&[String]>,
    budget: &Budget,
) -> Result<Resolved, ResolveError> {
    let mut fallbacks = Vec::new();
    let mut unreachable = false;
    for (label, r) in candidates {
        let repo = format!("{}/{}", r.registry, r.repository);
        let reference = match (&r.digest, &r.tag) {
            (Some(d), _) => Reference::Digest(Digest::from_hex(d.trim_start_matches("sha256:"))?),
            (None, t) => Reference::Tag(t.clone().unwrap_or_else(|| "latest".into())),
        };
        match copy::resolve(store, &repo, &reference, platforms, budget).await {
            Ok(graph) => {
                return Ok(Resolved {
                    graph,
                    source: label.clone(),
                    source_ref: r.clone(),
                    fallbacks,
                })
            }
            Err(WalkError::NotFound(e) | WalkError::Store(e)) => {
                unreachable |= e.is_transient();
                fallbacks.push(format!("{label} ({r}): {e}"))
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(NoSourceError {
        image: w.original.clone(),
        tried: fallbacks,
        unreachable,
    }
    .into())
}

/// Every image resolved from the first source that has it, `jobs` at a time; the first failure
/// ends the walk of the rest. The bundle-wide bounds of the walk hold across the images.
pub async fn resolve_all<S: Source>(
    store: &S,
    map: &SourceMap,
    sources: &[Origin],
    wanted: &[Wanted],
    platforms: Option<&[String]>,
    jobs: usize,
) -> Result<Vec<Resolved>, ResolveError> {
    let cands = wanted
        .iter()
        .map(|w| candidates(map, sources, w))
        .collect::<Result<Vec<_>, _>>()?;
    let budget = &Budget::default();
    futures_util::stream::iter(wanted.iter().zip(&cands))
        .map(|(w, c)| async move {
            resolve_image(store, w, c, platforms, budget)
                .await
                .map_err(|e| ResolveError::Image {
                    image: w.original.clone(),
                    component: w.component.clone(),
                    source: Box::new(e),
                })
        })
        .buffered(jobs.max(1))
        .try_collect()
        .await
}
