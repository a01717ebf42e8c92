//! Image sources: where each image the chart names can be pulled from, in order of preference.
//! The named sources are data (`bundle-spec/sources.json`), compiled in.

pub mod resolve;

use crate::oci::{ImageRef, RefError, Target, TargetError};
use serde::Deserialize;
use std::collections::BTreeMap;

const SOURCES_JSON: &str = include_str!("../../bundle-spec/sources.json");

/// The source map as data.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceMap {
    /// Namespaces the chart's repositories start with; stripped to get the image name.
    pub chart_namespaces: Vec<String>,
    /// Default order (`@chart` is the chart's own `imageRepositoryHost`).
    pub default: Vec<String>,
    /// Named sources.
    pub sources: BTreeMap<String, NamedSource>,
}

/// A named source: a registry and the namespace under which Koordinator's images live.
#[derive(Debug, Clone, Deserialize)]
pub struct NamedSource {
    /// Registry host.
    pub registry: String,
    /// Repository namespace (`koordinator-sh` or `koordinatorsh`).
    pub namespace: String,
    /// What it is.
    pub description: String,
}

/// One source a user can pick with `--source`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The chart's own `imageRepositoryHost` (DockerHub when empty).
    Chart,
    /// A named source of the map.
    Named(String),
    /// `HOST[:PORT][/PATH]`: replaces the chart's `imageRepositoryHost`.
    Custom(String),
}

/// A source that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// Neither a known name nor a registry host.
    #[error("unknown source {0:?}: use one of {1}, or a registry HOST[:PORT][/PATH]")]
    Unknown(String, String),
    /// `user:password@host`: refused, and never echoed.
    #[error("--source {0}: a source must not carry a user or password (it would be echoed in messages and kept in shell history): give HOST[:PORT][/PATH] and log in with `docker login HOST` (koord-bundle reads the container auth files and credential helpers)")]
    Userinfo(String),
    /// The mapped reference is not valid.
    #[error(transparent)]
    Ref(#[from] RefError),
    /// `HOST[:PORT][/PATH]` that breaks a rule of the reference grammar (named).
    #[error(transparent)]
    Address(#[from] TargetError),
}

impl crate::exit::Classify for SourceError {
    fn exit_class(&self) -> Option<crate::exit::ExitClass> {
        match self {
            SourceError::Unknown(..) | SourceError::Userinfo(_) => {
                Some(crate::exit::ExitClass::Input)
            }
            SourceError::Ref(r) => crate::exit::Classify::exit_class(r),
            SourceError::Address(a) => crate::exit::Classify::exit_class(a),
        }
    }
}

/// No source served an image; each one tried is named with why.
#[derive(Debug, thiserror::Error)]
#[error("no source has {image}:\n  {}", tried.join("\n  "))]
pub struct NoSourceError {
    /// The image as the chart names it.
    pub image: String,
    /// `label (reference): why`, one per source tried, in order.
    pub tried: Vec<String>,
    /// At least one source could not be reached (after its retries): another try later may
    /// find the image there.
    pub unreachable: bool,
}

impl crate::exit::Classify for NoSourceError {
    fn exit_class(&self) -> Option<crate::exit::ExitClass> {
        // One source unreachable is enough: the image may be there on the next try.
        Some(if self.unreachable {
            crate::exit::ExitClass::Machine
        } else {
            crate::exit::ExitClass::Input
        })
    }
}

impl SourceMap {
    /// The compiled-in map.
    pub fn builtin() -> Self {
        // The file is part of this crate and checked by a unit test: a parse failure is a bug.
        serde_json::from_str(SOURCES_JSON).expect("bundle-spec/sources.json is valid")
    }

    /// Parse a `--source` value.
    pub fn parse_source(&self, s: &str) -> Result<Origin, SourceError> {
        if s == "@chart" || s == "chart" {
            return Ok(Origin::Chart);
        }
        if self.sources.contains_key(s) {
            return Ok(Origin::Named(s.to_string()));
        }
        if let Some(at) = s.rfind('@') {
            return Err(SourceError::Userinfo(format!(
                "USER:PASSWORD@{}",
                &s[at + 1..]
            )));
        }
        let host = s.split('/').next().unwrap_or("");
        if host.contains('.') || host.contains(':') || host == "localhost" {
            let t = Target::parse_for("--source", s)?;
            return Ok(Origin::Custom(t.host_and_prefix()));
        }
        let names: Vec<_> = std::iter::once("chart")
            .chain(self.sources.keys().map(String::as_str))
            .collect();
        Err(SourceError::Unknown(s.to_string(), names.join(", ")))
    }

    /// The default order.
    pub fn default_sources(&self) -> Vec<Origin> {
        self.default
            .iter()
            .filter_map(|s| self.parse_source(s).ok())
            .collect()
    }

    /// The image name: the chart repository without a known namespace, or `None` when the
    /// repository is not under one (then named sources use the whole path).
    fn image_name<'a>(&self, repository: &'a str) -> &'a str {
        for ns in &self.chart_namespaces {
            if let Some(rest) = repository
                .strip_prefix(ns.as_str())
                .and_then(|r| r.strip_prefix('/'))
            {
                return rest;
            }
        }
        repository
    }

    /// Where `source` publishes the chart image `host/repository:tag`.
    pub fn map(
        &self,
        source: &Origin,
        host: &str,
        repository: &str,
        tag: &str,
    ) -> Result<ImageRef, SourceError> {
        let text = match source {
            Origin::Chart if host.is_empty() => format!("docker.io/{repository}:{tag}"),
            Origin::Chart => format!("{host}/{repository}:{tag}"),
            Origin::Custom(prefix) => format!("{prefix}/{repository}:{tag}"),
            Origin::Named(name) => {
                let s = &self.sources[name];
                format!(
                    "{}/{}/{}:{tag}",
                    s.registry,
                    s.namespace,
                    self.image_name(repository)
                )
            }
        };
        Ok(ImageRef::parse(&text)?)
    }

    /// A name for the record: the named source whose mapping equals `r`, else the source's text.
    pub fn label(&self, source: &Origin, r: &ImageRef, repository: &str) -> String {
        match source {
            Origin::Named(n) => n.clone(),
            Origin::Custom(c) => c.clone(),
            Origin::Chart => self
                .sources
                .iter()
                .find(|(_, s)| {
                    s.registry == r.registry
                        && r.repository
                            == format!("{}/{}", s.namespace, self.image_name(repository))
                })
                .map(|(n, _)| n.clone())
                .unwrap_or_else(|| format!("chart ({})", r.registry)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn maps_sources() {
        let m = SourceMap::builtin();
        let gh = m.parse_source("ghcr").unwrap();
        let r = m
            .map(
                &gh,
                "registry.cn-beijing.aliyuncs.com",
                "koordinator-sh/koordlet",
                "v1.8.0",
            )
            .unwrap();
        assert_eq!(r.to_string(), "ghcr.io/koordinator-sh/koordlet:v1.8.0");
        let dh = m.parse_source("dockerhub").unwrap();
        let r = m.map(&dh, "", "koordinator-sh/koordlet", "v1.8.0").unwrap();
        assert_eq!(r.to_string(), "docker.io/koordinatorsh/koordlet:v1.8.0");
        let r = m
            .map(&Origin::Chart, "", "koordinatorsh/koordlet", "v0.4.1")
            .unwrap();
        assert_eq!(r.to_string(), "docker.io/koordinatorsh/koordlet:v0.4.1");
        let c = m.parse_source("127.0.0.1:5000/mirror").unwrap();
        let r = m
            .map(
                &c,
                "registry.cn-beijing.aliyuncs.com",
                "koordinator-sh/koordlet",
                "v1",
            )
            .unwrap();
        assert_eq!(
            r.to_string(),
            "127.0.0.1:5000/mirror/koordinator-sh/koordlet:v1"
        );
        let r = m
            .map(
                &Origin::Chart,
                "registry.cn-beijing.aliyuncs.com",
                "koordinator-sh/koordlet",
                "v1",
            )
            .unwrap();
        assert_eq!(
            m.label(&Origin::Chart, &r, "koordinator-sh/koordlet"),
            "aliyun"
        );
        assert!(m.parse_source("nosuch").is_err());
        let e = m
            .parse_source("127.0.0.1:5000/Mirror")
            .unwrap_err()
            .to_string();
        assert!(e.contains("--source") && e.contains("lower case"), "{e}");
        let e = m.parse_source("127.0.0.1:500o").unwrap_err().to_string();
        assert!(e.contains("port \"500o\""), "{e}");
        assert_eq!(m.default_sources().len(), 3);
    }
}
