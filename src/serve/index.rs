//! What `serve` answers from: every repository and tag of a [`Catalog`] source, each walked
//! once by the copy engine's walk, so that a repository holds exactly what its tags reach (the
//! top manifest, the child manifests of an index, their configs and layers), with the same
//! rules as every other command (nested indexes, descriptors checked).

use crate::copy::{self, WalkError};
use crate::oci::{Descriptor, Digest};
use crate::store::{Catalog, RawManifest, Reference};
use std::collections::{BTreeMap, HashMap, HashSet};

/// A repository: its tags, the manifests and blobs they reach.
#[derive(Debug, Default, Clone)]
pub struct Repository {
    /// Tag → top manifest digest.
    pub tags: BTreeMap<String, Digest>,
    pub(crate) manifests: HashSet<Digest>,
    pub(crate) blobs: HashSet<Digest>,
}

/// Everything served.
#[derive(Debug, Default)]
pub struct Index {
    /// Repositories by name.
    pub repos: BTreeMap<String, Repository>,
    /// Every manifest, held in memory (small; served as read once).
    pub(crate) manifests: HashMap<Digest, RawManifest>,
    /// Every other blob's descriptor (read from the source when asked for).
    pub(crate) blobs: HashMap<Digest, Descriptor>,
}

impl Index {
    /// Walk every tag the source lists.
    pub async fn build<S: Catalog>(src: &S) -> Result<Index, WalkError> {
        let mut ix = Index::default();
        let budget = copy::Budget::default();
        for (name, tags) in src.catalog() {
            let mut repo = Repository::default();
            for tag in tags {
                let g =
                    copy::resolve(src, &name, &Reference::Tag(tag.clone()), None, &budget).await?;
                repo.tags.insert(tag, g.top.digest.clone());
                for m in g.manifests() {
                    repo.manifests.insert(m.digest.clone());
                    ix.manifests
                        .entry(m.digest.clone())
                        .or_insert_with(|| m.clone());
                }
                for b in &g.blobs {
                    repo.blobs.insert(b.digest.clone());
                    ix.blobs
                        .entry(b.digest.clone())
                        .or_insert_with(|| b.clone());
                }
            }
            ix.repos.insert(name, repo);
        }
        Ok(ix)
    }

    /// Every (repository, tag) served, for printing.
    pub fn tags(&self) -> Vec<(String, String)> {
        self.repos
            .iter()
            .flat_map(|(r, repo)| repo.tags.keys().map(move |t| (r.clone(), t.clone())))
            .collect()
    }
}
