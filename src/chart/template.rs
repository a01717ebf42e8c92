//! A minimal reading of Go text/template as Helm uses it: enough to split a template into text
//! and actions (for the engine and the CRD wrappers), and evaluate the plain conditions of a
//! CRD wrapper (`.Values.a.b`, `not`, `and`, `or`). Everything else is "unknown".

use serde_yaml_ng::Value;

/// One action `{{ ... }}` of a template.
#[derive(Debug, Clone)]
pub(crate) struct Action<'a> {
    /// Byte offset of `{{`.
    pub start: usize,
    /// Byte offset just after `}}`.
    pub end: usize,
    /// The text between the delimiters, without trim markers, trimmed.
    pub inner: &'a str,
    /// `{{-`: trims the whitespace before the action.
    pub trim_left: bool,
    /// `-}}`: trims the whitespace after the action.
    pub trim_right: bool,
    /// `{{/* ... */}}`.
    pub comment: bool,
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
        let (body_end, end, comment) = if text[k..].starts_with("/*") {
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
            (after + rd, after + rd + 2, true)
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
            (m, m + 2, false)
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
        out.push(Token::Action(Action {
            start,
            end,
            inner,
            trim_left,
            trim_right,
            comment,
        }));
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

/// Three-valued truth: a condition on values we may not be able to evaluate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tri {
    True,
    False,
    Unknown,
}

impl Tri {
    fn from_bool(b: bool) -> Tri {
        if b {
            Tri::True
        } else {
            Tri::False
        }
    }
    fn not(self) -> Tri {
        match self {
            Tri::True => Tri::False,
            Tri::False => Tri::True,
            Tri::Unknown => Tri::Unknown,
        }
    }
    fn and(self, o: Tri) -> Tri {
        match (self, o) {
            (Tri::False, _) | (_, Tri::False) => Tri::False,
            (Tri::True, Tri::True) => Tri::True,
            _ => Tri::Unknown,
        }
    }
    fn or(self, o: Tri) -> Tri {
        match (self, o) {
            (Tri::True, _) | (_, Tri::True) => Tri::True,
            (Tri::False, Tri::False) => Tri::False,
            _ => Tri::Unknown,
        }
    }
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

/// Look a values path up. `None` when a key is missing or an intermediate is not a mapping.
pub(crate) fn lookup<'v>(values: &'v Value, path: &[&str]) -> Option<&'v Value> {
    let mut cur = values;
    for seg in path {
        cur = match cur {
            Value::Tagged(t) => &t.value,
            other => other,
        };
        cur = cur.as_mapping()?.get(*seg)?;
    }
    Some(cur)
}

/// Go template truthiness.
pub(crate) fn truthy(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64().is_some_and(|f| f != 0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Sequence(s)) => !s.is_empty(),
        Some(Value::Mapping(m)) => !m.is_empty(),
        Some(Value::Tagged(t)) => truthy(Some(&t.value)),
    }
}

fn eval_arg(arg: &str, values: &Value) -> Tri {
    match arg {
        "true" => Tri::True,
        "false" => Tri::False,
        a => match values_ref(a) {
            Some(p) => Tri::from_bool(truthy(lookup(values, &p))),
            None => Tri::Unknown,
        },
    }
}

/// Evaluate an `if` / `with` pipeline: a values reference, `not X`, `and X Y...`, `or X Y...`
/// where each argument is a values reference or `true`/`false`. Anything else is unknown.
pub(crate) fn eval_condition(expr: &str, values: &Value) -> Tri {
    let expr = expr.trim();
    if expr.contains(['|', '(', '"', '`', '\'', ':', '=']) {
        return Tri::Unknown;
    }
    let words: Vec<&str> = expr.split_whitespace().collect();
    match words.as_slice() {
        [] => Tri::Unknown,
        [one] => eval_arg(one, values),
        ["not", x] => eval_arg(x, values).not(),
        ["and", args @ ..] if !args.is_empty() => args
            .iter()
            .fold(Tri::True, |acc, a| acc.and(eval_arg(a, values))),
        ["or", args @ ..] if !args.is_empty() => args
            .iter()
            .fold(Tri::False, |acc, a| acc.or(eval_arg(a, values))),
        _ => Tri::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vals(y: &str) -> Value {
        crate::yaml::parse_value("t", y.as_bytes(), &crate::yaml::VALUES).expect("yaml")
    }

    #[test]
    fn tokenizes() {
        let t = "a: {{ .Values.x }}\n{{- if .Values.y -}}\nb{{/* c }} */}}{{ \"}}\" }}";
        let toks = tokenize(t).expect("tokens");
        let actions: Vec<(&str, bool, bool, bool)> = toks
            .iter()
            .filter_map(|t| match t {
                Token::Action(a) => Some((a.inner, a.trim_left, a.trim_right, a.comment)),
                Token::Text { .. } => None,
            })
            .collect();
        assert_eq!(
            actions,
            [
                (".Values.x", false, false, false),
                ("if .Values.y", true, true, false),
                ("/* c }} */", false, false, true),
                ("\"}}\"", false, false, false)
            ]
        );
        assert!(tokenize("a {{ b").is_err());
        assert!(tokenize("{{/* a").is_err());
        // `{{-3}}` is the number -3, not a trim marker.
        let toks = tokenize("{{-3}}").expect("tokens");
        assert!(matches!(&toks[0], Token::Action(a) if a.inner == "-3" && !a.trim_left));
    }

    #[test]
    fn conditions() {
        let v = vals("a: ''\nb: x\nc: {d: true, e: 0}\nl: []\n");
        assert_eq!(eval_condition(".Values.a", &v), Tri::False);
        assert_eq!(eval_condition(".Values.b", &v), Tri::True);
        assert_eq!(eval_condition("$.Values.c.d", &v), Tri::True);
        assert_eq!(eval_condition(".Values.c.e", &v), Tri::False);
        assert_eq!(eval_condition(".Values.missing.x", &v), Tri::False);
        assert_eq!(eval_condition("not .Values.a", &v), Tri::True);
        assert_eq!(eval_condition("and .Values.b .Values.c.d", &v), Tri::True);
        assert_eq!(eval_condition("and .Values.b .Values.l", &v), Tri::False);
        assert_eq!(eval_condition("or .Values.a .Values.l", &v), Tri::False);
        assert_eq!(
            eval_condition("or .Values.a .Capabilities.X", &v),
            Tri::Unknown
        );
        assert_eq!(
            eval_condition("and .Values.a .Capabilities.X", &v),
            Tri::False
        );
        assert_eq!(
            eval_condition(
                "semverCompare \">=1.22\" .Capabilities.KubeVersion.Version",
                &v
            ),
            Tri::Unknown
        );
        assert_eq!(eval_condition("contains \"x\" .Values.b", &v), Tri::Unknown);
    }
}
