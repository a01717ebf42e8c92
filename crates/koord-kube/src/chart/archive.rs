//! A chart archive (`helm package` output: a gzip-compressed tar with one top folder), read
//! into memory with limits against malicious archives.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::io::{self, Read};
use std::rc::Rc;

use serde_yaml_ng::Value;

use super::{scalar_to_string, yaml_to_json, ChartError};

/// Maximum total uncompressed size of the tar stream (headers included).
pub const MAX_UNCOMPRESSED: u64 = 64 * 1024 * 1024;
/// Maximum number of tar entries (of any type).
pub const MAX_ENTRIES: usize = 10_000;

/// The metadata of `Chart.yaml`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ChartMeta {
    /// `apiVersion` (`v1` when absent, as Helm does for old charts).
    pub api_version: String,
    /// Chart name.
    pub name: String,
    /// Chart version, as written.
    pub version: String,
    /// `appVersion`, if any (numbers rendered as text).
    pub app_version: Option<String>,
    /// `description`, if any.
    pub description: Option<String>,
    /// The whole `Chart.yaml` converted to JSON (unknown fields included).
    #[serde(default)]
    pub raw: serde_json::Value,
}

/// A chart read from its archive: every regular file, keyed by its path relative to the chart
/// root (`Chart.yaml`, `templates/koordlet.yaml`, ...), plus parsed metadata and values.
#[derive(Debug, Clone)]
pub struct ChartArchive {
    top_dir: String,
    files: BTreeMap<String, Vec<u8>>,
    meta: ChartMeta,
    values: Value,
}

/// Counts bytes read and fails once more than the limit has been read.
struct Limited<R> {
    inner: R,
    read: u64,
    limit: u64,
    exceeded: Rc<Cell<bool>>,
}

impl<R: Read> Read for Limited<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.read > self.limit {
            self.exceeded.set(true);
            return Err(io::Error::other("uncompressed size limit exceeded"));
        }
        Ok(n)
    }
}

fn too_large(what: String) -> ChartError {
    ChartError::ArchiveTooLarge {
        limit: format!("{} MiB uncompressed", MAX_UNCOMPRESSED / (1024 * 1024)),
        what,
    }
}

/// Check one archive path and split it into (top folder, path below it).
fn split_path(raw: &[u8]) -> Result<(String, String), ChartError> {
    let shown = String::from_utf8_lossy(raw).into_owned();
    let unsafe_path = |reason: &str| ChartError::UnsafePath {
        path: shown.clone(),
        reason: reason.to_string(),
    };
    let s = std::str::from_utf8(raw).map_err(|_| unsafe_path("not valid UTF-8"))?;
    if s.contains('\0') {
        return Err(unsafe_path("contains a NUL byte"));
    }
    let s = s.replace('\\', "/");
    if s.starts_with('/') || s.as_bytes().get(1) == Some(&b':') {
        return Err(unsafe_path("absolute path"));
    }
    let mut parts = Vec::new();
    for comp in s.split('/') {
        match comp {
            "" | "." => {}
            ".." => return Err(unsafe_path("refers to a parent directory (`..`)")),
            c => parts.push(c),
        }
    }
    match parts.split_first() {
        None => Err(unsafe_path("empty path")),
        Some((_, [])) => Err(unsafe_path("file outside the chart's top folder")),
        Some((top, rest)) => Ok((top.to_string(), rest.join("/"))),
    }
}

fn parse_yaml(file: &str, bytes: &[u8]) -> Result<Value, ChartError> {
    // Bounded in size, depth and nodes before the parser builds anything (koord_base::yaml).
    let limits = if file == "Chart.yaml" {
        koord_base::yaml::CHART_YAML
    } else {
        koord_base::yaml::VALUES
    };
    let invalid = |reason: String| ChartError::InvalidYaml {
        file: file.to_string(),
        reason,
    };
    // Values are only read for the names of components' image repositories (helm renders
    // the chart): YAML 1.1's booleans (`enabled: no`) need no special reading.
    let mut v =
        koord_base::yaml::parse_value(file, bytes, &limits).map_err(|e| invalid(e.reason()))?;
    v.apply_merge()
        .map_err(|e| invalid(format!("merge keys: {e}")))?;
    Ok(v)
}

fn meta_from(chart_yaml: &Value) -> Result<ChartMeta, ChartError> {
    let invalid = |reason: String| ChartError::InvalidYaml {
        file: "Chart.yaml".into(),
        reason,
    };
    let Value::Mapping(m) = chart_yaml else {
        return Err(invalid("not a mapping".into()));
    };
    let required = |key: &str| -> Result<String, ChartError> {
        match m.get(key) {
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(s.clone()),
            Some(Value::String(_)) | None | Some(Value::Null) => {
                Err(invalid(format!("`{key}` is missing")))
            }
            Some(other) => Err(invalid(format!(
                "`{key}` must be a string, found {other:?}"
            ))),
        }
    };
    Ok(ChartMeta {
        api_version: m
            .get("apiVersion")
            .and_then(scalar_to_string)
            .unwrap_or_else(|| "v1".to_string()),
        name: required("name")?,
        version: required("version")?,
        app_version: m.get("appVersion").and_then(scalar_to_string),
        description: m.get("description").and_then(scalar_to_string),
        raw: yaml_to_json(chart_yaml),
    })
}

impl ChartArchive {
    /// Read a chart archive (gzip-compressed tar whose entries all sit under one top folder,
    /// e.g. `koordinator/`).
    ///
    /// Refused: absolute paths, `..` components, files outside the top folder or under more
    /// than one top folder, duplicate files, more than [`MAX_UNCOMPRESSED`] bytes of tar stream
    /// or [`MAX_ENTRIES`] entries. Directories, links and other non-regular entries are
    /// skipped. `Chart.yaml` (with `name` and `version`) is required; `values.yaml` is
    /// optional (an empty mapping when absent or empty).
    pub fn from_tgz(bytes: &[u8]) -> Result<Self, ChartError> {
        let exceeded = Rc::new(Cell::new(false));
        let reader = Limited {
            inner: flate2::read::MultiGzDecoder::new(bytes),
            read: 0,
            limit: MAX_UNCOMPRESSED,
            exceeded: Rc::clone(&exceeded),
        };
        let mut archive = tar::Archive::new(reader);
        let io_err = |e: io::Error, exceeded: &Cell<bool>| {
            if exceeded.get() {
                too_large("the tar stream is larger".into())
            } else {
                ChartError::InvalidArchive {
                    reason: format!("not a readable gzip-compressed tar: {e}"),
                }
            }
        };
        let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        let mut top_dir: Option<String> = None;
        let mut total: u64 = 0;
        let entries = archive.entries().map_err(|e| io_err(e, &exceeded))?;
        for (count, entry) in entries.enumerate() {
            if count >= MAX_ENTRIES {
                return Err(ChartError::ArchiveTooLarge {
                    limit: format!("{MAX_ENTRIES} entries"),
                    what: "the archive has more entries".into(),
                });
            }
            let mut entry = entry.map_err(|e| io_err(e, &exceeded))?;
            let kind = entry.header().entry_type();
            if !(kind.is_file() || kind == tar::EntryType::Continuous) {
                continue;
            }
            let raw_path = entry.path_bytes().into_owned();
            let (top, rel) = split_path(&raw_path)?;
            match &top_dir {
                None => top_dir = Some(top),
                Some(t) if *t == top => {}
                Some(t) => {
                    return Err(ChartError::UnsafePath {
                        path: String::from_utf8_lossy(&raw_path).into_owned(),
                        reason: format!(
                            "outside the chart's top folder {t:?} (more than one top folder)"
                        ),
                    })
                }
            }
            let size = entry.header().size().map_err(|e| io_err(e, &exceeded))?;
            total = total.saturating_add(size);
            if total > MAX_UNCOMPRESSED {
                return Err(too_large(format!("files add up to more (at {rel:?})")));
            }
            let mut data = Vec::with_capacity(usize::try_from(size).unwrap_or(0).min(1 << 20));
            entry
                .read_to_end(&mut data)
                .map_err(|e| io_err(e, &exceeded))?;
            if files.contains_key(&rel) {
                return Err(ChartError::UnsafePath {
                    path: String::from_utf8_lossy(&raw_path).into_owned(),
                    reason: "the archive holds this file twice".into(),
                });
            }
            files.insert(rel, data);
        }
        let Some(top_dir) = top_dir else {
            return Err(ChartError::InvalidArchive {
                reason: "the archive holds no files".into(),
            });
        };
        let chart_yaml = files
            .get("Chart.yaml")
            .ok_or_else(|| ChartError::MissingFile {
                file: "Chart.yaml".into(),
            })?;
        let meta = meta_from(&parse_yaml("Chart.yaml", chart_yaml)?)?;
        let values = match files.get("values.yaml") {
            None => Value::Mapping(Default::default()),
            Some(bytes) => match parse_yaml("values.yaml", bytes)? {
                Value::Null => Value::Mapping(Default::default()),
                v @ Value::Mapping(_) => v,
                _ => {
                    return Err(ChartError::InvalidYaml {
                        file: "values.yaml".into(),
                        reason: "the top level is not a mapping".into(),
                    })
                }
            },
        };
        Ok(ChartArchive {
            top_dir,
            files,
            meta,
            values,
        })
    }

    /// The metadata of `Chart.yaml`.
    pub fn meta(&self) -> &ChartMeta {
        &self.meta
    }

    /// `Chart.yaml` converted to JSON, all fields kept. This is what goes into the Helm OCI
    /// config blob. (Helm itself writes `json.Marshal` of its `Metadata` struct: the known
    /// fields only, in struct order; registries and `helm pull` do not compare it to the
    /// chart.)
    pub fn chart_yaml_json(&self) -> &serde_json::Value {
        &self.meta.raw
    }

    /// `values.yaml` (an empty mapping if the chart has none). YAML merge keys (`<<`) are
    /// applied, as Helm does.
    pub fn values(&self) -> &Value {
        &self.values
    }

    /// The name of the archive's top folder (normally the chart name).
    pub fn top_dir(&self) -> &str {
        &self.top_dir
    }

    /// The bytes of one file, by path relative to the chart root (`values.yaml`,
    /// `templates/koordlet.yaml`).
    pub fn file(&self, path: &str) -> Option<&[u8]> {
        self.files.get(path).map(Vec::as_slice)
    }

    /// Every file of the chart, sorted by path.
    pub fn files(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.files.iter().map(|(k, v)| (k.as_str(), v.as_slice()))
    }

    /// Every file under `templates/` (any depth, helpers and `NOTES.txt` included), sorted by
    /// path.
    pub fn templates(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.files().filter(|(k, _)| k.starts_with("templates/"))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use flate2::write::GzEncoder;
    use std::io::Write;

    pub(crate) const V041: &[u8] =
        include_bytes!("../../../../tests/fixtures/charts/koordinator-0.4.1.tgz");
    pub(crate) const V111: &[u8] =
        include_bytes!("../../../../tests/fixtures/charts/koordinator-1.1.1.tgz");
    pub(crate) const V141: &[u8] =
        include_bytes!("../../../../tests/fixtures/charts/koordinator-1.4.1.tgz");
    pub(crate) const V160: &[u8] =
        include_bytes!("../../../../tests/fixtures/charts/koordinator-1.6.0.tgz");
    pub(crate) const V180: &[u8] =
        include_bytes!("../../../../tests/fixtures/charts/koordinator-1.8.0.tgz");

    pub(crate) const ALL: [(&str, &[u8]); 5] = [
        ("0.4.1", V041),
        ("1.1.1", V111),
        ("1.4.1", V141),
        ("1.6.0", V160),
        ("1.8.0", V180),
    ];

    /// Every published chart version: (version, archive, images deployed with the default
    /// values, CRDs), the counts as `helm template` renders them (helm 3.17.3).
    pub(crate) const EVERY: [(&str, &[u8], usize, usize); 21] = [
        (
            "0.1.0",
            include_bytes!("../../../../tests/fixtures/charts/koordinator-0.1.0.tgz"),
            3,
            3,
        ),
        (
            "0.2.0",
            include_bytes!("../../../../tests/fixtures/charts/koordinator-0.2.0.tgz"),
            3,
            3,
        ),
        (
            "0.3.0",
            include_bytes!("../../../../tests/fixtures/charts/koordinator-0.3.0.tgz"),
            3,
            3,
        ),
        (
            "0.3.1",
            include_bytes!("../../../../tests/fixtures/charts/koordinator-0.3.1.tgz"),
            3,
            3,
        ),
        (
            "0.4.0",
            include_bytes!("../../../../tests/fixtures/charts/koordinator-0.4.0.tgz"),
            3,
            3,
        ),
        (
            "0.4.1",
            include_bytes!("../../../../tests/fixtures/charts/koordinator-0.4.1.tgz"),
            3,
            3,
        ),
        (
            "0.5.0",
            include_bytes!("../../../../tests/fixtures/charts/koordinator-0.5.0.tgz"),
            3,
            4,
        ),
        (
            "0.6.0",
            include_bytes!("../../../../tests/fixtures/charts/koordinator-0.6.0.tgz"),
            4,
            7,
        ),
        (
            "0.6.2",
            include_bytes!("../../../../tests/fixtures/charts/koordinator-0.6.2.tgz"),
            4,
            7,
        ),
        (
            "0.7.0",
            include_bytes!("../../../../tests/fixtures/charts/koordinator-0.7.0.tgz"),
            4,
            9,
        ),
        (
            "1.0.0",
            include_bytes!("../../../../tests/fixtures/charts/koordinator-1.0.0.tgz"),
            4,
            9,
        ),
        (
            "1.1.0",
            include_bytes!("../../../../tests/fixtures/charts/koordinator-1.1.0.tgz"),
            4,
            9,
        ),
        (
            "1.1.1",
            include_bytes!("../../../../tests/fixtures/charts/koordinator-1.1.1.tgz"),
            4,
            9,
        ),
        (
            "1.2.0",
            include_bytes!("../../../../tests/fixtures/charts/koordinator-1.2.0.tgz"),
            4,
            9,
        ),
        (
            "1.3.0",
            include_bytes!("../../../../tests/fixtures/charts/koordinator-1.3.0.tgz"),
            4,
            9,
        ),
        (
            "1.4.0",
            include_bytes!("../../../../tests/fixtures/charts/koordinator-1.4.0.tgz"),
            4,
            10,
        ),
        (
            "1.4.1",
            include_bytes!("../../../../tests/fixtures/charts/koordinator-1.4.1.tgz"),
            4,
            10,
        ),
        (
            "1.5.0",
            include_bytes!("../../../../tests/fixtures/charts/koordinator-1.5.0.tgz"),
            4,
            11,
        ),
        (
            "1.6.0",
            include_bytes!("../../../../tests/fixtures/charts/koordinator-1.6.0.tgz"),
            4,
            11,
        ),
        (
            "1.7.0",
            include_bytes!("../../../../tests/fixtures/charts/koordinator-1.7.0.tgz"),
            5,
            13,
        ),
        (
            "1.8.0",
            include_bytes!("../../../../tests/fixtures/charts/koordinator-1.8.0.tgz"),
            5,
            13,
        ),
    ];

    /// The `Chart.yaml` of the small charts the unit tests write.
    pub(crate) const TEST_CHART_YAML: &str = "apiVersion: v2\nname: c\nversion: 1.0.0\n";

    /// A chart `c` of `files` (chart-relative path, text; `Chart.yaml` among them), read back.
    pub(crate) fn chart_of(files: &[(&str, &str)]) -> ChartArchive {
        let paths: Vec<String> = files.iter().map(|(p, _)| format!("c/{p}")).collect();
        let entries: Vec<(&str, tar::EntryType, &[u8])> = paths
            .iter()
            .zip(files)
            .map(|(p, (_, text))| (p.as_str(), tar::EntryType::Regular, text.as_bytes()))
            .collect();
        ChartArchive::from_tgz(&tgz(&entries)).expect("chart")
    }

    /// Build a .tgz from (path, type, data); raw header names so that unsafe paths can be written.
    pub(crate) fn tgz(entries: &[(&str, tar::EntryType, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        {
            let gz = GzEncoder::new(&mut out, flate2::Compression::fast());
            let mut b = tar::Builder::new(gz);
            for (path, kind, data) in entries {
                let mut h = tar::Header::new_old();
                {
                    let name = &mut h.as_old_mut().name;
                    let bytes = path.as_bytes();
                    name[..bytes.len()].copy_from_slice(bytes);
                }
                h.set_entry_type(*kind);
                h.set_size(data.len() as u64);
                h.set_mode(0o644);
                h.set_cksum();
                b.append(&h, *data).expect("append");
            }
            b.into_inner()
                .expect("finish tar")
                .finish()
                .expect("finish gz");
        }
        out
    }

    const CHART: &[u8] =
        b"apiVersion: v2\nname: demo\nversion: 0.1.0\nappVersion: 1.16\nextra:\n  a: [1, 2]\n";

    #[test]
    fn reads_every_fixture() {
        for (version, bytes) in ALL {
            let c = ChartArchive::from_tgz(bytes).expect(version);
            assert_eq!(c.meta().name, "koordinator");
            assert_eq!(c.meta().version, version);
            assert_eq!(c.meta().app_version.as_deref(), Some(version));
            assert_eq!(c.meta().api_version, "v2");
            assert_eq!(
                c.meta().description.as_deref(),
                Some("A Helm chart for Koordinator")
            );
            assert_eq!(c.top_dir(), "koordinator");
            assert_eq!(c.chart_yaml_json()["home"], "https://koordinator.sh");
            assert_eq!(c.chart_yaml_json()["keywords"][1], "co-location");
            assert!(c.values().get("manager").is_some());
            assert!(c
                .file("values.yaml")
                .is_some_and(|b| b.starts_with(b"# Default values")));
            assert!(c.file("templates/koord-manager.yaml").is_some());
            assert!(c.templates().all(|(p, _)| p.starts_with("templates/")));
            assert!(c.templates().any(|(p, _)| p == "templates/_helpers.tpl"));
            assert!(c.files().any(|(p, _)| p == ".helmignore"));
        }
        let c = ChartArchive::from_tgz(V180).expect("1.8.0");
        assert!(c
            .file("templates/crd/scheduling.koordinator.sh_reservations.yaml")
            .is_some());
        assert_eq!(
            c.values()["imageRepositoryHost"],
            "registry.cn-beijing.aliyuncs.com"
        );
    }

    #[test]
    fn minimal_chart_without_values() {
        let bytes = tgz(&[
            ("demo/", tar::EntryType::Directory, b""),
            ("demo/Chart.yaml", tar::EntryType::Regular, CHART),
            (
                "./demo/templates/a.yaml",
                tar::EntryType::Regular,
                b"kind: A\n",
            ),
            ("demo/link", tar::EntryType::Symlink, b""),
        ]);
        let c = ChartArchive::from_tgz(&bytes).expect("read");
        assert_eq!(c.meta().app_version.as_deref(), Some("1.16"));
        assert_eq!(c.chart_yaml_json()["extra"]["a"][1], 2);
        assert_eq!(c.values(), &Value::Mapping(Default::default()));
        assert_eq!(c.file("templates/a.yaml"), Some(&b"kind: A\n"[..]));
        assert!(c.file("link").is_none());
        let json = serde_json::to_value(c.meta()).expect("serialize");
        assert_eq!(json["name"], "demo");
    }

    #[test]
    fn refuses_bad_archives() {
        let r = |entries: &[(&str, tar::EntryType, &[u8])]| ChartArchive::from_tgz(&tgz(entries));
        let reg = tar::EntryType::Regular;
        assert!(matches!(
            r(&[("/etc/passwd", reg, b"x")]),
            Err(ChartError::UnsafePath { .. })
        ));
        assert!(matches!(
            r(&[("demo/../../x", reg, b"x")]),
            Err(ChartError::UnsafePath { .. })
        ));
        assert!(matches!(
            r(&[("Chart.yaml", reg, CHART)]),
            Err(ChartError::UnsafePath { .. })
        ));
        assert!(matches!(
            r(&[("demo/Chart.yaml", reg, CHART), ("other/x", reg, b"")]),
            Err(ChartError::UnsafePath { .. })
        ));
        assert!(matches!(
            r(&[
                ("demo/Chart.yaml", reg, CHART),
                ("demo/./Chart.yaml", reg, CHART)
            ]),
            Err(ChartError::UnsafePath { .. })
        ));
        assert!(matches!(
            r(&[("demo/values.yaml", reg, b"a: 1")]),
            Err(ChartError::MissingFile { .. })
        ));
        let err = r(&[("demo/Chart.yaml", reg, b"name: demo\n")]).expect_err("no version");
        assert!(
            err.to_string().contains("Chart.yaml") && err.to_string().contains("version"),
            "{err}"
        );
        let err = r(&[
            ("demo/Chart.yaml", reg, CHART),
            ("demo/values.yaml", reg, b"a: ["),
        ])
        .expect_err("yaml");
        assert!(err.to_string().starts_with("values.yaml:"), "{err}");
        let err = r(&[
            ("demo/Chart.yaml", reg, CHART),
            ("demo/values.yaml", reg, b"- 1"),
        ])
        .expect_err("list");
        assert!(err.to_string().contains("values.yaml"), "{err}");
        assert!(matches!(
            ChartArchive::from_tgz(b"not gzip"),
            Err(ChartError::InvalidArchive { .. })
        ));
        assert!(matches!(
            ChartArchive::from_tgz(&V180[..V180.len() / 2]),
            Err(ChartError::InvalidArchive { .. })
        ));
        assert!(matches!(
            ChartArchive::from_tgz(&tgz(&[])),
            Err(ChartError::InvalidArchive { .. })
        ));
    }

    #[test]
    fn refuses_bombs() {
        // 65 MiB of zeros compresses to ~65 KiB.
        let big = vec![0u8; 65 * 1024 * 1024];
        let bytes = tgz(&[
            ("demo/Chart.yaml", tar::EntryType::Regular, CHART),
            ("demo/big", tar::EntryType::Regular, &big),
        ]);
        assert!(bytes.len() < 1024 * 1024);
        let err = ChartArchive::from_tgz(&bytes).expect_err("too big");
        assert!(matches!(err, ChartError::ArchiveTooLarge { .. }), "{err}");

        // A raw gzip stream of zeros (not even a tar): must stop at the limit, not read it all.
        let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let chunk = vec![0u8; 1024 * 1024];
        for _ in 0..80 {
            gz.write_all(&chunk).expect("write");
        }
        let zeros = gz.finish().expect("gz");
        // All-zero blocks are an end-of-archive marker for tar: no entries, no error about size.
        assert!(ChartArchive::from_tgz(&zeros).is_err());

        // A GNU long-name header whose "name" is 70 MiB: read into memory by the tar reader
        // itself, so only the stream limit stops it.
        let long = vec![b'a'; 70 * 1024 * 1024];
        let bytes = tgz(&[
            ("././@LongLink", tar::EntryType::GNULongName, &long),
            ("demo/x", tar::EntryType::Regular, b""),
        ]);
        let err = ChartArchive::from_tgz(&bytes).expect_err("too big");
        assert!(matches!(err, ChartError::ArchiveTooLarge { .. }), "{err}");

        let many: Vec<(String, tar::EntryType, &[u8])> = (0..=MAX_ENTRIES)
            .map(|i| (format!("demo/f{i}"), tar::EntryType::Regular, &b""[..]))
            .collect();
        let refs: Vec<(&str, tar::EntryType, &[u8])> =
            many.iter().map(|(p, k, d)| (p.as_str(), *k, *d)).collect();
        let err = ChartArchive::from_tgz(&tgz(&refs)).expect_err("too many");
        assert!(matches!(err, ChartError::ArchiveTooLarge { .. }), "{err}");
    }
}
