//! A [`Report`] as text: a table for a terminal, Markdown for an approval ticket. (JSON is
//! the report serialised.) Text from the bundles (paths, values) is made safe for a terminal
//! by the caller, and `|` is escaped in Markdown cells.

use super::crds::{CrdChange, VersionDiff};
use super::{ImageChange, Report, SideSummary, Signature, SignatureChanges, SignatureEntry};
use crate::oci::Digest;
use std::fmt::Write as _;

/// `sha256:` and the first 12 hex digits.
fn short(d: &Digest) -> String {
    format!("sha256:{}", &d.hex()[..12])
}

fn signature(s: &Signature) -> String {
    let key = s.key_id.as_deref().unwrap_or("?");
    match (s.signed, s.verified) {
        (false, _) => "not signed".into(),
        (true, Some(true)) => format!("key {key}, verified: yes"),
        (true, Some(false)) => format!(
            "key {key}, verified: NO ({})",
            s.reason.as_deref().unwrap_or("")
        ),
        (true, None) => format!(
            "key {key}, verified: not checked{}",
            s.reason
                .as_deref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        ),
    }
}

/// How a carried upstream signature was checked at build.
fn checked(k: &Option<Digest>) -> String {
    match k {
        Some(k) => format!("verified at build (key {})", short(k)),
        None => "NOT verified at build".into(),
    }
}

/// A carried signature or attestation, one line: kind, tag, what it signs, how it was checked.
fn signature_entry(s: &SignatureEntry) -> String {
    format!(
        "{} {} (of {}, signs {}): {} {}, {}",
        s.kind,
        s.ref_name,
        s.image,
        short(&s.signs),
        s.layers,
        crate::text::plural(s.layers, "layer", "layers"),
        checked(&s.verified_with)
    )
}

/// What changed in a carried signature, one line.
fn signature_change(c: &super::SignatureChange) -> String {
    let mut parts = Vec::new();
    if c.digest.old != c.digest.new {
        parts.push(format!(
            "manifest {} → {}",
            short(&c.digest.old),
            short(&c.digest.new)
        ));
    }
    if c.layers.old != c.layers.new {
        parts.push(format!("layers {} → {}", c.layers.old, c.layers.new));
    }
    if c.verified_with.old != c.verified_with.new {
        parts.push(format!(
            "{} → {}",
            checked(&c.verified_with.old),
            checked(&c.verified_with.new)
        ));
    }
    format!(
        "{} {} (of {}, signs {}): {}",
        c.kind,
        c.ref_name,
        c.image,
        short(&c.signs),
        parts.join("; ")
    )
}

fn any_signature(s: &SignatureChanges) -> bool {
    s.added.len() + s.removed.len() + s.changed.len() + s.unchanged > 0
}

fn signatures_head(s: &SignatureChanges) -> String {
    format!(
        "{} added, {} removed, {} changed, {} unchanged",
        s.added.len(),
        s.removed.len(),
        s.changed.len(),
        s.unchanged
    )
}

fn side_kind(s: &SideSummary) -> &'static str {
    match s.kind {
        super::InputKind::Bundle => "bundle",
        super::InputKind::SplitSet => "split set",
        super::InputKind::ManifestFile => "manifest file",
    }
}

fn platforms_text(c: &ImageChange) -> String {
    c.platforms
        .iter()
        .map(|p| format!("{} {}", p.platform, p.change))
        .collect::<Vec<_>>()
        .join(", ")
}

fn bytes_text(r: &Report) -> String {
    let t = &r.transfer;
    let bytes = t
        .bytes
        .map(|b| format!("{} ({b} bytes)", crate::text::human_bytes(b)))
        .unwrap_or_else(|| "size unknown (NEW records no blob sizes)".into());
    let mut s = format!(
        "{} blobs, {bytes}: what NEW holds that OLD's site lacks, as `build --since OLD` carries it ({} of them manifests); {} blobs already on OLD's site",
        t.blobs, t.manifests, t.on_site
    );
    if !t.missing.is_empty() {
        let _ = write!(
            s,
            "; {} blobs NEW needs are neither in NEW (incremental) nor on OLD's site",
            t.missing.len()
        );
    }
    s
}

fn version_lines(d: &VersionDiff) -> Vec<String> {
    let mut l = Vec::new();
    let mut add = |what: &str, x: &[String]| {
        if !x.is_empty() {
            l.push(format!("{}: {what}: {}", d.version, x.join(", ")));
        }
    };
    add("fields added", &d.fields_added);
    add("fields removed", &d.fields_removed);
    add("now required", &d.newly_required);
    add("no longer required", &d.no_longer_required);
    for e in &d.enum_values_removed {
        l.push(format!(
            "{}: enum values removed from {}: {}",
            d.version,
            e.path,
            e.values.join(", ")
        ));
    }
    for e in &d.enum_values_added {
        l.push(format!(
            "{}: enum values added to {}: {}",
            d.version,
            e.path,
            e.values.join(", ")
        ));
    }
    for t in &d.types_changed {
        l.push(format!(
            "{}: type of {}: {} → {}",
            d.version,
            t.path,
            t.types.old.as_deref().unwrap_or("(none)"),
            t.types.new.as_deref().unwrap_or("(none)")
        ));
    }
    l
}

/// A CRD whose file changed but not its versions or schema fields (descriptions, formats).
fn detail_only(c: &CrdChange) -> bool {
    c.schema_available
        && c.schema.is_empty()
        && c.storage.is_none()
        && c.versions_added.is_empty()
        && c.versions_removed.is_empty()
        && c.no_longer_served.is_empty()
        && c.newly_served.is_empty()
}

/// The names of the CRDs that changed in details only.
fn detail_only_names(r: &Report) -> Vec<&str> {
    r.crds
        .changed
        .iter()
        .filter(|c| detail_only(c))
        .map(|c| c.name.as_str())
        .collect()
}

/// What changed in a CRD, one line each.
fn crd_lines(c: &CrdChange) -> Vec<String> {
    let mut l = Vec::new();
    let mut add = |what: &str, x: &[String]| {
        if !x.is_empty() {
            l.push(format!("{what}: {}", x.join(", ")));
        }
    };
    add("versions added", &c.versions_added);
    add("versions removed", &c.versions_removed);
    add("no longer served", &c.no_longer_served);
    add("newly served", &c.newly_served);
    if let Some(s) = &c.storage {
        l.push(format!("stored version: {} → {}", s.old, s.new));
    }
    for d in &c.schema {
        l.extend(version_lines(d));
    }
    if !c.schema_available {
        l.push("schema: not available from a manifest file".into());
    }
    l
}

/// The report as a table for a terminal.
pub fn table(r: &Report) -> String {
    let mut o = String::new();
    for (name, s) in [("OLD", &r.old), ("NEW", &r.new)] {
        let _ = writeln!(
            o,
            "{name}      {} ({}), created {}, {}; {}",
            s.input,
            side_kind(s),
            s.created,
            s.chart,
            signature(&s.signature)
        );
    }
    let c = &r.chart;
    let _ = writeln!(
        o,
        "chart    {} {} → {}, appVersion {} → {}",
        c.name,
        c.version.old,
        c.version.new,
        c.app_version.old.as_deref().unwrap_or("-"),
        c.app_version.new.as_deref().unwrap_or("-")
    );
    table_images(r, &mut o);
    table_signatures(r, &mut o);
    table_pins(r, &mut o);
    let _ = writeln!(o, "carry    {}", bytes_text(r));
    table_crds(r, &mut o);
    let v = &r.values;
    match &v.note {
        Some(n) => {
            let _ = writeln!(o, "values   ({n})");
        }
        None => {
            let _ = writeln!(
                o,
                "values   {} added, {} removed, {} changed (values.yaml defaults)",
                v.added.len(),
                v.removed.len(),
                v.changed.len()
            );
        }
    }
    for e in &v.added {
        let _ = writeln!(o, "  + {} = {}", e.path, e.value);
    }
    for e in &v.removed {
        let _ = writeln!(o, "  - {} = {}", e.path, e.value);
    }
    for e in &v.changed {
        let _ = writeln!(o, "  ~ {}: {} → {}", e.path, e.change.old, e.change.new);
    }
    let _ = writeln!(o, "warnings {}", r.warnings.len());
    for w in &r.warnings {
        let _ = writeln!(o, "  ! {w}");
    }
    o
}

fn table_images(r: &Report, o: &mut String) {
    let i = &r.images;
    let _ = writeln!(
        o,
        "images   {} added, {} removed, {} re-tagged, {} changed digest, {} unchanged",
        i.added.len(),
        i.removed.len(),
        i.retagged.len(),
        i.changed.len(),
        i.unchanged
    );
    for a in &i.added {
        let _ = writeln!(
            o,
            "  + {}  {}  [{}]",
            a.ref_name,
            short(&a.digest),
            a.platforms.join(", ")
        );
    }
    for a in &i.removed {
        let _ = writeln!(
            o,
            "  - {}  {}  [{}]",
            a.ref_name,
            short(&a.digest),
            a.platforms.join(", ")
        );
    }
    for x in i.retagged.iter().chain(&i.changed) {
        let _ = writeln!(
            o,
            "  ~ {}:{} → {}  {} → {}",
            x.repository,
            x.tag.old,
            x.tag.new,
            short(&x.digest.old),
            short(&x.digest.new)
        );
        for p in &x.platforms {
            let d = |d: &Option<Digest>| d.as_ref().map(short).unwrap_or_else(|| "-".into());
            let _ = writeln!(
                o,
                "      {:16} {:9} {} → {}",
                p.platform,
                p.change,
                d(&p.old),
                d(&p.new)
            );
        }
    }
}

fn table_signatures(r: &Report, o: &mut String) {
    let s = &r.signatures;
    if !any_signature(s) {
        return;
    }
    let _ = writeln!(
        o,
        "upstream signatures {} (cosign signatures and attestations carried by build --with-signatures)",
        signatures_head(s)
    );
    for a in &s.added {
        let _ = writeln!(o, "  + {}", signature_entry(a));
    }
    for a in &s.removed {
        let _ = writeln!(o, "  - {}", signature_entry(a));
    }
    for c in &s.changed {
        let _ = writeln!(o, "  ~ {}", signature_change(c));
    }
}

fn table_pins(r: &Report, o: &mut String) {
    let _ = writeln!(
        o,
        "pins     {} images, as `load` installs NEW (under REGISTRY[/PREFIX]/, by digest):",
        r.pins.len()
    );
    for p in &r.pins {
        let _ = writeln!(o, "  {p}");
    }
}

fn table_crds(r: &Report, o: &mut String) {
    let k = &r.crds;
    let _ = writeln!(
        o,
        "crds     {} added, {} removed, {} changed, {} unchanged",
        k.added.len(),
        k.removed.len(),
        k.changed.len(),
        k.unchanged
    );
    if let Some(n) = &k.note {
        let _ = writeln!(o, "  ({n})");
    }
    for a in &k.added {
        let _ = writeln!(o, "  + {} ({}) [{}]", a.name, a.kind, a.versions.join(", "));
    }
    for a in &k.removed {
        let _ = writeln!(o, "  - {} ({}) [{}]", a.name, a.kind, a.versions.join(", "));
    }
    for ch in k.changed.iter().filter(|c| !detail_only(c)) {
        let _ = writeln!(o, "  ~ {} ({})", ch.name, ch.kind);
        for l in crd_lines(ch) {
            let _ = writeln!(o, "      {l}");
        }
    }
    let details = detail_only_names(r);
    if !details.is_empty() {
        let _ = writeln!(
            o,
            "  ~ changed in descriptions or other details only: {}",
            details.join(", ")
        );
    }
}

/// Text from the bundles as Markdown text of one table cell or line, for CommonMark and
/// GitHub's renderer (cmark-gfm): every ASCII punctuation character that can open markup
/// (emphasis, links, images, HTML tags, entities, code spans, strikethrough, table cells) and
/// what GitHub's autolinks start at (`:` of `http://`, `@` of an address, the `.` of `www.`)
/// escaped with a backslash, which CommonMark allows before any ASCII punctuation; line breaks
/// become spaces. Versions and paths (`1.8.0`, `a/b-c`) stay as they are.
fn text(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for (i, c) in s.char_indices() {
        // GitHub links `http://`, `https://`, `ftp://` (from the `:`) and `www.` (from the `.`).
        let autolink = match c {
            ':' => s[i + 1..].starts_with("//"),
            '.' => o
                .get(o.len().saturating_sub(3)..)
                .is_some_and(|t| t.eq_ignore_ascii_case("www")),
            _ => false,
        };
        match c {
            '\n' | '\r' => o.push(' '),
            '\\' | '`' | '*' | '_' | '{' | '}' | '[' | ']' | '<' | '>' | '(' | ')' | '#' | '!'
            | '|' | '~' | '&' | '@' => {
                o.push('\\');
                o.push(c);
            }
            _ if autolink => {
                o.push('\\');
                o.push(c);
            }
            c => o.push(c),
        }
    }
    o
}

/// Text from the bundles as one inline code span: a fence of one more backtick than the longest
/// run of backticks inside (padded with a space when the text starts or ends with a backtick
/// or a space, as CommonMark strips one), `|` escaped for GitHub's table cells (which it
/// unescapes before it parses the span), line breaks as spaces.
fn code(s: &str) -> String {
    let s = s.replace(['\n', '\r'], " ").replace('|', "\\|");
    let longest = s.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest + 1);
    let pad = if s.starts_with(['`', ' ']) || s.ends_with(['`', ' ']) {
        " "
    } else {
        ""
    };
    format!("{fence}{pad}{s}{pad}{fence}")
}

/// The report as Markdown, for an approval ticket.
pub fn markdown(r: &Report) -> String {
    let mut o = String::new();
    let c = &r.chart;
    let _ = writeln!(
        o,
        "## koord-bundle diff: {} {} → {}\n",
        text(&c.name),
        text(&c.version.old),
        text(&c.version.new)
    );
    let _ = writeln!(o, "| | OLD | NEW |\n|---|---|---|");
    let row = |o: &mut String, k: &str, a: String, b: String| {
        let _ = writeln!(o, "| {k} | {a} | {b} |");
    };
    row(
        &mut o,
        "input",
        format!("{} ({})", code(&r.old.input), side_kind(&r.old)),
        format!("{} ({})", code(&r.new.input), side_kind(&r.new)),
    );
    row(
        &mut o,
        "chart version",
        text(&c.version.old),
        text(&c.version.new),
    );
    row(
        &mut o,
        "appVersion",
        text(c.app_version.old.as_deref().unwrap_or("-")),
        text(c.app_version.new.as_deref().unwrap_or("-")),
    );
    row(
        &mut o,
        "chart archive",
        code(&short(&c.digest.old)),
        code(&short(&c.digest.new)),
    );
    row(
        &mut o,
        "created",
        text(&r.old.created),
        text(&r.new.created),
    );
    row(
        &mut o,
        "signature",
        text(&signature(&r.old.signature)),
        text(&signature(&r.new.signature)),
    );
    row(
        &mut o,
        "bundle manifest",
        code(&short(&r.old.manifest_digest)),
        code(&short(&r.new.manifest_digest)),
    );
    let _ = writeln!(o, "\n### Warnings ({})\n", r.warnings.len());
    if r.warnings.is_empty() {
        let _ = writeln!(o, "None.");
    }
    for w in &r.warnings {
        let _ = writeln!(o, "- ⚠️ {}", text(&w.to_string()));
    }
    markdown_images(r, &mut o);
    markdown_signatures(r, &mut o);
    markdown_pins(r, &mut o);
    let _ = writeln!(o, "\n### What must cross\n\n{}", bytes_text(r));
    markdown_crds(r, &mut o);
    markdown_values(r, &mut o);
    o
}

fn markdown_images(r: &Report, o: &mut String) {
    let i = &r.images;
    let _ = writeln!(
        o,
        "\n### Images: {} added, {} removed, {} re-tagged, {} changed digest, {} unchanged\n",
        i.added.len(),
        i.removed.len(),
        i.retagged.len(),
        i.changed.len(),
        i.unchanged
    );
    if i.added.len() + i.removed.len() + i.retagged.len() + i.changed.len() == 0 {
        let _ = writeln!(o, "No change.");
        return;
    }
    let _ = writeln!(
        o,
        "| image | change | tag | index digest | platforms |\n|---|---|---|---|---|"
    );
    for a in &i.added {
        let (repo, tag) = a.ref_name.rsplit_once(':').unwrap_or((&a.ref_name, ""));
        let _ = writeln!(
            o,
            "| {} | added | {} | {} | {} |",
            code(repo),
            text(tag),
            code(&short(&a.digest)),
            text(&a.platforms.join(", "))
        );
    }
    for a in &i.removed {
        let (repo, tag) = a.ref_name.rsplit_once(':').unwrap_or((&a.ref_name, ""));
        let _ = writeln!(
            o,
            "| {} | removed | {} | {} | {} |",
            code(repo),
            text(tag),
            code(&short(&a.digest)),
            text(&a.platforms.join(", "))
        );
    }
    for (what, list) in [("re-tagged", &i.retagged), ("changed digest", &i.changed)] {
        for x in list {
            let _ = writeln!(
                o,
                "| {} | {what} | {} → {} | {} → {} | {} |",
                code(&x.repository),
                text(&x.tag.old),
                text(&x.tag.new),
                code(&short(&x.digest.old)),
                code(&short(&x.digest.new)),
                text(&platforms_text(x))
            );
        }
    }
}

fn markdown_signatures(r: &Report, o: &mut String) {
    let s = &r.signatures;
    if !any_signature(s) {
        return;
    }
    let _ = writeln!(o, "\n### Upstream signatures: {}\n", signatures_head(s));
    if s.added.len() + s.removed.len() + s.changed.len() == 0 {
        let _ = writeln!(o, "No change.");
        return;
    }
    let _ = writeln!(o, "| change | signature or attestation |\n|---|---|");
    for (what, list) in [("added", &s.added), ("removed", &s.removed)] {
        for a in list {
            let _ = writeln!(o, "| {what} | {} |", text(&signature_entry(a)));
        }
    }
    for c in &s.changed {
        let _ = writeln!(o, "| changed | {} |", text(&signature_change(c)));
    }
}

fn markdown_pins(r: &Report, o: &mut String) {
    let _ = writeln!(
        o,
        "\n### Pinned at install: {} images (under the target registry, by digest)\n",
        r.pins.len()
    );
    for p in &r.pins {
        let _ = writeln!(o, "- {}", code(p));
    }
}

fn markdown_crds(r: &Report, o: &mut String) {
    let k = &r.crds;
    let _ = writeln!(
        o,
        "\n### CRDs: {} added, {} removed, {} changed, {} unchanged\n",
        k.added.len(),
        k.removed.len(),
        k.changed.len(),
        k.unchanged
    );
    if let Some(n) = &k.note {
        let _ = writeln!(o, "_{}_\n", text(n));
    }
    if k.added.len() + k.removed.len() + k.changed.len() == 0 {
        let _ = writeln!(o, "No change.");
        return;
    }
    let _ = writeln!(o, "| CRD | change | details |\n|---|---|---|");
    for a in &k.added {
        let _ = writeln!(
            o,
            "| {} ({}) | added | versions {} |",
            code(&a.name),
            text(&a.kind),
            text(&a.versions.join(", "))
        );
    }
    for a in &k.removed {
        let _ = writeln!(
            o,
            "| {} ({}) | removed | versions {} |",
            code(&a.name),
            text(&a.kind),
            text(&a.versions.join(", "))
        );
    }
    for ch in k.changed.iter().filter(|c| !detail_only(c)) {
        let details: Vec<String> = crd_lines(ch).iter().map(|l| text(l)).collect();
        let _ = writeln!(
            o,
            "| {} ({}) | changed | {} |",
            code(&ch.name),
            text(&ch.kind),
            details.join("<br>")
        );
    }
    let details = detail_only_names(r);
    if !details.is_empty() {
        let names: Vec<String> = details.iter().map(|n| code(n)).collect();
        let _ = writeln!(
            o,
            "| {} | changed | descriptions or other details only: no version or schema field changed |",
            names.join(", ")
        );
    }
}

fn markdown_values(r: &Report, o: &mut String) {
    let v = &r.values;
    if let Some(n) = &v.note {
        let _ = writeln!(o, "\n### values.yaml defaults\n\n_{}_", text(n));
        return;
    }
    let _ = writeln!(
        o,
        "\n### values.yaml defaults: {} added, {} removed, {} changed\n",
        v.added.len(),
        v.removed.len(),
        v.changed.len()
    );
    if v.added.len() + v.removed.len() + v.changed.len() == 0 {
        let _ = writeln!(o, "No change.");
        return;
    }
    let _ = writeln!(o, "| path | OLD | NEW |\n|---|---|---|");
    for e in &v.added {
        let _ = writeln!(o, "| {} | (none) | {} |", code(&e.path), code(&e.value));
    }
    for e in &v.removed {
        let _ = writeln!(o, "| {} | {} | (none) |", code(&e.path), code(&e.value));
    }
    for e in &v.changed {
        let _ = writeln!(
            o,
            "| {} | {} | {} |",
            code(&e.path),
            code(&e.change.old),
            code(&e.change.new)
        );
    }
}
