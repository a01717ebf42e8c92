//! A small Go `text/template` engine with the Sprig functions Helm charts use most, for image
//! discovery on hosts without helm.
//!
//! It renders a chart's templates as `helm template` would (same `.Values`, `.Chart`,
//! `.Release`, named templates shared by every file, `include`, `tpl`, `toYaml`, `nindent`,
//! `default`, `printf`, `quote`, ...), with one difference: what cannot be known without a
//! cluster or without a function this engine lacks (`.Capabilities`, `semverCompare` on it,
//! `randAlphaNum`, an unknown function, ...) is not guessed. It becomes an *unknown*:
//!
//! * a value that cannot be computed renders as a marker (a private-use character pair around
//!   an index into [`Rendered::unknowns`]) that the caller can find in the output, so an image
//!   that depends on it is refused, never guessed;
//! * an `if`/`with`/`range` whose condition is unknown renders its first branch when no branch
//!   renders anything that looks like a container image (the branches then only differ in
//!   other fields), and otherwise a *fatal* marker: the chart cannot be read without helm.
//!
//! `lookup` returns an empty mapping, as it does in `helm template`.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::rc::Rc;

use serde_yaml_ng::Value;

use super::template::{tokenize, Token};
use super::{line_of, ChartError};

/// Marks an unknown in rendered text: `OPEN index CLOSE`.
pub(crate) const OPEN: char = '\u{E000}';
/// See [`OPEN`].
pub(crate) const CLOSE: char = '\u{E001}';

/// Why a piece of output is not known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unknown {
    /// Chart file and 1-based line of the action.
    pub file: String,
    pub line: usize,
    /// The action, as written.
    pub action: String,
    /// What could not be evaluated.
    pub reason: String,
    /// A control structure whose branches render images: refuse wherever it lands.
    pub fatal: bool,
}

/// A template value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum V {
    Nil,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    /// Lists and maps are shared: passing `.` to a named template copies no values.
    List(Rc<Vec<V>>),
    Map(Rc<BTreeMap<String, V>>),
    /// Not known: the index of its [`Unknown`].
    Unknown(usize),
}

impl V {
    pub(crate) fn from_yaml(v: &Value) -> V {
        match v {
            Value::Null => V::Nil,
            Value::Bool(b) => V::Bool(*b),
            // Helm reads values through JSON: every number is a float64.
            Value::Number(n) => V::Float(n.as_f64().unwrap_or(0.0)),
            Value::String(s) => V::Str(s.clone()),
            Value::Sequence(s) => V::List(Rc::new(s.iter().map(V::from_yaml).collect())),
            Value::Mapping(m) => V::Map(Rc::new(
                m.iter()
                    .map(|(k, v)| {
                        (
                            super::scalar_to_string(k).unwrap_or_default(),
                            V::from_yaml(v),
                        )
                    })
                    .collect(),
            )),
            Value::Tagged(t) => V::from_yaml(&t.value),
        }
    }

    fn to_yaml(&self) -> Option<Value> {
        Some(match self {
            V::Nil => Value::Null,
            V::Bool(b) => Value::Bool(*b),
            V::Int(i) => Value::Number((*i).into()),
            V::Float(f) => {
                if f.fract() == 0.0 && f.abs() < 9.0e15 {
                    Value::Number((*f as i64).into())
                } else {
                    Value::Number((*f).into())
                }
            }
            V::Str(s) => Value::String(s.clone()),
            V::List(l) => Value::Sequence(l.iter().map(V::to_yaml).collect::<Option<_>>()?),
            V::Map(m) => Value::Mapping(
                m.iter()
                    .map(|(k, v)| Some((Value::String(k.clone()), v.to_yaml()?)))
                    .collect::<Option<_>>()?,
            ),
            V::Unknown(_) => return None,
        })
    }

    fn unknown(&self) -> Option<usize> {
        match self {
            V::Unknown(i) => Some(*i),
            _ => None,
        }
    }

    /// Go template truth.
    fn truthy(&self) -> bool {
        match self {
            V::Nil => false,
            V::Bool(b) => *b,
            V::Int(i) => *i != 0,
            V::Float(f) => *f != 0.0,
            V::Str(s) => !s.is_empty(),
            V::List(l) => !l.is_empty(),
            V::Map(m) => !m.is_empty(),
            V::Unknown(_) => false,
        }
    }
}

/// Go's `%v` of a float64 (`1e+06`, `1.5`, `100000`): shortest digits, the exponent form
/// when the exponent is below -4 or at least 6 (Helm reads every number of the values as a
/// float64, so `{{ .Values.x }}` of 1000000 renders `1e+06` there too).
fn go_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    if f == 0.0 {
        return "0".into();
    }
    let e = format!("{f:e}");
    let (mant, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if !(-4..6).contains(&exp) {
        return format!("{mant}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    format!("{f}")
}

/// How a value prints in a template (`{{ x }}`), with Helm's `<no value>` → "".
fn print_v(v: &V) -> String {
    match v {
        V::Nil => String::new(),
        V::Bool(b) => b.to_string(),
        V::Int(i) => i.to_string(),
        V::Float(f) => go_float(*f),
        V::Str(s) => s.clone(),
        V::List(l) => format!("[{}]", l.iter().map(print_v).collect::<Vec<_>>().join(" ")),
        V::Map(m) => format!(
            "map[{}]",
            m.iter()
                .map(|(k, v)| format!("{k}:{}", print_v(v)))
                .collect::<Vec<_>>()
                .join(" ")
        ),
        V::Unknown(i) => format!("{OPEN}{i}{CLOSE}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Parsing

#[derive(Debug, Clone)]
enum Arg {
    /// `.a.b` (from dot), `$.a.b` (from root), `$x.a.b` (from a variable).
    Field {
        base: Base,
        path: Vec<String>,
    },
    Lit(V),
    /// A function name.
    Func(String),
    /// `( pipeline )` with an optional field chain after it.
    Sub(Box<Pipe>, Vec<String>),
}

#[derive(Debug, Clone, PartialEq)]
enum Base {
    Dot,
    Var(String),
}

#[derive(Debug, Clone)]
struct Pipe {
    /// `$x :=` / `$x =` / `$i, $v :=`.
    decl: Vec<String>,
    assign: bool,
    cmds: Vec<Vec<Arg>>,
    text: String,
}

#[derive(Debug, Clone)]
enum Node {
    Text(String),
    Out(Pipe, usize),
    If(Vec<(Pipe, Vec<Node>)>, Vec<Node>, usize),
    With(Pipe, Vec<Node>, Vec<Node>, usize),
    Range(Pipe, Vec<Node>, Vec<Node>, usize),
    Template(String, Option<Pipe>, usize),
}

#[derive(Debug)]
enum Tk {
    Str(String),
    Int(i64),
    Float(f64),
    Word(String),
    Field(Vec<String>),
    Var(String, Vec<String>),
    Open,
    Close,
    Bar,
    Declare,
    Assign,
    Comma,
}

fn lex(s: &str) -> Result<Vec<Tk>, String> {
    let b: Vec<char> = s.chars().collect();
    let mut i = 0;
    let mut out = Vec::new();
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    while i < b.len() {
        let c = b[i];
        match c {
            c if c.is_whitespace() => i += 1,
            '(' | ')' | '|' | ',' => {
                out.push(match c {
                    '(' => Tk::Open,
                    ')' => Tk::Close,
                    '|' => Tk::Bar,
                    _ => Tk::Comma,
                });
                i += 1
            }
            ':' if b.get(i + 1) == Some(&'=') => {
                out.push(Tk::Declare);
                i += 2
            }
            '=' => {
                out.push(Tk::Assign);
                i += 1
            }
            '"' => {
                let mut v = String::new();
                i += 1;
                loop {
                    let Some(&c) = b.get(i) else {
                        return Err("unterminated string".into());
                    };
                    i += 1;
                    match c {
                        '"' => break,
                        '\\' => {
                            let e = b.get(i).copied().ok_or("unterminated string")?;
                            i += 1;
                            v.push(match e {
                                'n' => '\n',
                                't' => '\t',
                                'r' => '\r',
                                '0' => '\0',
                                other => other,
                            });
                        }
                        c => v.push(c),
                    }
                }
                out.push(Tk::Str(v));
            }
            '`' => {
                let start = i + 1;
                let end = b[start..]
                    .iter()
                    .position(|&c| c == '`')
                    .ok_or("unterminated raw string")?;
                out.push(Tk::Str(b[start..start + end].iter().collect()));
                i = start + end + 1;
            }
            '\'' => {
                let ch = b.get(i + 1).copied().ok_or("unterminated character")?;
                if b.get(i + 2) != Some(&'\'') {
                    return Err("unsupported character literal".into());
                }
                out.push(Tk::Int(ch as i64));
                i += 3;
            }
            '.' | '$' => {
                let mut var = None;
                if c == '$' {
                    let start = i;
                    i += 1;
                    while i < b.len() && ident(b[i]) {
                        i += 1;
                    }
                    var = Some(b[start..i].iter().collect::<String>());
                }
                let mut path = Vec::new();
                while b.get(i) == Some(&'.') {
                    i += 1;
                    let start = i;
                    while i < b.len() && ident(b[i]) {
                        i += 1;
                    }
                    if i > start {
                        path.push(b[start..i].iter().collect());
                    }
                }
                out.push(match var {
                    Some(v) => Tk::Var(v, path),
                    None => Tk::Field(path),
                });
            }
            c if c.is_ascii_digit()
                || ((c == '-' || c == '+') && b.get(i + 1).is_some_and(|d| d.is_ascii_digit())) =>
            {
                let start = i;
                i += 1;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == '.' || b[i] == '_') {
                    i += 1;
                }
                let t: String = b[start..i].iter().filter(|&&c| c != '_').collect();
                if let Ok(n) = t.parse::<i64>() {
                    out.push(Tk::Int(n));
                } else if let Some(h) = t.strip_prefix("0x") {
                    out.push(Tk::Int(
                        i64::from_str_radix(h, 16).map_err(|_| format!("bad number {t}"))?,
                    ));
                } else {
                    out.push(Tk::Float(t.parse().map_err(|_| format!("bad number {t}"))?));
                }
            }
            c if ident(c) => {
                let start = i;
                while i < b.len() && ident(b[i]) {
                    i += 1;
                }
                out.push(Tk::Word(b[start..i].iter().collect()));
            }
            other => return Err(format!("unexpected {other:?}")),
        }
    }
    Ok(out)
}

fn parse_pipe(text: &str) -> Result<Pipe, String> {
    let toks = lex(text)?;
    let mut pos = 0;
    let p = pipe_of(&toks, &mut pos, text)?;
    if pos != toks.len() {
        return Err("unexpected `)`".into());
    }
    Ok(p)
}

fn pipe_of(t: &[Tk], pos: &mut usize, text: &str) -> Result<Pipe, String> {
    let mut decl = Vec::new();
    let mut assign = false;
    // `$x :=`, `$x =`, `$i, $v :=`
    let save = *pos;
    let mut names = Vec::new();
    while let Some(Tk::Var(v, p)) = t.get(*pos) {
        if !p.is_empty() {
            break;
        }
        names.push(v.clone());
        *pos += 1;
        match t.get(*pos) {
            Some(Tk::Comma) => *pos += 1,
            Some(Tk::Declare) => {
                *pos += 1;
                decl = names.clone();
                break;
            }
            Some(Tk::Assign) => {
                *pos += 1;
                decl = names.clone();
                assign = true;
                break;
            }
            _ => break,
        }
    }
    if decl.is_empty() {
        *pos = save;
    }
    let mut cmds = Vec::new();
    let mut cmd = Vec::new();
    loop {
        match t.get(*pos) {
            None | Some(Tk::Close) => break,
            Some(Tk::Bar) => {
                *pos += 1;
                if cmd.is_empty() {
                    return Err("empty command in pipeline".into());
                }
                cmds.push(std::mem::take(&mut cmd));
            }
            Some(Tk::Open) => {
                *pos += 1;
                let sub = pipe_of(t, pos, text)?;
                if !matches!(t.get(*pos), Some(Tk::Close)) {
                    return Err("unclosed `(`".into());
                }
                *pos += 1;
                let mut chain = Vec::new();
                if let Some(Tk::Field(p)) = t.get(*pos) {
                    chain = p.clone();
                    *pos += 1;
                }
                cmd.push(Arg::Sub(Box::new(sub), chain));
            }
            Some(tok) => {
                *pos += 1;
                cmd.push(match tok {
                    Tk::Str(s) => Arg::Lit(V::Str(s.clone())),
                    Tk::Int(i) => Arg::Lit(V::Int(*i)),
                    Tk::Float(f) => Arg::Lit(V::Float(*f)),
                    Tk::Word(w) => match w.as_str() {
                        "true" => Arg::Lit(V::Bool(true)),
                        "false" => Arg::Lit(V::Bool(false)),
                        "nil" => Arg::Lit(V::Nil),
                        _ => Arg::Func(w.clone()),
                    },
                    Tk::Field(p) => Arg::Field {
                        base: Base::Dot,
                        path: p.clone(),
                    },
                    Tk::Var(v, p) => Arg::Field {
                        base: Base::Var(v.clone()),
                        path: p.clone(),
                    },
                    _ => return Err("unexpected token".into()),
                });
            }
        }
    }
    if !cmd.is_empty() {
        cmds.push(cmd);
    }
    if cmds.is_empty() {
        return Err("missing value".into());
    }
    Ok(Pipe {
        decl,
        assign,
        cmds,
        text: text.trim().to_string(),
    })
}

/// A template parsed into nodes, plus the named templates it defines.
pub(crate) struct Parsed {
    nodes: Vec<Node>,
    defines: Vec<(String, Vec<Node>)>,
}

enum Frame {
    Root,
    If(Vec<(Pipe, Vec<Node>)>, Option<Vec<Node>>, usize),
    /// The last field: opened by `else with`, so the `end` closes the outer `with` too.
    With(Pipe, Vec<Node>, Option<Vec<Node>>, usize, bool),
    Range(Pipe, Vec<Node>, Option<Vec<Node>>, usize),
    Define(String),
}

/// `"name" ARG...` -> (name, the argument text if any).
fn name_and_arg(rest: &str) -> Option<(String, Option<&str>)> {
    let r = rest.trim_start();
    let q = r.chars().next().filter(|c| *c == '"' || *c == '`')?;
    let body = &r[1..];
    let end = body.find(q)?;
    let name = body[..end].to_string();
    let arg = body[end + 1..].trim();
    Some((name, (!arg.is_empty()).then_some(arg)))
}

/// Parse a template file. Errors name the file and line.
pub(crate) fn parse(file: &str, text: &str) -> Result<Parsed, ChartError> {
    let syntax = |pos: usize, reason: String| ChartError::TemplateSyntax {
        template: file.to_string(),
        line: line_of(text, pos),
        reason,
    };
    let tokens = tokenize(text).map_err(|(pos, r)| syntax(pos, r))?;
    // (frame, nodes collected in it)
    let mut stack: Vec<(Frame, Vec<Node>)> = vec![(Frame::Root, Vec::new())];
    let mut defines = Vec::new();
    for (i, tok) in tokens.iter().enumerate() {
        match tok {
            Token::Text { start, end } => {
                let mut t = &text[*start..*end];
                if let Some(Token::Action(prev)) = i.checked_sub(1).and_then(|j| tokens.get(j)) {
                    if prev.trim_right {
                        t = t.trim_start();
                    }
                }
                if let Some(Token::Action(next)) = tokens.get(i + 1) {
                    if next.trim_left {
                        t = t.trim_end();
                    }
                }
                if !t.is_empty() {
                    if let Some((_, nodes)) = stack.last_mut() {
                        nodes.push(Node::Text(t.to_string()));
                    }
                }
            }
            Token::Action(a) => {
                if a.comment {
                    continue;
                }
                let line = line_of(text, a.start);
                let inner = a.inner;
                let kw = super::template::keyword(inner);
                let rest = inner[kw.len()..].trim();
                let pipe = |s: &str| {
                    parse_pipe(s).map_err(|r| syntax(a.start, format!("`{{{{ {inner} }}}}`: {r}")))
                };
                match kw {
                    "if" => stack.push((
                        Frame::If(vec![(pipe(rest)?, Vec::new())], None, line),
                        Vec::new(),
                    )),
                    "with" => stack.push((
                        Frame::With(pipe(rest)?, Vec::new(), None, line, false),
                        Vec::new(),
                    )),
                    "range" => stack.push((
                        Frame::Range(pipe(rest)?, Vec::new(), None, line),
                        Vec::new(),
                    )),
                    "define" | "block" | "template" => {
                        let (name, arg) = name_and_arg(rest).ok_or_else(|| {
                            syntax(a.start, format!("`{kw}` needs a quoted template name"))
                        })?;
                        let arg = match arg {
                            Some(t) if kw != "define" => Some(pipe(t)?),
                            _ => None,
                        };
                        if kw != "define" {
                            if let Some((_, nodes)) = stack.last_mut() {
                                nodes.push(Node::Template(name.clone(), arg, line));
                            }
                        }
                        if kw != "template" {
                            stack.push((Frame::Define(name), Vec::new()));
                        }
                    }
                    "else" => {
                        let Some((frame, nodes)) = stack.last_mut() else {
                            return Err(syntax(a.start, "`else` outside a block".into()));
                        };
                        let body = std::mem::take(nodes);
                        let sub = super::template::keyword(rest);
                        match frame {
                            Frame::If(branches, els, _) if els.is_none() => {
                                if let Some(last) = branches.last_mut() {
                                    last.1 = body;
                                }
                                if sub == "if" {
                                    branches.push((pipe(rest[2..].trim())?, Vec::new()));
                                } else {
                                    *els = Some(Vec::new());
                                }
                            }
                            Frame::With(_, b, els, _, _) | Frame::Range(_, b, els, _)
                                if els.is_none() =>
                            {
                                *b = body;
                                *els = Some(Vec::new());
                                if sub == "with" {
                                    // `else with X`: a `with X` in the else branch, closed by
                                    // the same `end` as the outer one.
                                    let nested = pipe(rest[4..].trim())?;
                                    stack.push((
                                        Frame::With(nested, Vec::new(), None, line, true),
                                        Vec::new(),
                                    ));
                                }
                            }
                            _ => return Err(syntax(a.start, "unexpected `else`".into())),
                        }
                    }
                    "end" => loop {
                        let Some((frame, nodes)) = stack.pop() else {
                            return Err(syntax(a.start, "`end` without an opening action".into()));
                        };
                        let mut chained = false;
                        let node = match frame {
                            Frame::Root => {
                                return Err(syntax(
                                    a.start,
                                    "`end` without an opening action".into(),
                                ))
                            }
                            Frame::If(mut branches, els, l) => match els {
                                None => {
                                    if let Some(last) = branches.last_mut() {
                                        last.1 = nodes;
                                    }
                                    Some(Node::If(branches, Vec::new(), l))
                                }
                                Some(_) => Some(Node::If(branches, nodes, l)),
                            },
                            Frame::With(p, body, els, l, c) => {
                                chained = c;
                                Some(match els {
                                    None => Node::With(p, nodes, Vec::new(), l),
                                    Some(_) => Node::With(p, body, nodes, l),
                                })
                            }
                            Frame::Range(p, body, els, l) => Some(match els {
                                None => Node::Range(p, nodes, Vec::new(), l),
                                Some(_) => Node::Range(p, body, nodes, l),
                            }),
                            Frame::Define(name) => {
                                defines.push((name, nodes));
                                None
                            }
                        };
                        if let Some(n) = node {
                            match stack.last_mut() {
                                Some((_, parent)) => parent.push(n),
                                None => {
                                    return Err(syntax(
                                        a.start,
                                        "`end` without an opening action".into(),
                                    ))
                                }
                            }
                        }
                        if !chained {
                            break;
                        }
                    },
                    "break" | "continue" => {
                        return Err(syntax(
                            a.start,
                            format!("`{kw}` is not supported by the built-in reader"),
                        ));
                    }
                    _ => {
                        let p = pipe(inner)?;
                        if let Some((_, nodes)) = stack.last_mut() {
                            nodes.push(Node::Out(p, line));
                        }
                    }
                }
            }
        }
    }
    if stack.len() != 1 {
        return Err(syntax(
            text.len(),
            "unexpected end of template: a block is not closed with `end`".into(),
        ));
    }
    let nodes = stack.pop().map(|(_, n)| n).unwrap_or_default();
    Ok(Parsed { nodes, defines })
}

// ---------------------------------------------------------------------------------------------
// Evaluation

/// The result of rendering one file.
#[derive(Debug)]
pub(crate) struct Rendered {
    pub text: String,
    /// (offset in `text`, 1-based source line) at the start of every piece of output.
    pub lines: Vec<(usize, usize)>,
}

/// Renders the templates of one chart.
pub(crate) struct Engine<'c> {
    defines: HashMap<String, (String, Vec<Node>)>,
    root: V,
    files: &'c super::ChartArchive,
    pub unknowns: Vec<Unknown>,
    depth: usize,
    /// Evaluation steps left (nodes, commands, range iterations): a hostile chart (a template
    /// including itself twice per level, `range 1000000000`) must end, and soon.
    budget: usize,
}

/// Evaluation steps one chart may take (the 21 Koordinator charts take under 100 000).
const BUDGET: usize = 20_000_000;
/// Deepest nesting of `include`/`template` (helm allows more; charts use a handful, and the
/// engine recurses on the stack).
const MAX_INCLUDE_DEPTH: usize = 30;
/// Largest text one file may render.
const MAX_OUTPUT: usize = 64 * 1024 * 1024;

#[derive(Clone)]
struct Scope {
    dot: V,
    vars: Vec<(String, V)>,
}

impl Scope {
    fn var(&self, name: &str) -> Option<&V> {
        self.vars
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
    }
}

/// Rendering stopped where helm's would stop too.
struct Fail {
    /// 1-based line of the action (0 when unknown).
    line: usize,
    reason: String,
}

type R<T> = Result<T, Fail>;

/// Capitalised `.Chart` field names, as Helm's `chart.Metadata` has them.
fn chart_field(key: &str) -> String {
    match key {
        "apiVersion" => "APIVersion".into(),
        k => {
            let mut c = k.chars();
            c.next()
                .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
                .unwrap_or_default()
        }
    }
}

impl<'c> Engine<'c> {
    /// An engine for `chart` with `values`; every template file's named templates are
    /// registered (in path order, a later definition replacing an earlier one).
    pub(crate) fn new(
        chart: &'c super::ChartArchive,
        values: &Value,
        release: &str,
        namespace: &str,
    ) -> Result<(Self, Vec<(String, Parsed)>), ChartError> {
        let mut parsed = Vec::new();
        let mut defines = HashMap::new();
        for (path, bytes) in chart.templates() {
            let Ok(text) = std::str::from_utf8(bytes) else {
                continue;
            };
            if path.ends_with("NOTES.txt") {
                continue;
            }
            let p = parse(path, text)?;
            for (name, nodes) in &p.defines {
                defines.insert(name.clone(), (path.to_string(), nodes.clone()));
            }
            parsed.push((path.to_string(), p));
        }
        let mut chart_map = BTreeMap::new();
        if let serde_json::Value::Object(m) = chart.chart_yaml_json() {
            for (k, v) in m {
                // Chart.yaml was parsed (bounded) when the archive was read: convert, do not
                // print and parse again.
                let yaml = serde_yaml_ng::to_value(v).unwrap_or(Value::Null);
                chart_map.insert(chart_field(k), V::from_yaml(&yaml));
            }
        }
        let mut rel = BTreeMap::new();
        rel.insert("Name".into(), V::Str(release.into()));
        rel.insert("Namespace".into(), V::Str(namespace.into()));
        rel.insert("Service".into(), V::Str("Helm".into()));
        rel.insert("IsInstall".into(), V::Bool(true));
        rel.insert("IsUpgrade".into(), V::Bool(false));
        rel.insert("Revision".into(), V::Int(1));
        let mut root = BTreeMap::new();
        root.insert("Values".into(), V::from_yaml(values));
        root.insert("Chart".into(), V::Map(Rc::new(chart_map)));
        root.insert("Release".into(), V::Map(Rc::new(rel)));
        Ok((
            Engine {
                defines,
                root: V::Map(Rc::new(root)),
                files: chart,
                unknowns: Vec::new(),
                depth: 0,
                budget: BUDGET,
            },
            parsed,
        ))
    }

    fn unknown(&mut self, file: &str, line: usize, action: &str, reason: String, fatal: bool) -> V {
        self.unknowns.push(Unknown {
            file: file.to_string(),
            line,
            action: action.to_string(),
            reason,
            fatal,
        });
        V::Unknown(self.unknowns.len() - 1)
    }

    /// Render one parsed file. Errors: what helm would fail on too (`required`, `fail`, a
    /// field of nil), naming the file and line.
    pub(crate) fn render(&mut self, file: &str, parsed: &Parsed) -> Result<Rendered, ChartError> {
        let mut root = self.root.clone();
        if let V::Map(m) = &mut root {
            let m = Rc::make_mut(m);
            let mut t = BTreeMap::new();
            t.insert(
                "Name".into(),
                V::Str(format!("{}/{file}", self.files.top_dir())),
            );
            t.insert(
                "BasePath".into(),
                V::Str(format!("{}/templates", self.files.top_dir())),
            );
            m.insert("Template".into(), V::Map(Rc::new(t)));
        }
        let mut scope = Scope {
            dot: root.clone(),
            vars: vec![("$".into(), root)],
        };
        let mut out = Rendered {
            text: String::new(),
            lines: Vec::new(),
        };
        self.nodes(file, &parsed.nodes, &mut scope, &mut out)
            .map_err(|Fail { line, reason }| ChartError::TemplateFailed {
                template: file.to_string(),
                line,
                reason,
            })?;
        Ok(out)
    }

    fn nodes(
        &mut self,
        file: &str,
        nodes: &[Node],
        scope: &mut Scope,
        out: &mut Rendered,
    ) -> R<()> {
        let vars_before = scope.vars.len();
        for n in nodes {
            self.node(file, n, scope, out)?;
        }
        scope.vars.truncate(vars_before.max(1));
        Ok(())
    }

    fn fail(line: usize, msg: impl std::fmt::Display) -> Fail {
        Fail {
            line,
            reason: msg.to_string(),
        }
    }

    /// Render `nodes` into a string of its own (for branches and includes).
    fn sub(&mut self, file: &str, nodes: &[Node], scope: &Scope) -> R<String> {
        let mut s = scope.clone();
        let mut o = Rendered {
            text: String::new(),
            lines: Vec::new(),
        };
        self.nodes(file, nodes, &mut s, &mut o)?;
        if o.text.len() > MAX_OUTPUT {
            return Err(Self::fail(
                0,
                format!("renders more than {MAX_OUTPUT} bytes: refused"),
            ));
        }
        Ok(o.text)
    }

    /// Could this rendered text hold a container image (or something unknown)?
    fn image_bearing(text: &str) -> bool {
        text.contains(OPEN) || text.contains("image") || text.contains("ontainers")
    }

    fn step(&mut self, line: usize) -> R<()> {
        self.budget = self.budget.checked_sub(1).ok_or_else(|| {
            Self::fail(
                line,
                format!("rendering takes more than {BUDGET} steps: refused (a template that never ends?)"),
            )
        })?;
        Ok(())
    }

    fn node(&mut self, file: &str, n: &Node, scope: &mut Scope, out: &mut Rendered) -> R<()> {
        self.step(0)?;
        if out.text.len() > MAX_OUTPUT {
            return Err(Self::fail(
                0,
                format!("renders more than {MAX_OUTPUT} bytes: refused"),
            ));
        }
        match n {
            Node::Text(t) => {
                out.text.push_str(t);
            }
            Node::Out(p, line) => {
                let v = self.pipe(file, *line, p, scope)?;
                if p.decl.is_empty() {
                    out.lines.push((out.text.len(), *line));
                    out.text.push_str(&print_v(&v));
                }
            }
            Node::If(branches, els, line) => {
                let mut chosen: Option<&[Node]> = None;
                let mut unknown: Option<(usize, String)> = None;
                for (cond, body) in branches {
                    let v = self.pipe(file, *line, cond, scope)?;
                    if let Some(u) = v.unknown() {
                        unknown = Some((u, cond.text.clone()));
                        break;
                    }
                    if v.truthy() {
                        chosen = Some(body);
                        break;
                    }
                }
                match unknown {
                    None => {
                        let body = chosen.unwrap_or(els);
                        out.lines.push((out.text.len(), *line));
                        self.nodes(file, body, scope, out)?;
                    }
                    Some((u, cond)) => {
                        let mut texts = Vec::new();
                        for (_, body) in branches {
                            texts.push(self.sub(file, body, scope)?);
                        }
                        texts.push(self.sub(file, els, scope)?);
                        self.unknown_block(file, *line, &format!("if {cond}"), u, &texts, out);
                    }
                }
            }
            Node::With(p, body, els, line) => {
                let v = self.pipe(file, *line, p, scope)?;
                if let Some(u) = v.unknown() {
                    let mut s = scope.clone();
                    s.dot = v.clone();
                    let texts = vec![self.sub(file, body, &s)?, self.sub(file, els, scope)?];
                    self.unknown_block(file, *line, &format!("with {}", p.text), u, &texts, out);
                } else if v.truthy() {
                    let saved = std::mem::replace(&mut scope.dot, v);
                    out.lines.push((out.text.len(), *line));
                    let r = self.nodes(file, body, scope, out);
                    scope.dot = saved;
                    r?;
                } else {
                    self.nodes(file, els, scope, out)?;
                }
            }
            Node::Range(p, body, els, line) => {
                let mut pp = p.clone();
                let names = std::mem::take(&mut pp.decl);
                let v = self.pipe(file, *line, &pp, scope)?;
                let items: Vec<(V, V)> = match &v {
                    V::List(l) => l
                        .iter()
                        .enumerate()
                        .map(|(i, x)| (V::Int(i as i64), x.clone()))
                        .collect(),
                    V::Map(m) => m
                        .iter()
                        .map(|(k, x)| (V::Str(k.clone()), x.clone()))
                        .collect(),
                    V::Int(n) => {
                        if usize::try_from(*n).unwrap_or(0) > self.budget {
                            return Err(Self::fail(
                                *line,
                                format!("range over {n}: more steps than allowed"),
                            ));
                        }
                        (0..*n).map(|i| (V::Int(i), V::Int(i))).collect()
                    }
                    V::Nil => Vec::new(),
                    V::Unknown(u) => {
                        let mut s = scope.clone();
                        s.dot = v.clone();
                        for n in &names {
                            s.vars.push((n.clone(), v.clone()));
                        }
                        let texts = vec![self.sub(file, body, &s)?, self.sub(file, els, scope)?];
                        self.unknown_block(
                            file,
                            *line,
                            &format!("range {}", p.text),
                            *u,
                            &texts,
                            out,
                        );
                        return Ok(());
                    }
                    other => {
                        return Err(Self::fail(
                            *line,
                            format!("range can't iterate over {}", print_v(other)),
                        ))
                    }
                };
                if items.is_empty() {
                    return self.nodes(file, els, scope, out);
                }
                for (k, x) in items {
                    self.step(*line)?;
                    // The body runs in this scope (an `=` to an outer variable is kept, as in
                    // Go); its own variables end with the iteration.
                    let saved = std::mem::replace(&mut scope.dot, x.clone());
                    let before = scope.vars.len();
                    match names.as_slice() {
                        [] => {}
                        [one] => scope.vars.push((one.clone(), x.clone())),
                        [a, b, ..] => {
                            scope.vars.push((a.clone(), k));
                            scope.vars.push((b.clone(), x.clone()));
                        }
                    }
                    out.lines.push((out.text.len(), *line));
                    let r = self.nodes(file, body, scope, out);
                    scope.vars.truncate(before);
                    scope.dot = saved;
                    r?;
                }
            }
            Node::Template(name, arg, line) => {
                let dot = match arg {
                    Some(p) => self.pipe(file, *line, p, scope)?,
                    None => V::Nil,
                };
                let text = self.include(*line, name, dot)?;
                out.lines.push((out.text.len(), *line));
                out.text.push_str(&text);
            }
        }
        Ok(())
    }

    /// An `if`/`with`/`range` on an unknown value: harmless when no branch can hold an image.
    fn unknown_block(
        &mut self,
        file: &str,
        line: usize,
        action: &str,
        cause: usize,
        texts: &[String],
        out: &mut Rendered,
    ) {
        out.lines.push((out.text.len(), line));
        if texts.iter().any(|t| Self::image_bearing(t)) {
            let reason = format!(
                "its condition depends on {} and a branch renders container images",
                self.unknowns
                    .get(cause)
                    .map(|u| u.reason.clone())
                    .unwrap_or_default()
            );
            let v = self.unknown(file, line, action, reason, true);
            out.text.push_str(&format!("\n{}\n", print_v(&v)));
        } else if let Some(first) = texts.first() {
            out.text.push_str(first);
        }
    }

    fn include(&mut self, line: usize, name: &str, dot: V) -> R<String> {
        let Some((def_file, nodes)) = self.defines.get(name).cloned() else {
            return Err(Self::fail(
                line,
                format!("no template {name:?} associated with template"),
            ));
        };
        if self.depth > MAX_INCLUDE_DEPTH {
            return Err(Self::fail(
                line,
                format!("template {name:?}: includes nested more than {MAX_INCLUDE_DEPTH} deep"),
            ));
        }
        self.depth += 1;
        // As Go's text/template: `$` is the data the template is executed with.
        let scope = Scope {
            dot: dot.clone(),
            vars: vec![("$".into(), dot)],
        };
        let r = self.sub(&def_file, &nodes, &scope);
        self.depth -= 1;
        r
    }

    fn pipe(&mut self, file: &str, line: usize, p: &Pipe, scope: &mut Scope) -> R<V> {
        let mut last: Option<V> = None;
        for cmd in &p.cmds {
            last = Some(self.cmd(file, line, p, cmd, last.take(), scope)?);
        }
        let v = last.unwrap_or(V::Nil);
        if !p.decl.is_empty() {
            for name in &p.decl {
                if p.assign {
                    if let Some(slot) = scope.vars.iter_mut().rev().find(|(n, _)| n == name) {
                        slot.1 = v.clone();
                        continue;
                    }
                }
                scope.vars.push((name.clone(), v.clone()));
            }
        }
        Ok(v)
    }

    fn arg(&mut self, file: &str, line: usize, p: &Pipe, a: &Arg, scope: &mut Scope) -> R<V> {
        match a {
            Arg::Lit(v) => Ok(v.clone()),
            Arg::Field { base, path } => {
                let start = match base {
                    Base::Dot => scope.dot.clone(),
                    Base::Var(n) => match scope.var(n) {
                        Some(v) => v.clone(),
                        None => return Err(Self::fail(line, format!("undefined variable {n:?}"))),
                    },
                };
                self.field(file, line, p, start, path)
            }
            Arg::Sub(sub, chain) => {
                let mut s = scope.clone();
                let v = self.pipe(file, line, sub, &mut s)?;
                self.field(file, line, p, v, chain)
            }
            Arg::Func(f) => self.call(file, line, p, f, Vec::new()),
        }
    }

    fn field(&mut self, file: &str, line: usize, p: &Pipe, mut v: V, path: &[String]) -> R<V> {
        for (i, seg) in path.iter().enumerate() {
            v = match v {
                V::Unknown(_) => return Ok(v),
                V::Map(m) => match m.get(seg) {
                    Some(x) => x.clone(),
                    // `.Capabilities`, `.Files`, `.Subcharts`: known only to helm and the
                    // cluster.
                    None if i == 0
                        && m.contains_key("Release")
                        && m.contains_key("Values")
                        && matches!(seg.as_str(), "Capabilities" | "Files" | "Subcharts") =>
                    {
                        let reason = format!(".{seg} (known only to helm and the cluster)");
                        return Ok(self.unknown(file, line, &p.text, reason, false));
                    }
                    None => V::Nil,
                },
                V::Nil => {
                    return Err(Self::fail(
                        line,
                        format!(
                            "nil pointer evaluating interface {{}}.{seg} (in `{}`)",
                            p.text
                        ),
                    ))
                }
                other => {
                    return Err(Self::fail(
                        line,
                        format!(
                            "can't evaluate field {seg} in type {} (in `{}`)",
                            type_name(&other),
                            p.text
                        ),
                    ))
                }
            };
        }
        Ok(v)
    }

    fn cmd(
        &mut self,
        file: &str,
        line: usize,
        p: &Pipe,
        cmd: &[Arg],
        piped: Option<V>,
        scope: &mut Scope,
    ) -> R<V> {
        let Some(first) = cmd.first() else {
            return Ok(V::Nil);
        };
        if let Arg::Func(f) = first {
            // Lazy functions first.
            if f == "and" || f == "or" {
                let mut last = V::Bool(f == "and");
                let mut args: Vec<&Arg> = cmd[1..].iter().collect();
                let piped_arg;
                if let Some(pv) = piped {
                    piped_arg = Arg::Lit(pv);
                    args.push(&piped_arg);
                }
                for a in args {
                    let v = self.arg(file, line, p, a, scope)?;
                    if v.unknown().is_some() {
                        return Ok(v);
                    }
                    let stop = if f == "and" { !v.truthy() } else { v.truthy() };
                    last = v;
                    if stop {
                        break;
                    }
                }
                return Ok(last);
            }
            let mut args = Vec::new();
            for a in &cmd[1..] {
                args.push(self.arg(file, line, p, a, scope)?);
            }
            if let Some(pv) = piped {
                args.push(pv);
            }
            return self.call(file, line, p, f, args);
        }
        if cmd.len() > 1 {
            // `.Files.Get "x"` and other method calls.
            if let Arg::Field { path, .. } = first {
                if path.first().map(String::as_str) == Some("Files") {
                    if let (Some("Get"), Some(Arg::Lit(V::Str(name)))) =
                        (path.get(1).map(String::as_str), cmd.get(1))
                    {
                        return Ok(match self.files.file(name) {
                            Some(b) => V::Str(String::from_utf8_lossy(b).into_owned()),
                            None => V::Str(String::new()),
                        });
                    }
                }
            }
            let reason = format!("a method call (`{}`)", p.text);
            return Ok(self.unknown(file, line, &p.text, reason, false));
        }
        let v = self.arg(file, line, p, first, scope)?;
        Ok(v)
    }

    fn call(&mut self, file: &str, line: usize, p: &Pipe, f: &str, args: Vec<V>) -> R<V> {
        // Functions that take an unknown argument in their stride.
        match f {
            "default" => {
                return Ok(match args.as_slice() {
                    [d] => d.clone(),
                    [d, v, ..] => {
                        if v.unknown().is_some() {
                            v.clone()
                        } else if empty(v) {
                            d.clone()
                        } else {
                            v.clone()
                        }
                    }
                    [] => V::Nil,
                })
            }
            "coalesce" => {
                for a in &args {
                    if a.unknown().is_some() {
                        return Ok(a.clone());
                    }
                    if !empty(a) {
                        return Ok(a.clone());
                    }
                }
                return Ok(V::Nil);
            }
            "ternary" => {
                if let [a, b, c] = args.as_slice() {
                    if c.unknown().is_some() {
                        return Ok(c.clone());
                    }
                    return Ok(if c.truthy() { a.clone() } else { b.clone() });
                }
            }
            "lookup" => return Ok(V::Map(Rc::new(BTreeMap::new()))),
            _ => {}
        }
        if let Some(u) = args.iter().find_map(V::unknown) {
            return Ok(V::Unknown(u));
        }
        let s = |i: usize| args.get(i).map(print_v).unwrap_or_default();
        let last_s = || args.last().map(print_v).unwrap_or_default();
        let num = |v: &V| -> f64 {
            match v {
                V::Int(i) => *i as f64,
                V::Float(f) => *f,
                V::Str(s) => s.trim().parse().unwrap_or(0.0),
                V::Bool(b) => f64::from(u8::from(*b)),
                _ => 0.0,
            }
        };
        let int = |v: &V| num(v) as i64;
        let v = match f {
            "include" => {
                let name = s(0);
                let dot = args.get(1).cloned().unwrap_or(V::Nil);
                let text = self.include(line, &name, dot)?;
                // An include whose text holds an unknown is unknown as a whole.
                if let Some(u) = first_marker(&text) {
                    V::Unknown(u)
                } else {
                    V::Str(text)
                }
            }
            "tpl" => {
                let text = s(0);
                let parsed =
                    parse(file, &text).map_err(|e| Self::fail(line, format!("tpl: {e}")))?;
                for (n, nodes) in parsed.defines.iter() {
                    self.defines
                        .insert(n.clone(), (file.to_string(), nodes.clone()));
                }
                let data = args.get(1).cloned().unwrap_or(V::Nil);
                let scope = Scope {
                    dot: data.clone(),
                    vars: vec![("$".into(), data)],
                };
                let out = self.sub(file, &parsed.nodes, &scope)?;
                match first_marker(&out) {
                    Some(u) => V::Unknown(u),
                    None => V::Str(out),
                }
            }
            "required" => {
                let v = args.get(1).cloned().unwrap_or(V::Nil);
                if matches!(&v, V::Nil) || matches!(&v, V::Str(x) if x.is_empty()) {
                    return Err(Self::fail(line, s(0)));
                }
                v
            }
            "fail" => return Err(Self::fail(line, s(0))),
            "quote" => V::Str(
                args.iter()
                    .map(|a| go_quote(&print_v(a)))
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            "squote" => V::Str(
                args.iter()
                    .map(|a| format!("'{}'", print_v(a)))
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            "print" => V::Str(go_print(&args)),
            "println" => V::Str(format!(
                "{}\n",
                args.iter().map(print_v).collect::<Vec<_>>().join(" ")
            )),
            "printf" => V::Str(printf(&s(0), &args[1.min(args.len())..])),
            "cat" => V::Str(
                args.iter()
                    .filter(|a| !matches!(a, V::Nil))
                    .map(print_v)
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            "toString" => V::Str(s(0)),
            "trim" => V::Str(s(0).trim().to_string()),
            "trimAll" => V::Str(s(1).trim_matches(|c| s(0).contains(c)).to_string()),
            "trimPrefix" => V::Str(
                s(1).strip_prefix(&s(0))
                    .map(str::to_string)
                    .unwrap_or_else(|| s(1)),
            ),
            "trimSuffix" => V::Str(
                s(1).strip_suffix(&s(0))
                    .map(str::to_string)
                    .unwrap_or_else(|| s(1)),
            ),
            "lower" => V::Str(s(0).to_lowercase()),
            "upper" => V::Str(s(0).to_uppercase()),
            "replace" => V::Str(s(2).replace(&s(0), &s(1))),
            "trunc" => {
                let n = int(args.first().unwrap_or(&V::Nil));
                let t = s(1);
                let chars: Vec<char> = t.chars().collect();
                let n = if n < 0 {
                    (chars.len() as i64 + n).max(0) as usize
                } else {
                    (n as usize).min(chars.len())
                };
                V::Str(chars[..n].iter().collect())
            }
            "contains" => V::Bool(s(1).contains(&s(0))),
            "hasPrefix" => V::Bool(s(1).starts_with(&s(0))),
            "hasSuffix" => V::Bool(s(1).ends_with(&s(0))),
            "nindent" | "indent" => {
                let pad = " ".repeat(int(args.first().unwrap_or(&V::Nil)).max(0) as usize);
                let body = format!("{pad}{}", last_s().replace('\n', &format!("\n{pad}")));
                V::Str(if f == "nindent" {
                    format!("\n{body}")
                } else {
                    body
                })
            }
            "toYaml" => match args.first().and_then(V::to_yaml) {
                Some(Value::Null) => V::Str("null".into()),
                Some(y) => V::Str(
                    serde_yaml_ng::to_string(&y)
                        .map(|t| t.trim_end_matches('\n').to_string())
                        .unwrap_or_default(),
                ),
                None => V::Str(String::new()),
            },
            "toJson" | "toRawJson" | "toPrettyJson" => {
                let y = args.first().and_then(V::to_yaml).unwrap_or(Value::Null);
                V::Str(serde_json::to_string(&super::yaml_to_json(&y)).unwrap_or_default())
            }
            "b64enc" => {
                use base64::Engine as _;
                V::Str(base64::engine::general_purpose::STANDARD.encode(s(0)))
            }
            "dict" => {
                let mut m = BTreeMap::new();
                for pair in args.chunks(2) {
                    m.insert(print_v(&pair[0]), pair.get(1).cloned().unwrap_or(V::Nil));
                }
                V::Map(Rc::new(m))
            }
            "list" | "tuple" => V::List(Rc::new(args.clone())),
            "get" => match args.first() {
                Some(V::Map(m)) => m.get(&s(1)).cloned().unwrap_or(V::Str(String::new())),
                _ => V::Str(String::new()),
            },
            "hasKey" => V::Bool(matches!(args.first(), Some(V::Map(m)) if m.contains_key(&s(1)))),
            "index" => {
                let mut v = args.first().cloned().unwrap_or(V::Nil);
                for k in &args[1.min(args.len())..] {
                    v = match (&v, k) {
                        (V::Map(m), k) => m.get(&print_v(k)).cloned().unwrap_or(V::Nil),
                        (V::List(l), k) => l
                            .get(int(k) as usize)
                            .cloned()
                            .ok_or_else(|| Self::fail(line, "index out of range"))?,
                        (V::Nil, _) => V::Nil,
                        _ => return Err(Self::fail(line, "can't index item")),
                    };
                }
                v
            }
            "empty" => V::Bool(empty(args.first().unwrap_or(&V::Nil))),
            "not" => V::Bool(!args.first().is_some_and(V::truthy)),
            "eq" => {
                let a = args.first().cloned().unwrap_or(V::Nil);
                V::Bool(args[1.min(args.len())..].iter().any(|b| same(&a, b)))
            }
            "ne" => V::Bool(!same(
                args.first().unwrap_or(&V::Nil),
                args.get(1).unwrap_or(&V::Nil),
            )),
            "lt" | "le" | "gt" | "ge" => {
                let (a, b) = (
                    args.first().unwrap_or(&V::Nil),
                    args.get(1).unwrap_or(&V::Nil),
                );
                let ord = match (a, b) {
                    (V::Str(x), V::Str(y)) => x.partial_cmp(y),
                    _ => num(a).partial_cmp(&num(b)),
                };
                let ord = ord.unwrap_or(std::cmp::Ordering::Equal);
                V::Bool(match f {
                    "lt" => ord.is_lt(),
                    "le" => ord.is_le(),
                    "gt" => ord.is_gt(),
                    _ => ord.is_ge(),
                })
            }
            "len" => V::Int(match args.first() {
                Some(V::Str(s)) => s.len() as i64,
                Some(V::List(l)) => l.len() as i64,
                Some(V::Map(m)) => m.len() as i64,
                _ => 0,
            }),
            "join" => V::Str(match args.get(1) {
                Some(V::List(l)) => l.iter().map(print_v).collect::<Vec<_>>().join(&s(0)),
                other => other.map(print_v).unwrap_or_default(),
            }),
            "splitList" => V::List(Rc::new(
                s(1).split(&s(0)).map(|x| V::Str(x.to_string())).collect(),
            )),
            "first" => match args.first() {
                Some(V::List(l)) => l.first().cloned().unwrap_or(V::Nil),
                _ => V::Nil,
            },
            "last" => match args.first() {
                Some(V::List(l)) => l.last().cloned().unwrap_or(V::Nil),
                _ => V::Nil,
            },
            "has" => V::Bool(
                matches!(args.get(1), Some(V::List(l)) if l.iter().any(|x| same(x, &args[0]))),
            ),
            "int" | "int64" | "atoi" => V::Int(int(args.first().unwrap_or(&V::Nil))),
            "float64" => V::Float(num(args.first().unwrap_or(&V::Nil))),
            "add" => V::Int(args.iter().map(int).sum()),
            "add1" => V::Int(int(args.first().unwrap_or(&V::Nil)) + 1),
            "sub" => {
                V::Int(int(args.first().unwrap_or(&V::Nil)) - int(args.get(1).unwrap_or(&V::Nil)))
            }
            "mul" => V::Int(args.iter().map(int).product()),
            "kindIs" => V::Bool(kind_of(args.get(1).unwrap_or(&V::Nil)) == s(0)),
            "kindOf" | "typeOf" => V::Str(kind_of(args.first().unwrap_or(&V::Nil)).into()),
            "semverCompare" => {
                let (c, v) = (s(0), s(1));
                match (crate::chart::VersionSpec::parse(&c), semver_lenient(&v)) {
                    (Ok(crate::chart::VersionSpec::Range(r)), Some(ver)) => {
                        V::Bool(r.matches(&ver))
                    }
                    (Ok(crate::chart::VersionSpec::Exact(e)), Some(ver)) => V::Bool(e == ver),
                    _ => {
                        let reason = format!("semverCompare {c:?} {v:?}");
                        return Ok(self.unknown(file, line, &p.text, reason, false));
                    }
                }
            }
            "deepCopy" => args.first().cloned().unwrap_or(V::Nil),
            "merge" | "mergeOverwrite" => {
                let mut base = match args.first() {
                    Some(V::Map(m)) => (**m).clone(),
                    _ => BTreeMap::new(),
                };
                for a in &args[1.min(args.len())..] {
                    if let V::Map(m) = a {
                        for (k, v) in m.iter() {
                            if f == "mergeOverwrite" || !base.contains_key(k) {
                                base.insert(k.clone(), v.clone());
                            }
                        }
                    }
                }
                V::Map(Rc::new(base))
            }
            other => {
                let reason = format!("the function `{other}`");
                return Ok(self.unknown(file, line, &p.text, reason, false));
            }
        };
        Ok(v)
    }
}

fn semver_lenient(v: &str) -> Option<semver::Version> {
    let v = v.trim().trim_start_matches('v');
    semver::Version::parse(v).ok()
}

fn kind_of(v: &V) -> &'static str {
    match v {
        V::Nil => "invalid",
        V::Bool(_) => "bool",
        V::Int(_) => "int",
        V::Float(_) => "float64",
        V::Str(_) => "string",
        V::List(_) => "slice",
        V::Map(_) => "map",
        V::Unknown(_) => "unknown",
    }
}

fn type_name(v: &V) -> &'static str {
    match v {
        V::Str(_) => "string",
        V::Bool(_) => "bool",
        V::Int(_) => "int",
        V::Float(_) => "float64",
        V::List(_) => "[]interface {}",
        _ => "interface {}",
    }
}

/// Sprig's `empty`.
fn empty(v: &V) -> bool {
    !v.truthy()
}

fn same(a: &V, b: &V) -> bool {
    match (a, b) {
        (V::Int(_) | V::Float(_), V::Int(_) | V::Float(_)) => {
            let f = |v: &V| match v {
                V::Int(i) => *i as f64,
                V::Float(f) => *f,
                _ => 0.0,
            };
            f(a) == f(b)
        }
        _ => a == b,
    }
}

/// The first unknown marker in `text`.
pub(crate) fn first_marker(text: &str) -> Option<usize> {
    let start = text.find(OPEN)?;
    let rest = &text[start + OPEN.len_utf8()..];
    let end = rest.find(CLOSE)?;
    rest[..end].parse().ok()
}

/// Go's `%q` of a string.
fn go_quote(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\t' => o.push_str("\\t"),
            '\r' => o.push_str("\\r"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\x{:02x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// Go's `fmt.Sprint`: spaces between operands when neither is a string.
fn go_print(args: &[V]) -> String {
    let mut o = String::new();
    for (i, a) in args.iter().enumerate() {
        if i > 0 && !matches!(a, V::Str(_)) && !matches!(args[i - 1], V::Str(_)) {
            o.push(' ');
        }
        o.push_str(&print_v(a));
    }
    o
}

/// Go's `fmt.Sprintf` for the verbs charts use: `%s %v %d %q %t %f %%`.
fn printf(fmt: &str, args: &[V]) -> String {
    let mut o = String::new();
    let mut it = args.iter();
    let mut chars = fmt.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            o.push(c);
            continue;
        }
        // Flags and width are read and ignored.
        let mut verb = None;
        for n in chars.by_ref() {
            if n.is_ascii_alphabetic() || n == '%' {
                verb = Some(n);
                break;
            }
        }
        match verb {
            Some('%') => o.push('%'),
            Some(v) => match it.next() {
                None => {
                    let _ = write!(o, "%!{v}(MISSING)");
                }
                Some(a) => match v {
                    'q' => o.push_str(&go_quote(&print_v(a))),
                    'd' => o.push_str(&match a {
                        V::Float(f) => format!("%!d(float64={})", go_float(*f)),
                        other => print_v(other),
                    }),
                    'f' => {
                        let f = match a {
                            V::Int(i) => *i as f64,
                            V::Float(f) => *f,
                            _ => 0.0,
                        };
                        let _ = write!(o, "{f:.6}");
                    }
                    _ => o.push_str(&print_v(a)),
                },
            },
            None => o.push_str("%!(NOVERB)"),
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(values: &str, templates: &[(&str, &str)]) -> Result<String, ChartError> {
        use crate::chart::archive::tests::{chart_of, TEST_CHART_YAML};
        let mut files = vec![("Chart.yaml", TEST_CHART_YAML), ("values.yaml", values)];
        files.extend_from_slice(templates);
        let chart = chart_of(&files);
        let (mut e, parsed) = Engine::new(&chart, chart.values(), "rel", "ns")?;
        let (file, p) = parsed
            .iter()
            .find(|(f, _)| f == "templates/x.yaml")
            .expect("x");
        Ok(e.render(file, p)?.text)
    }

    #[test]
    fn hostile_templates_end() {
        // Exponential includes, a huge range: refused, not run.
        let bomb = "{{ define \"a\" }}{{ include \"a\" . }}{{ include \"a\" . }}{{ end }}{{ include \"a\" . }}";
        let err = render("{}", &[("templates/x.yaml", bomb)]).expect_err("bomb");
        assert!(
            err.to_string().contains("nested more than 30") || err.to_string().contains("steps"),
            "{err}"
        );
        let err = render(
            "{}",
            &[("templates/x.yaml", "{{ range 1000000000 }}x{{ end }}")],
        )
        .expect_err("range");
        assert!(err.to_string().contains("more steps than allowed"), "{err}");
        let err = render(
            "{}",
            &[("templates/x.yaml", "{{ define \"b\" }}{{ include \"b\" . }}{{ include \"b\" . }}{{ end }}{{ range 30 }}{{ include \"b\" . }}{{ end }}")],
        )
        .expect_err("fan-out");
        assert!(err.to_string().contains("templates/x.yaml"), "{err}");
    }

    #[test]
    fn renders_like_helm() {
        let out = render(
            "a: {b: [1, 2], s: x}\nbig: 1000000\n",
            &[("templates/x.yaml", "{{- $x := .Values.a -}}\n{{ range $i, $v := $x.b }}{{ $i }}={{ $v }},{{ end }} {{ .Values.big }} {{ .Release.Name }}/{{ .Chart.Name }} {{ $x.s | upper | quote }} {{ toYaml .Values.a | nindent 2 }}{{ with .Values.missing }}no{{ else }}else{{ end }}")],
        )
        .expect("render");
        assert_eq!(
            out,
            "0=1,1=2, 1e+06 rel/c \"X\" \n  b:\n  - 1\n  - 2\n  s: xelse"
        );
    }

    /// The expected text is what helm 3.17.3 renders from the same chart (`y` and `n` are YAML
    /// 1.1 booleans to helm: `b.y` is the key "true", `.Values.n` does not exist).
    #[test]
    fn control_structures_like_helm() {
        let t = r#"{{- define "d" -}}d:{{ . }}{{- end -}}
r1: {{ with .Values.a.x }}A{{ else with .Values.b.y }}{{ . }}{{ else }}none{{ end }}
r2: {{ template "d" "t" }}
r3: {{ block "blk" . }}{{ .Chart.Name }}{{ end }}
r4: {{ tpl .Values.t . }}
r5: {{ if eq .Values.n 3.0 }}three{{ end }} {{ ternary "yes" "no" (gt (len .Values.b) 0) }}
r6: {{ coalesce .Values.a.x "" "c" }} {{ .Values.b | toJson }} {{ printf "%q" "q" }}
r7: {{ $v := "" }}{{ range $k, $x := .Values.b }}{{ $v = $k }}{{ end }}{{ $v }}
"#;
        let out = render(
            "a: {x: \"\"}\nb: {y: \"why\"}\nt: \"{{ .Values.b.y }}-tpl\"\nn: 3\n",
            &[("templates/x.yaml", t)],
        )
        .expect("render");
        assert_eq!(
            out,
            "r1: none\nr2: d:t\nr3: c\nr4: -tpl\nr5:  yes\nr6: c {\"true\":\"why\"} \"q\"\nr7: true\n"
        );
    }

    #[test]
    fn go_formatting() {
        assert_eq!(go_float(1.0), "1");
        assert_eq!(go_float(1.5), "1.5");
        assert_eq!(go_float(100000.0), "100000");
        assert_eq!(
            printf(
                "%s/%s:%v",
                &[V::Str("a".into()), V::Str("b".into()), V::Float(1.0)]
            ),
            "a/b:1"
        );
        assert_eq!(go_quote("a\"b"), "\"a\\\"b\"");
        assert_eq!(printf("%d%%", &[V::Int(5)]), "5%");
    }
}
