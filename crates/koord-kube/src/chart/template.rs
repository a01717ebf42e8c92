//! A minimal reading of Go text/template, for one purpose: recognising the `{{ if }}` …
//! `{{ end }}` wrapper around a CRD template ([`super::crds`]) so that it can be cut out. It
//! splits a template into text and actions and tells whether a condition is a plain one on
//! values (`.Values.a.b`, `not`, `and`, `or`, `true`, `false`); it evaluates nothing
//! (rendering is helm's).

/// One action `{{ ... }}` of a template.
#[derive(Debug, Clone)]
pub(crate) struct Action<'a> {
    /// Byte offset of `{{`.
    pub start: usize,
    /// Byte offset just after `}}`.
    pub end: usize,
    /// The text between the delimiters, without trim markers (`{{-`, `-}}`), trimmed; a
    /// comment keeps its `/* */`.
    pub inner: &'a str,
}

/// A piece of a template.
#[derive(Debug, Clone)]
pub(crate) enum Token<'a> {
    /// Literal text, `[start, end)`.
    Text { start: usize, end: usize },
    /// An action.
    Action(Action<'a>),
}

/// Split a template into text and actions. Error: (byte offset, reason) for an unterminated
/// action or comment.
pub(crate) fn tokenize(text: &str) -> Result<Vec<Token<'_>>, (usize, String)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut pos = 0;
    while let Some(rel) = text[pos..].find("{{") {
        let start = pos + rel;
        if start > pos {
            out.push(Token::Text {
                start: pos,
                end: start,
            });
        }
        let mut j = start + 2;
        let trim_left =
            b.get(j) == Some(&b'-') && b.get(j + 1).is_some_and(|c| c.is_ascii_whitespace());
        if trim_left {
            j += 1;
        }
        let body_start = j;
        let mut k = j;
        while b.get(k).is_some_and(|c| c.is_ascii_whitespace()) {
            k += 1;
        }
        let (body_end, end) = if text[k..].starts_with("/*") {
            let Some(close) = text[k + 2..].find("*/") else {
                return Err((start, "unterminated comment `{{/*`".into()));
            };
            let after = k + 2 + close + 2;
            let Some(rd) = text[after..].find("}}") else {
                return Err((start, "unterminated comment action".into()));
            };
            if !text[after..after + rd]
                .trim()
                .trim_end_matches('-')
                .trim()
                .is_empty()
            {
                return Err((start, "text between `*/` and `}}`".into()));
            }
            (after + rd, after + rd + 2)
        } else {
            let mut m = j;
            let mut quote: Option<u8> = None;
            let mut found = None;
            while m < b.len() {
                let c = b[m];
                match quote {
                    Some(q) => {
                        if c == b'\\' && q != b'`' {
                            m += 1;
                        } else if c == q {
                            quote = None;
                        }
                    }
                    None => {
                        if c == b'"' || c == b'`' || c == b'\'' {
                            quote = Some(c);
                        } else if c == b'}' && b.get(m + 1) == Some(&b'}') {
                            found = Some(m);
                            break;
                        }
                    }
                }
                m += 1;
            }
            let Some(m) = found else {
                return Err((start, "unterminated template action `{{`".into()));
            };
            (m, m + 2)
        };
        let mut inner_end = body_end;
        let trim_right = body_end >= 2
            && b[body_end - 1] == b'-'
            && b[body_end - 2].is_ascii_whitespace()
            && body_end > body_start;
        if trim_right {
            inner_end = body_end - 1;
        }
        let inner = text
            .get(body_start..inner_end.max(body_start))
            .unwrap_or("")
            .trim();
        out.push(Token::Action(Action { start, end, inner }));
        pos = end;
    }
    if pos < text.len() {
        out.push(Token::Text {
            start: pos,
            end: text.len(),
        });
    }
    Ok(out)
}

/// The first word of an action (`if`, `end`, `.Values.x`, `include`...).
pub(crate) fn keyword(inner: &str) -> &str {
    inner
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .next()
        .unwrap_or("")
}

/// The path of a plain values reference: `.Values.a.b` or `$.Values.a.b` -> `["a", "b"]`.
/// `None` for anything else (pipelines, function calls, `.Chart`, variables...).
pub(crate) fn values_ref(expr: &str) -> Option<Vec<&str>> {
    let e = expr.trim();
    let e = e.strip_prefix('$').unwrap_or(e);
    let rest = e.strip_prefix(".Values")?;
    if rest.is_empty() {
        return Some(Vec::new());
    }
    let rest = rest.strip_prefix('.')?;
    let segs: Vec<&str> = rest.split('.').collect();
    let ident = |s: &&str| {
        let mut cs = s.chars();
        cs.next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && cs.all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    if segs.iter().all(ident) {
        Some(segs)
    } else {
        None
    }
}

/// A plain condition on values, as a CRD wrapper has: a values reference, `not X`,
/// `and X Y...`, `or X Y...`, each argument a values reference or `true`/`false`.
pub(crate) fn is_plain_condition(expr: &str) -> bool {
    let expr = expr.trim();
    if expr.contains(['|', '(', '"', '`', '\'', ':', '=']) {
        return false;
    }
    let arg = |a: &&str| matches!(*a, "true" | "false") || values_ref(a).is_some();
    let words: Vec<&str> = expr.split_whitespace().collect();
    match words.as_slice() {
        [one] => arg(one),
        ["not", x] => arg(x),
        ["and" | "or", args @ ..] => !args.is_empty() && args.iter().all(arg),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizes() {
        let t = "a: {{ .Values.x }}\n{{- if .Values.y -}}\nb{{/* c }} */}}{{ \"}}\" }}";
        let toks = tokenize(t).expect("tokens");
        let actions: Vec<&str> = toks
            .iter()
            .filter_map(|t| match t {
                Token::Action(a) => Some(a.inner),
                Token::Text { .. } => None,
            })
            .collect();
        assert_eq!(
            actions,
            [".Values.x", "if .Values.y", "/* c }} */", "\"}}\""]
        );
        assert!(tokenize("a {{ b").is_err());
        assert!(tokenize("{{/* a").is_err());
        // `{{-3}}` is the number -3, not a trim marker.
        let toks = tokenize("{{-3}}").expect("tokens");
        assert!(matches!(&toks[0], Token::Action(a) if a.inner == "-3"));
    }

    #[test]
    fn plain_conditions() {
        for c in [
            ".Values.a",
            "$.Values.c.d",
            "not .Values.a",
            "and .Values.crds.managed .Values.crds.reservations",
            "or .Values.a false",
            "true",
        ] {
            assert!(is_plain_condition(c), "{c}");
        }
        for c in [
            "",
            "or .Values.a .Capabilities.X",
            "semverCompare \">=1.22\" .Capabilities.KubeVersion.Version",
            "contains \"x\" .Values.b",
            "and",
            "not .Values.a .Values.b",
            ".Values.a | default true",
            "eq .Values.a 1",
        ] {
            assert!(!is_plain_condition(c), "{c}");
        }
    }
}
