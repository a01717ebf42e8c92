//! Find the container images a chart deploys, for given values, without a template engine.
//!
//! Rules (written for the Koordinator charts, strict so that nothing is silently missed):
//!
//! * Every rendered file under `templates/` is read (not partials `_*`, not `NOTES.txt`, not
//!   `templates/crd/` nor any file that declares a `CustomResourceDefinition`).
//! * An image is the value of a YAML `image:` key with a value on the same line (`image: x`,
//!   `- image: x`, quoted or not). Keys without a value on the line (a mapping follows) and
//!   YAML comment lines are not images.
//! * Control structures are followed: `if`/`else if`/`else`/`with`/`range` on plain values
//!   references (`.Values.a.b`, `not`, `and`, `or`) are evaluated with the given values, so
//!   the 0.1–0.4 charts' `if .Values.imageRepositoryHost` / `else` pair yields one line per
//!   component. A line under a condition that cannot be evaluated (`semverCompare`,
//!   `.Capabilities`...) is taken (better one image too many in an air-gapped bundle than one
//!   too few). Lines in branches known not to render are ignored; lines in `define` blocks
//!   too.
//! * The value may only contain text and plain `{{ .Values.a.b }}` references (trim markers
//!   allowed) to scalar values. Anything else (`include`, pipelines, `.Chart`, a missing,
//!   null or non-scalar value) fails with [`ChartError::UnresolvedImage`].
//! * Cross-check: every `<component>.image.repository` of the values (a mapping `image` with
//!   a `repository` key, at any depth of mappings) must be used by some `image:` line
//!   (rendered or not). Otherwise [`ChartError::UnusedImageValue`]: a misspelt `--set` or an
//!   image the chart deploys some other way must be looked at, not ignored.
//! * A chart with subcharts (`charts/`) is refused ([`ChartError::UnsupportedChart`]).

use std::collections::BTreeSet;
use std::sync::OnceLock;

use regex::Regex;
use serde_yaml_ng::Value;

use super::template::{lookup, tokenize, values_ref, Flow, Token, Tri};
use super::{line_of, scalar_to_string, ChartArchive, ChartError};

/// A container image a chart deploys.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ChartImage {
    /// Values path of the component (`manager`, `deviceDaemon`); for an image line without
    /// a `<component>.image.repository` reference: the one values path it uses, or "" for a
    /// literal.
    pub component: String,
    /// Registry host as rendered (the evaluated `imageRepositoryHost`); may be "".
    pub host: String,
    /// Repository as in the values (`koordinator-sh/koord-manager`).
    pub repository: String,
    /// Tag (`v1.8.0`); `latest` when the line renders none, as the kubelet would.
    pub tag: String,
    /// Template that deploys it (`templates/koord-manager.yaml`).
    pub template: String,
}

impl ChartImage {
    /// `host/repository:tag`, or `repository:tag` when the host is empty.
    pub fn reference(&self) -> String {
        if self.host.is_empty() {
            format!("{}:{}", self.repository, self.tag)
        } else {
            format!("{}/{}:{}", self.host, self.repository, self.tag)
        }
    }
}

fn re(cell: &'static OnceLock<Regex>, pattern: &str) -> &'static Regex {
    cell.get_or_init(|| Regex::new(pattern).expect("valid regex literal"))
}

fn image_key_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(
        &R,
        r#"^([ \t]*(?:-[ \t]+)?)(?:image|"image"|'image')[ \t]*:(?:[ \t]|$)"#,
    )
}

fn repo_use_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(
        &R,
        r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)*?)\.image\.repository\b",
    )
}

fn crd_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(
        &R,
        r#"(?m)^kind:[ \t]*["']?CustomResourceDefinition["']?[ \t]*\r?$"#,
    )
}

/// Does this text declare a CustomResourceDefinition (a top-level `kind:` line)?
pub(crate) fn declares_crd(text: &str) -> bool {
    crd_re().is_match(text)
}

/// Is this chart file rendered as a manifest by Helm (not a partial, not NOTES.txt)?
pub(crate) fn is_rendered_template(path: &str) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path);
    path.starts_with("templates/") && !base.starts_with('_') && base != "NOTES.txt"
}

/// An `image:` line found in a template.
struct ImageLine {
    /// Offset of the `image` key.
    key: usize,
    /// Offsets of the value (after `:`), up to the end of the line (or of an action that
    /// spans lines).
    value: (usize, usize),
    line: usize,
    text: String,
}

fn find_image_lines(text: &str, tokens: &[Token<'_>]) -> Vec<ImageLine> {
    let mut out = Vec::new();
    let mut offset = 0;
    for raw_line in text.split_inclusive('\n') {
        let start = offset;
        offset += raw_line.len();
        let line = raw_line.trim_end_matches(['\n', '\r']);
        let Some(m) = image_key_re().find(line) else {
            continue;
        };
        let indent = image_key_re()
            .captures(line)
            .and_then(|c| c.get(1))
            .map_or(0, |g| g.len());
        let key = start + indent;
        let mut value_end = start + line.len();
        // Extend over an action that spans the end of the line.
        for t in tokens {
            if let Token::Action(a) = t {
                if a.start < value_end && a.end > value_end {
                    let rest = &text[a.end..];
                    let eol = rest.find('\n').map_or(text.len(), |i| a.end + i);
                    value_end = eol;
                }
            }
        }
        let value_start = start + m.end().min(line.len());
        let value_text = text[value_start..value_end].trim();
        if value_text.is_empty() || value_text.starts_with('#') {
            continue; // a mapping key (`image:` followed by nested keys), not an image
        }
        out.push(ImageLine {
            key,
            value: (value_start, value_end),
            line: line_of(text, key),
            text: text[key..value_end].trim().to_string(),
        });
    }
    out
}

/// One rendered piece of an image value: the text, and the values path it came from.
struct Piece {
    path: Option<Vec<String>>,
    text: String,
}

/// Render the value of an `image:` line. Error: the reason it cannot be evaluated.
fn render_value(value: &str, values: &Value) -> Result<Vec<Piece>, String> {
    let v = value.trim();
    if v.starts_with('|') || v.starts_with('>') {
        return Err("block scalars are not supported for images".into());
    }
    if v.starts_with('&') || v.starts_with('*') || v.starts_with('!') {
        return Err("YAML anchors, aliases and tags are not supported for images".into());
    }
    let (inner, quote) = match v.chars().next() {
        Some(q @ ('"' | '\'')) => {
            let Some(stripped) = v.strip_prefix(q) else {
                return Err("quote".into());
            };
            // The closing quote may be followed by a comment.
            let close = stripped
                .rfind(q)
                .ok_or_else(|| format!("unterminated {q} quote"))?;
            let after = stripped[close + 1..].trim();
            if !(after.is_empty() || after.starts_with('#')) {
                return Err(format!("unexpected text after the quoted value: {after:?}"));
            }
            (&stripped[..close], Some(q))
        }
        _ => (v, None),
    };
    let tokens = tokenize(inner).map_err(|(_, why)| why)?;
    let mut pieces: Vec<Piece> = Vec::new();
    let mut trim_next_left = false;
    for (i, tok) in tokens.iter().enumerate() {
        match tok {
            Token::Text { start, end } => {
                let mut t = &inner[*start..*end];
                if trim_next_left {
                    t = t.trim_start();
                }
                if let Some(Token::Action(next)) = tokens.get(i + 1) {
                    if next.trim_left {
                        t = t.trim_end();
                    }
                }
                let mut text = t.to_string();
                if quote.is_none() {
                    // A YAML comment ends a plain scalar: ` #...`.
                    if let Some(pos) = text.find(" #").or_else(|| text.find("\t#")) {
                        text.truncate(pos);
                        pieces.push(Piece { path: None, text });
                        return finish(pieces, quote);
                    }
                }
                pieces.push(Piece { path: None, text });
                trim_next_left = false;
            }
            Token::Action(a) => {
                trim_next_left = a.trim_right;
                if a.comment {
                    continue;
                }
                let Some(path) = values_ref(a.inner) else {
                    return Err(format!(
                        "`{{{{ {} }}}}` is not a plain .Values reference",
                        a.inner
                    ));
                };
                let shown = format!(".Values.{}", path.join("."));
                let val = lookup(values, &path).ok_or_else(|| format!("{shown} is not set"))?;
                let text = match val {
                    Value::Null => return Err(format!("{shown} is null")),
                    Value::Sequence(_) => return Err(format!("{shown} is a list, not a scalar")),
                    Value::Mapping(_) => return Err(format!("{shown} is a mapping, not a scalar")),
                    other => {
                        scalar_to_string(other).ok_or_else(|| format!("{shown} is not a scalar"))?
                    }
                };
                pieces.push(Piece {
                    path: Some(path.iter().map(|s| s.to_string()).collect()),
                    text,
                });
            }
        }
    }
    finish(pieces, quote)
}

fn finish(mut pieces: Vec<Piece>, quote: Option<char>) -> Result<Vec<Piece>, String> {
    if quote.is_none() {
        // Plain scalars lose surrounding whitespace.
        if let Some(first) = pieces.first_mut() {
            if first.path.is_none() {
                first.text = first.text.trim_start().to_string();
            }
        }
        if let Some(last) = pieces.last_mut() {
            if last.path.is_none() {
                last.text = last.text.trim_end().to_string();
            }
        }
    } else if quote == Some('"')
        && pieces
            .iter()
            .any(|p| p.path.is_none() && p.text.contains('\\'))
    {
        return Err("escape sequences in a double-quoted image are not supported".into());
    } else if quote == Some('\'') {
        for p in pieces.iter_mut().filter(|p| p.path.is_none()) {
            p.text = p.text.replace("''", "'");
        }
    }
    Ok(pieces)
}

fn host_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(
        &R,
        r"^(?:(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\])(?::[0-9]+)?$",
    )
}

fn repo_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(
        &R,
        r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$",
    )
}

fn tag_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(&R, r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
}

/// Split a rendered reference Docker-style: (host, repository, tag).
fn split_reference(r: &str) -> Result<(String, String, String), String> {
    if r.contains('@') {
        return Err("digest references (`@sha256:...`) are not supported".into());
    }
    let (name, tag) = match r.rfind(':') {
        Some(i) if !r[i..].contains('/') => (&r[..i], &r[i + 1..]),
        _ => (r, "latest"),
    };
    let (host, repo) = match name.split_once('/') {
        Some((h, rest)) if h.contains(['.', ':']) || h == "localhost" || h.starts_with('[') => {
            (h, rest)
        }
        _ => ("", name),
    };
    Ok((host.to_string(), repo.to_string(), tag.to_string()))
}

fn build_image(pieces: &[Piece], template: &str) -> Result<ChartImage, String> {
    let rendered: String = pieces.iter().map(|p| p.text.as_str()).collect();
    let is_repo = |p: &Piece| {
        p.path
            .as_ref()
            .is_some_and(|path| path.ends_with(&["image".to_string(), "repository".to_string()]))
    };
    let repo_pieces: Vec<usize> = pieces
        .iter()
        .enumerate()
        .filter(|(_, p)| is_repo(p))
        .map(|(i, _)| i)
        .collect();
    let mut defaulted_tag = false;
    let img = if let [i] = repo_pieces.as_slice() {
        let i = *i;
        let path = pieces[i].path.as_deref().unwrap_or_default();
        let component = path[..path.len().saturating_sub(2)].join(".");
        let before: String = pieces[..i].iter().map(|p| p.text.as_str()).collect();
        let after: String = pieces[i + 1..].iter().map(|p| p.text.as_str()).collect();
        let host = if before.is_empty() {
            String::new()
        } else {
            let Some(h) = before.strip_suffix('/') else {
                return Err(format!(
                    "text before the repository ({before:?}) does not end with '/'"
                ));
            };
            if h.is_empty() {
                return Err(
                    "empty registry host before '/' (is imageRepositoryHost empty?)".into(),
                );
            }
            h.to_string()
        };
        let tag = if after.is_empty() {
            defaulted_tag = true;
            "latest".to_string()
        } else if let Some(t) = after.strip_prefix(':') {
            t.to_string()
        } else if after.starts_with('@') {
            return Err("digest references (`@sha256:...`) are not supported".into());
        } else {
            return Err(format!(
                "text after the repository ({after:?}) is not `:tag`"
            ));
        };
        ChartImage {
            component,
            host,
            repository: pieces[i].text.clone(),
            tag,
            template: template.to_string(),
        }
    } else {
        let paths: BTreeSet<String> = pieces
            .iter()
            .filter_map(|p| p.path.as_ref())
            .map(|p| p.join("."))
            .collect();
        let component = if paths.len() == 1 {
            paths.into_iter().next().unwrap_or_default()
        } else {
            String::new()
        };
        let (host, repository, tag) = split_reference(&rendered)?;
        defaulted_tag = !rendered.ends_with(&format!(":{tag}"));
        ChartImage {
            component,
            host,
            repository,
            tag,
            template: template.to_string(),
        }
    };
    if !img.host.is_empty() && !host_re().is_match(&img.host) {
        return Err(format!("invalid registry host {:?}", img.host));
    }
    if !repo_re().is_match(&img.repository) {
        return Err(format!(
            "invalid repository {:?} (lower-case path components separated by '/')",
            img.repository
        ));
    }
    if !tag_re().is_match(&img.tag) {
        return Err(format!("invalid tag {:?}", img.tag));
    }
    let expected = if defaulted_tag {
        format!("{rendered}:latest")
    } else {
        rendered
    };
    if img.reference() != expected {
        return Err(format!(
            "cannot split it into registry, repository and tag (got {})",
            img.reference()
        ));
    }
    Ok(img)
}

/// Values paths of components declaring an image (`<path>.image.repository`).
fn declared_images(values: &Value, path: &mut Vec<String>, out: &mut Vec<(String, String)>) {
    let Value::Mapping(m) = values else { return };
    if let Some(Value::Mapping(img)) = m.get("image") {
        if let Some(repo) = img.get("repository") {
            let shown = scalar_to_string(repo).unwrap_or_else(|| format!("{repo:?}"));
            out.push((path.join("."), shown));
        }
    }
    for (k, v) in m {
        if let (Some(key), Value::Mapping(_)) = (k.as_str(), v) {
            path.push(key.to_string());
            declared_images(v, path, out);
            path.pop();
        }
    }
}

/// The images `chart` deploys with `values` (the chart's values merged with the user's
/// overrides: see [`super::values`]). Sorted by repository (then host, tag), one per reference.
/// See the module documentation for the rules and errors.
pub fn discover_images(
    chart: &ChartArchive,
    values: &Value,
) -> Result<Vec<ChartImage>, ChartError> {
    if chart.files().any(|(p, _)| p.starts_with("charts/")) {
        return Err(ChartError::UnsupportedChart {
            chart: chart.label(),
            reason: "subcharts (files under charts/): their images would not be discovered".into(),
        });
    }
    let mut images: Vec<ChartImage> = Vec::new();
    let mut used: BTreeSet<String> = BTreeSet::new();
    for (path, bytes) in chart.templates() {
        if !is_rendered_template(path) || path.starts_with("templates/crd/") {
            continue;
        }
        let text = std::str::from_utf8(bytes).map_err(|e| ChartError::TemplateSyntax {
            template: path.to_string(),
            line: line_of(&String::from_utf8_lossy(bytes), e.valid_up_to()),
            reason: "not valid UTF-8".into(),
        })?;
        if declares_crd(text) || !text.contains("image") {
            continue;
        }
        let tokens = tokenize(text).map_err(|(pos, reason)| ChartError::TemplateSyntax {
            template: path.to_string(),
            line: line_of(text, pos),
            reason,
        })?;
        let lines = find_image_lines(text, &tokens);
        if lines.is_empty() {
            continue;
        }
        // Whether each line is rendered: the flow state at its key.
        let mut state: Vec<Option<Tri>> = vec![None; lines.len()];
        let mut flow = Flow::default();
        for tok in &tokens {
            match tok {
                Token::Text { start, end } => {
                    for (i, l) in lines.iter().enumerate() {
                        if l.key >= *start && l.key < *end {
                            state[i] = Some(flow.active());
                        }
                    }
                }
                Token::Action(a) => {
                    flow.apply(a, values)
                        .map_err(|reason| ChartError::TemplateSyntax {
                            template: path.to_string(),
                            line: line_of(text, a.start),
                            reason,
                        })?
                }
            }
        }
        for (l, st) in lines.iter().zip(state) {
            // `None`: the key sits inside an action (e.g. a template comment): not a line.
            let Some(st) = st else { continue };
            let value = &text[l.value.0..l.value.1];
            // Lines in branches not rendered still count as using their component.
            for c in repo_use_re().captures_iter(value) {
                let comp = c.get(1).map_or("", |m| m.as_str());
                used.insert(comp.strip_prefix('.').unwrap_or(comp).to_string());
            }
            if st == Tri::False {
                continue;
            }
            let pieces =
                render_value(value, values).map_err(|reason| ChartError::UnresolvedImage {
                    template: path.to_string(),
                    line: l.line,
                    text: l.text.clone(),
                    reason,
                })?;
            let img = build_image(&pieces, path).map_err(|reason| ChartError::InvalidImage {
                template: path.to_string(),
                line: l.line,
                reference: pieces.iter().map(|p| p.text.as_str()).collect(),
                reason,
            })?;
            images.push(img);
        }
    }
    let mut declared = Vec::new();
    declared_images(values, &mut Vec::new(), &mut declared);
    if let Some((component, repository)) = declared.into_iter().find(|(c, _)| !used.contains(c)) {
        return Err(ChartError::UnusedImageValue {
            component,
            repository,
        });
    }
    images.sort_by(|a, b| {
        (&a.repository, &a.host, &a.tag, &a.component, &a.template).cmp(&(
            &b.repository,
            &b.host,
            &b.tag,
            &b.component,
            &b.template,
        ))
    });
    let mut seen = BTreeSet::new();
    images.retain(|i| seen.insert(i.reference()));
    Ok(images)
}

/// The images of a chart as real `helm template` rendered them (see
/// [`super::rendered::images_in_manifests`]): each rendered reference split Docker-style
/// (an empty host is Docker Hub), checked as the built-in reader checks its own, and named
/// after the values component whose `image.repository` it uses (else its container's name).
/// Sorted and deduplicated like [`discover_images`].
pub fn images_from_rendered(
    rendered: &[super::rendered::RenderedImage],
    values: &Value,
) -> Result<Vec<ChartImage>, ChartError> {
    let mut declared = Vec::new();
    declared_images(values, &mut Vec::new(), &mut declared);
    let mut images = Vec::new();
    for r in rendered {
        let invalid = |reason: String| ChartError::InvalidImage {
            template: if r.source.is_empty() {
                "rendered manifests".into()
            } else {
                r.source.clone()
            },
            line: 0,
            reference: r.image.clone(),
            reason,
        };
        let piece = Piece {
            path: None,
            text: r.image.clone(),
        };
        let mut img = build_image(std::slice::from_ref(&piece), &r.source).map_err(invalid)?;
        let repository = img.repository.clone();
        img.component = declared
            .iter()
            .find(|(_, repo)| *repo == repository || repository.ends_with(&format!("/{repo}")))
            .map(|(c, _)| c.clone())
            .unwrap_or_else(|| r.container.clone());
        images.push(img);
    }
    images.sort_by(|a, b| {
        (&a.repository, &a.host, &a.tag, &a.component, &a.template).cmp(&(
            &b.repository,
            &b.host,
            &b.tag,
            &b.component,
            &b.template,
        ))
    });
    let mut seen = BTreeSet::new();
    images.retain(|i| seen.insert(i.reference()));
    Ok(images)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chart::archive::tests::{tgz, ALL, V041, V111, V141, V160, V180};
    use crate::chart::values::{apply_set, merge_values};

    fn discover(bytes: &[u8], sets: &[&str]) -> Result<Vec<ChartImage>, ChartError> {
        let chart = ChartArchive::from_tgz(bytes).expect("chart");
        let mut v = chart.values().clone();
        for s in sets {
            apply_set(&mut v, s).expect("set");
        }
        discover_images(&chart, &v)
    }

    fn refs(images: &[ChartImage]) -> Vec<String> {
        images.iter().map(ChartImage::reference).collect()
    }

    #[test]
    fn v180_five_images() {
        let images = discover(V180, &[]).expect("discover");
        let h = "registry.cn-beijing.aliyuncs.com/koordinator-sh";
        assert_eq!(
            refs(&images),
            [
                format!("{h}/koord-descheduler:v1.8.0"),
                format!("{h}/koord-device-daemon:v1.8.0"),
                format!("{h}/koord-manager:v1.8.0"),
                format!("{h}/koord-scheduler:v1.8.0"),
                format!("{h}/koordlet:v1.8.0"),
            ]
        );
        let dd = &images[1];
        assert_eq!(dd.component, "deviceDaemon");
        assert_eq!(dd.host, "registry.cn-beijing.aliyuncs.com");
        assert_eq!(dd.repository, "koordinator-sh/koord-device-daemon");
        assert_eq!(dd.tag, "v1.8.0");
        assert_eq!(dd.template, "templates/koord-device-daemon.yaml");
        let comps: Vec<&str> = images.iter().map(|i| i.component.as_str()).collect();
        assert_eq!(
            comps,
            [
                "descheduler",
                "deviceDaemon",
                "manager",
                "scheduler",
                "koordlet"
            ]
        );
    }

    #[test]
    fn v160_v141_v111_four_images() {
        for (bytes, tag) in [(V160, "v1.6.0"), (V141, "v1.4.1"), (V111, "v1.1.1")] {
            let images = discover(bytes, &[]).expect("discover");
            let repos: Vec<&str> = images.iter().map(|i| i.repository.as_str()).collect();
            assert_eq!(
                repos,
                [
                    "koordinator-sh/koord-descheduler",
                    "koordinator-sh/koord-manager",
                    "koordinator-sh/koord-scheduler",
                    "koordinator-sh/koordlet"
                ],
                "{tag}"
            );
            assert!(
                images
                    .iter()
                    .all(|i| i.tag == tag && i.host == "registry.cn-beijing.aliyuncs.com"),
                "{tag}"
            );
        }
    }

    #[test]
    fn v041_hostless_and_with_host() {
        let images = discover(V041, &[]).expect("discover");
        assert_eq!(
            refs(&images),
            [
                "koordinatorsh/koord-manager:v0.4.1",
                "koordinatorsh/koord-scheduler:v0.4.1",
                "koordinatorsh/koordlet:v0.4.1"
            ]
        );
        assert!(images.iter().all(|i| i.host.is_empty()));
        let lines: Vec<&str> = images.iter().map(|i| i.template.as_str()).collect();
        assert_eq!(
            lines,
            [
                "templates/koord-manager.yaml",
                "templates/koord-scheduler.yaml",
                "templates/koordlet.yaml"
            ]
        );

        let images = discover(V041, &["imageRepositoryHost=ghcr.io"]).expect("discover");
        assert_eq!(
            refs(&images),
            [
                "ghcr.io/koordinatorsh/koord-manager:v0.4.1",
                "ghcr.io/koordinatorsh/koord-scheduler:v0.4.1",
                "ghcr.io/koordinatorsh/koordlet:v0.4.1"
            ]
        );
        assert!(images
            .iter()
            .all(|i| i.host == "ghcr.io" && i.repository.starts_with("koordinatorsh/")));
    }

    #[test]
    fn overrides_change_images() {
        let images = discover(V180, &["manager.image.tag=v9"]).expect("discover");
        let m = images
            .iter()
            .find(|i| i.component == "manager")
            .expect("manager");
        assert_eq!(m.tag, "v9");
        assert_eq!(
            m.reference(),
            "registry.cn-beijing.aliyuncs.com/koordinator-sh/koord-manager:v9"
        );
        assert!(images
            .iter()
            .filter(|i| i.component != "manager")
            .all(|i| i.tag == "v1.8.0"));

        let images = discover(
            V180,
            &["imageRepositoryHost=ghcr.io,koordlet.image.repository=me/koordlet"],
        )
        .expect("d");
        assert!(images.iter().all(|i| i.host == "ghcr.io"));
        assert!(refs(&images).contains(&"ghcr.io/me/koordlet:v1.8.0".to_string()));

        // A values file overlay, then numeric tag from --set (typed as int, rendered as text).
        let chart = ChartArchive::from_tgz(V180).expect("chart");
        let mut v = chart.values().clone();
        merge_values(
            &mut v,
            &crate::yaml::parse_value(
                "t",
                b"scheduler: {image: {tag: v1.8.1}}",
                &crate::yaml::VALUES,
            )
            .expect("yaml"),
        );
        apply_set(&mut v, "descheduler.image.tag=18").expect("set");
        let images = discover_images(&chart, &v).expect("discover");
        let tags: Vec<(&str, &str)> = images
            .iter()
            .map(|i| (i.component.as_str(), i.tag.as_str()))
            .collect();
        assert!(
            tags.contains(&("scheduler", "v1.8.1")) && tags.contains(&("descheduler", "18")),
            "{tags:?}"
        );
    }

    #[test]
    fn same_reference_is_deduplicated() {
        let images = discover(
            V180,
            &["koordlet.image.repository=koordinator-sh/koord-manager,koordlet.image.tag=v1.8.0"],
        )
        .expect("discover");
        assert_eq!(images.len(), 4);
    }

    #[test]
    fn errors_name_template_and_line() {
        // Empty host on a 1.x chart renders "/koordinator-sh/...": invalid.
        let err = discover(V180, &["imageRepositoryHost="]).expect_err("empty host");
        let msg = err.to_string();
        assert!(matches!(err, ChartError::InvalidImage { .. }), "{msg}");
        assert!(
            msg.contains("templates/") && msg.contains("imageRepositoryHost"),
            "{msg}"
        );

        // A missing value.
        let err = discover(V180, &["manager.image.tag=null"]).expect_err("missing tag");
        match &err {
            ChartError::UnresolvedImage {
                template,
                line,
                text,
                reason,
            } => {
                assert_eq!(template, "templates/koord-manager.yaml");
                assert_eq!(*line, 63);
                assert!(
                    text.starts_with("image: \"{{ .Values.imageRepositoryHost }}"),
                    "{text}"
                );
                assert!(reason.contains(".Values.manager.image.tag"), "{reason}");
            }
            other => panic!("unexpected {other}"),
        }
        assert!(
            err.to_string()
                .starts_with("templates/koord-manager.yaml:63: "),
            "{err}"
        );

        // A non-scalar value.
        let err = discover(V180, &["manager.image.tag.x=1"]).expect_err("mapping tag");
        assert!(err.to_string().contains("mapping"), "{err}");

        // An image in values that no template uses.
        let err = discover(
            V180,
            &["sidecar.image.repository=foo/bar,sidecar.image.tag=v1"],
        )
        .expect_err("unused");
        match &err {
            ChartError::UnusedImageValue {
                component,
                repository,
            } => {
                assert_eq!(component, "sidecar");
                assert_eq!(repository, "foo/bar");
            }
            other => panic!("unexpected {other}"),
        }
        // The device daemon does not exist in 1.6.0.
        let err = discover(V160, &["deviceDaemon.image.repository=x/y"]).expect_err("unused");
        assert!(
            err.to_string().contains("deviceDaemon.image.repository"),
            "{err}"
        );
    }

    fn chart_with(templates: &[(&str, &str)], values: &str) -> ChartArchive {
        let mut entries: Vec<(String, tar::EntryType, Vec<u8>)> = vec![
            (
                "c/Chart.yaml".into(),
                tar::EntryType::Regular,
                b"apiVersion: v2\nname: c\nversion: 1.0.0\n".to_vec(),
            ),
            (
                "c/values.yaml".into(),
                tar::EntryType::Regular,
                values.as_bytes().to_vec(),
            ),
        ];
        for (p, t) in templates {
            entries.push((
                format!("c/{p}"),
                tar::EntryType::Regular,
                t.as_bytes().to_vec(),
            ));
        }
        let refs: Vec<(&str, tar::EntryType, &[u8])> = entries
            .iter()
            .map(|(p, k, d)| (p.as_str(), *k, d.as_slice()))
            .collect();
        ChartArchive::from_tgz(&tgz(&refs)).expect("chart")
    }

    #[test]
    fn template_forms() {
        let values = "reg: r.example:5000\na:\n  image: {repository: org/a, tag: '1.0'}\nb:\n  enabled: false\n  image: {repository: org/b, tag: v2}\nc: {image: {repository: org/c}}\n";
        let t = r#"
# image: commented/out:1
spec:
  containers:
  - image: {{ .Values.reg -}} /{{ .Values.a.image.repository }}:{{ .Values.a.image.tag }}  # comment
    name: a
  - name: literal
    image: 'busybox:1.36'
{{- if .Values.b.enabled }}
  - image: "{{ .Values.reg }}/{{ .Values.b.image.repository }}:{{ .Values.b.image.tag }}"
{{- end }}
{{- if semverCompare ">=1.22" .Capabilities.KubeVersion.Version }}
  - image: {{ $.Values.c.image.repository }}
{{- end }}
{{/* image: in a comment {{ include "x" . }} */}}
{{- define "unused" }}
  image: {{ include "nope" . }}
{{- end }}
  volumes:
  - name: x
    image:
      reference: not-an-image
"#;
        let chart = chart_with(
            &[
                ("templates/d.yaml", t),
                ("templates/_h.tpl", "image: {{ include \"x\" . }}\n"),
            ],
            values,
        );
        let images = discover_images(&chart, chart.values()).expect("discover");
        let got: Vec<(String, &str)> = images
            .iter()
            .map(|i| (i.reference(), i.component.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("busybox:1.36".to_string(), ""),
                ("r.example:5000/org/a:1.0".to_string(), "a"),
                ("org/c:latest".to_string(), "c"),
            ]
        );
        assert_eq!(images[1].host, "r.example:5000");

        let mut v = chart.values().clone();
        apply_set(&mut v, "b.enabled=true").expect("set");
        let images = discover_images(&chart, &v).expect("discover");
        assert!(refs(&images).contains(&"r.example:5000/org/b:v2".to_string()));
    }

    #[test]
    fn unresolvable_forms() {
        let values = "a: {image: {repository: org/a, tag: v1}}\n";
        for (line, why) in [
            (
                "image: {{ include \"img\" . }}",
                "not a plain .Values reference",
            ),
            (
                "image: \"{{ .Values.a.image.repository }}:{{ .Chart.AppVersion }}\"",
                ".Chart.AppVersion",
            ),
            (
                "image: {{ .Values.a.image.repository | lower }}:v1",
                "not a plain",
            ),
            (
                "image: {{ .Values.a.image.repository }}:{{ .Values.a.image.tagg }}",
                ".Values.a.image.tagg is not set",
            ),
            ("image: {{ .Values.a.image }}", "mapping"),
            (
                "image: {{ .Values.a.image.repository }}:{{ default \"v1\" .Values.a.image.tag }}",
                "default",
            ),
        ] {
            let t = format!("spec:\n  {line}\n");
            let chart = chart_with(&[("templates/x.yaml", &t)], values);
            let err = discover_images(&chart, chart.values()).expect_err(line);
            let msg = err.to_string();
            assert!(matches!(err, ChartError::UnresolvedImage { .. }), "{msg}");
            assert!(
                msg.starts_with("templates/x.yaml:2:") && msg.contains(why),
                "{msg}"
            );
        }
        let chart = chart_with(
            &[("templates/x.yaml", "{{ if .Values.a }}\nimage: x\n")],
            values,
        );
        assert!(matches!(
            discover_images(&chart, chart.values()),
            Err(ChartError::UnusedImageValue { .. })
        ));
        let chart = chart_with(
            &[(
                "templates/x.yaml",
                "image: {{ .Values.a.image.repository }}\n{{ end }}",
            )],
            values,
        );
        assert!(matches!(
            discover_images(&chart, chart.values()),
            Err(ChartError::TemplateSyntax { .. })
        ));
        let chart = chart_with(
            &[
                (
                    "templates/x.yaml",
                    "image: {{ .Values.a.image.repository }}:{{ .Values.a.image.tag }}\n",
                ),
                ("charts/sub/Chart.yaml", "name: sub"),
            ],
            values,
        );
        assert!(matches!(
            discover_images(&chart, chart.values()),
            Err(ChartError::UnsupportedChart { .. })
        ));
    }

    #[test]
    fn every_fixture_discovers() {
        let expected = [
            ("0.4.1", 3),
            ("1.1.1", 4),
            ("1.4.1", 4),
            ("1.6.0", 4),
            ("1.8.0", 5),
        ];
        for ((version, bytes), (v2, n)) in ALL.iter().zip(expected) {
            assert_eq!(*version, v2);
            let images = discover(bytes, &[]).expect(version);
            assert_eq!(images.len(), n, "{version}");
            let mut comps: Vec<&str> = images.iter().map(|i| i.component.as_str()).collect();
            comps.sort();
            comps.dedup();
            assert_eq!(comps.len(), n, "{version}: one image per component");
        }
    }

    #[test]
    fn split_references() {
        assert_eq!(
            split_reference("busybox").expect("s"),
            ("".into(), "busybox".into(), "latest".into())
        );
        assert_eq!(
            split_reference("localhost:5000/a/b:c").expect("s"),
            ("localhost:5000".into(), "a/b".into(), "c".into())
        );
        assert_eq!(
            split_reference("org/app:1").expect("s"),
            ("".into(), "org/app".into(), "1".into())
        );
        assert!(split_reference("a@sha256:00").is_err());
    }
}
