//! Text from outside (a bundle, a registry, a file) quoted in messages: control characters
//! escaped, length bounded, so nothing untrusted reaches the terminal raw.

/// Longest quoted text, in characters.
const MAX_QUOTED: usize = 200;

/// `s` with control characters escaped (`\n`, `\u{1b}`), cut to 200 characters (`…` marks a
/// cut). Printable Unicode is kept; invisible format characters that reorder or hide text
/// (bidi overrides, zero-width characters) and the replacement character of undecodable bytes
/// are escaped too.
pub fn printable(s: &str) -> String {
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i == MAX_QUOTED {
            out.push('…');
            break;
        }
        push_escaped(&mut out, c);
    }
    out
}

/// A whole message made safe for a terminal, however long: every line as [`printable`] makes
/// it (nothing cut), line breaks kept.
pub fn terminal_safe(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for (i, line) in s.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        for c in line.chars() {
            if c == '\t' {
                out.push(c);
            } else {
                push_escaped(&mut out, c);
            }
        }
    }
    out
}

fn push_escaped(out: &mut String, c: char) {
    if is_unsafe(c) {
        out.extend(c.escape_default());
    } else {
        out.push(c);
    }
}

/// What must not reach a terminal raw: control characters (C0, DEL, C1), the invisible format
/// characters, the replacement character of undecodable bytes.
fn is_unsafe(c: char) -> bool {
    c.is_control() || c == '\u{7f}' || is_invisible_format(c) || c == char::REPLACEMENT_CHARACTER
}

/// A JSON document made safe for a terminal without changing what it means: serde_json escapes
/// C0 controls in strings but writes C1 controls, bidi overrides and zero-width characters raw;
/// here each is written as a JSON `\uXXXX` escape, which a JSON reader decodes back to the same
/// character. (Outside its strings a document holds only ASCII: its whitespace is kept.)
pub fn json_terminal_safe(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if matches!(c, '\n' | '\r' | '\t') || !is_unsafe(c) {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    out
}

/// Unicode format characters that can make a terminal show text other than the bytes hold:
/// bidi embeddings, overrides and isolates (the "Trojan Source" characters), zero-width
/// characters, the byte-order mark, interlinear annotation marks.
fn is_invisible_format(c: char) -> bool {
    matches!(
        c,
        '\u{061c}'
            | '\u{180e}'
            | '\u{200b}'..='\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{2069}'
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}'
    )
}

/// `one` when `n` is 1, else `many`: "1 part", "3 parts".
pub fn plural<'a>(n: usize, one: &'a str, many: &'a str) -> &'a str {
    if n == 1 {
        one
    } else {
        many
    }
}

/// `12.3 MiB`.
pub fn human_bytes(n: u64) -> String {
    const U: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

/// Decode `%XX` escapes and `+` (a query value); malformed escapes are kept as they are.
pub fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(&s.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

/// What a query value keeps as it is: RFC 3986's unreserved characters.
const QUERY_VALUE: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-encode for a URL query value (RFC 3986 unreserved characters kept).
pub fn percent_encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, QUERY_VALUE).to_string()
}

/// An error and its sources on one line (`a: b: c`), each cause once (a cause whose text the
/// line already holds is left out).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

/// An RFC 1123 label: 1–63 lower-case letters, digits and `-`, starting and ending with a
/// letter or digit (a Kubernetes object name of that kind: a namespace, a policy).
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn escapes_and_bounds() {
        assert_eq!(printable("a\nb\u{1b}[31m"), "a\\nb\\u{1b}[31m");
        let long = "x".repeat(1000);
        assert_eq!(printable(&long).chars().count(), MAX_QUOTED + 1);
        assert_eq!(printable("größe"), "größe");
        // Trojan Source: an override that shows text reversed, and a zero-width space.
        assert_eq!(printable("a\u{202e}b\u{200b}"), "a\\u{202e}b\\u{200b}");
    }

    #[test]
    fn json_keeps_its_meaning_and_loses_its_raw_controls() {
        let v = serde_json::json!({"bundle": "a\u{202e}b\u{9b}31m\u{1b}[2J\u{7f}\u{200b}größe\u{fffd}", "n": [1, 2]});
        let pretty = serde_json::to_string_pretty(&v).unwrap();
        let safe = json_terminal_safe(&pretty);
        assert!(
            safe.chars()
                .all(|c| matches!(c, '\n' | '\r' | '\t') || !is_unsafe(c)),
            "{safe:?}"
        );
        assert!(
            safe.contains(r#""a\u202eb\u009b31m\u001b[2J\u007f\u200bgröße\ufffd""#),
            "{safe}"
        );
        let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
        assert_eq!(back, v);
        assert_eq!(safe.lines().count(), pretty.lines().count());
    }

    #[test]
    fn terminal_safe_keeps_lines_and_length() {
        let long = format!("{}\n  b\u{1b}[2J\tc\u{fffd}", "x".repeat(500));
        let safe = terminal_safe(&long);
        assert_eq!(
            safe,
            format!("{}\n  b\\u{{1b}}[2J\tc\\u{{fffd}}", "x".repeat(500))
        );
        assert_eq!(terminal_safe("größe: ok"), "größe: ok");
    }
}
