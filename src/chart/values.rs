//! Helm's value handling for `--values FILE` and `--set K=V`.
//!
//! Usage: start from the chart's values and apply overrides in Helm's order (all files, then
//! all `--set`s):
//!
//! ```ignore
//! let mut v = chart.values().clone();
//! merge_values(&mut v, &file_values);
//! apply_set(&mut v, "manager.image.tag=v9,imageRepositoryHost=ghcr.io")?;
//! ```
//!
//! Differences from Helm, which builds a separate "user values" map and coalesces it with the
//! chart's values at the end:
//! * `--set a[1]=x` changes element 1 of the list already in the values; Helm's user list
//!   (`[null, x]`) would replace the chart's list wholesale.
//! * `--set a={}` gives an empty list (Helm gives `[""]`).
//! * A `null` (from a file or `--set a=null`) deletes the key, whether or not the chart has it
//!   (Helm leaves a null where the chart had nothing; both render the same).

use serde_yaml_ng::{Mapping, Value};

use super::ChartError;

/// Remove `null` values from mappings, recursively (not from lists).
fn without_nulls(v: &Value) -> Value {
    match v {
        Value::Mapping(m) => Value::Mapping(
            m.iter()
                .filter(|(_, val)| !val.is_null())
                .map(|(k, val)| (k.clone(), without_nulls(val)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Deep-merge `overlay` into `base` like Helm merges `--values` files into the chart's values:
/// mappings merge key by key, recursively; anything else in `overlay` (scalars, lists, a
/// mapping replacing a scalar or the reverse) replaces what `base` has; a `null` in `overlay`
/// deletes the key from `base`. An overlay that is not a mapping (an empty file is `null`)
/// changes nothing.
pub fn merge_values(base: &mut Value, overlay: &Value) {
    let Value::Mapping(over) = overlay else {
        return;
    };
    let Value::Mapping(dst) = base else {
        *base = without_nulls(overlay);
        return;
    };
    merge_maps(dst, over);
}

fn merge_maps(dst: &mut Mapping, over: &Mapping) {
    for (k, v) in over {
        if v.is_null() {
            dst.shift_remove(k);
            continue;
        }
        match (dst.get_mut(k), v) {
            (Some(Value::Mapping(d)), Value::Mapping(o)) => merge_maps(d, o),
            _ => {
                dst.insert(k.clone(), without_nulls(v));
            }
        }
    }
}

/// Helm's type inference for `--set` values: `true`/`false` (any case) -> bool, `null` (any
/// case) -> null, `0` and integers without leading zero that fit an i64 -> int, anything else
/// (including `1.5`, `007`, `""`) -> string.
fn typed(s: &str) -> Value {
    if s.eq_ignore_ascii_case("true") {
        return Value::Bool(true);
    }
    if s.eq_ignore_ascii_case("false") {
        return Value::Bool(false);
    }
    if s.eq_ignore_ascii_case("null") {
        return Value::Null;
    }
    if s == "0" {
        return Value::Number(0.into());
    }
    if !s.is_empty() && !s.starts_with('0') {
        if let Ok(i) = s.parse::<i64>() {
            return Value::Number(i.into());
        }
    }
    Value::String(s.to_string())
}

/// Largest list index `--set` accepts (as Helm).
const MAX_INDEX: usize = 65536;

struct Parser<'a> {
    chars: Vec<char>,
    pos: usize,
    expr: &'a str,
}

enum Stop {
    Char(char),
    Eof,
}

impl Parser<'_> {
    fn err(&self, reason: impl Into<String>) -> ChartError {
        ChartError::InvalidSet {
            expr: self.expr.to_string(),
            reason: reason.into(),
        }
    }

    /// Read until one of `stops` (consumed) or the end; `\x` escapes any character.
    fn until(&mut self, stops: &[char]) -> (String, Stop) {
        let mut out = String::new();
        while let Some(&c) = self.chars.get(self.pos) {
            self.pos += 1;
            if c == '\\' {
                match self.chars.get(self.pos) {
                    Some(&n) => {
                        out.push(n);
                        self.pos += 1;
                    }
                    None => out.push('\\'),
                }
            } else if stops.contains(&c) {
                return (out, Stop::Char(c));
            } else {
                out.push(c);
            }
        }
        (out, Stop::Eof)
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    /// The value after `=`: a `{a,b}` list or a scalar up to the next `,`.
    fn value(&mut self) -> Result<Value, ChartError> {
        if self.peek() == Some('{') {
            self.pos += 1;
            let mut items = Vec::new();
            loop {
                let (raw, stop) = self.until(&[',', '}']);
                match stop {
                    Stop::Eof => return Err(self.err("list must terminate with '}'")),
                    Stop::Char(',') => items.push(typed(&raw)),
                    Stop::Char(_) => {
                        if !(raw.is_empty() && items.is_empty()) {
                            items.push(typed(&raw));
                        }
                        break;
                    }
                }
            }
            match self.peek() {
                None => {}
                Some(',') => self.pos += 1,
                Some(c) => return Err(self.err(format!("unexpected {c:?} after a list"))),
            }
            return Ok(Value::Sequence(items));
        }
        let (raw, _) = self.until(&[',']);
        Ok(typed(&raw))
    }

    fn index(&mut self) -> Result<usize, ChartError> {
        let (raw, stop) = self.until(&[']']);
        if matches!(stop, Stop::Eof) {
            return Err(self.err("unterminated `[`"));
        }
        let i: usize = raw
            .trim()
            .parse()
            .map_err(|_| self.err(format!("invalid list index {raw:?}")))?;
        if i > MAX_INDEX {
            return Err(self.err(format!("list index {i} is larger than {MAX_INDEX}")));
        }
        Ok(i)
    }

    /// Make `v` a mapping (replacing anything else, as Helm's precedence does) and parse a key
    /// into it.
    fn descend(&mut self, v: &mut Value) -> Result<(), ChartError> {
        if !v.is_mapping() {
            *v = Value::Mapping(Mapping::new());
        }
        match v {
            Value::Mapping(m) => self.key(m),
            _ => Err(self.err("internal error: expected a mapping")),
        }
    }

    /// Parse one `key...=value` into `map`.
    fn key(&mut self, map: &mut Mapping) -> Result<(), ChartError> {
        let (k, stop) = self.until(&['=', '[', ',', '.']);
        if k.is_empty() {
            return Err(self.err("empty key"));
        }
        match stop {
            Stop::Eof => Err(self.err(format!("key {k:?} has no value"))),
            Stop::Char(',') => Err(self.err(format!("key {k:?} has no value (cannot end with ,)"))),
            Stop::Char('=') => {
                let v = self.value()?;
                set_key(map, &k, v);
                Ok(())
            }
            Stop::Char('.') => {
                let child = map.entry(Value::String(k)).or_insert(Value::Null);
                self.descend(child)
            }
            Stop::Char(_) => {
                // '['
                let i = self.index()?;
                let child = map.entry(Value::String(k)).or_insert(Value::Null);
                self.list_item(child, i)
            }
        }
    }

    /// After `name[i]`: `=value`, `.key...` or `[j]...`.
    fn list_item(&mut self, target: &mut Value, i: usize) -> Result<(), ChartError> {
        if !target.is_sequence() {
            *target = Value::Sequence(Vec::new());
        }
        let Value::Sequence(list) = target else {
            return Err(self.err("internal: not a list"));
        };
        if list.len() <= i {
            list.resize(i + 1, Value::Null);
        }
        let (junk, stop) = self.until(&['[', '.', '=']);
        if !junk.is_empty() {
            return Err(self.err(format!("unexpected data at end of array index: {junk:?}")));
        }
        match stop {
            Stop::Eof => Err(self.err(format!("list item [{i}] has no value"))),
            Stop::Char('=') => {
                list[i] = self.value()?;
                Ok(())
            }
            Stop::Char('.') => self.descend(&mut list[i]),
            Stop::Char(_) => {
                let j = self.index()?;
                self.list_item(&mut list[i], j)
            }
        }
    }
}

fn set_key(map: &mut Mapping, k: &str, v: Value) {
    if v.is_null() {
        map.shift_remove(k);
    } else {
        map.insert(Value::String(k.to_string()), v);
    }
}

/// Apply one `--set` argument with Helm's syntax: `a.b=c`, several separated by commas
/// (`a=1,b=2`), lists `a={x,y}`, indexes `a[0]=x` / `a[0].b=x` / `a[0][1]=x`, backslash
/// escapes (`a\.b=c` for a key with a dot, `a=x\,y` for a comma in a value) and Helm's type
/// inference: `true`/`false` (any case) -> bool, `null` (any case) -> deletes the key, `0` and
/// integers without a leading zero that fit an i64 -> int, anything else (`1.5`, `007`, an
/// empty value) -> string. A scalar in the way of a nested key is replaced by a mapping, as
/// Helm's precedence does. On error the values are left unchanged.
pub fn apply_set(values: &mut Value, expr: &str) -> Result<(), ChartError> {
    let mut p = Parser {
        chars: expr.chars().collect(),
        pos: 0,
        expr,
    };
    if expr.trim().is_empty() {
        return Err(p.err("empty expression"));
    }
    // Helm refuses names nested deeper than 30 levels (strvals' MaxNestedNameLevel); so do we,
    // before the recursive parser runs (fuzzing found a stack overflow at 10 000 levels, and an
    // out-of-memory with 40 levels of `[65536]`).
    let (mut depth, mut in_key, mut escaped) = (0usize, true, false);
    for c in expr.chars() {
        match (escaped, c) {
            (true, _) => escaped = false,
            (false, '\\') => escaped = true,
            (false, '=') => in_key = false,
            (false, ',') => {
                in_key = true;
                depth = 0;
            }
            (false, '.' | '[') if in_key => {
                depth += 1;
                if depth > 30 {
                    return Err(p.err("keys nested deeper than 30 levels (helm's own limit)"));
                }
            }
            _ => {}
        }
    }
    // Work on a copy so that a failing expression leaves the values untouched.
    let mut work = values.clone();
    while p.pos < p.chars.len() {
        p.descend(&mut work)?;
    }
    *values = work;
    Ok(())
}

/// The values koord-bundle sets for the Koordinator chart:
///
/// * `imageRepositoryHost` (the chart prefixes every image with it),
/// * `featureGates` when given,
/// * `crds.<key>: false` for each CRD switched off (values keys such as `reservations`),
/// * `manager.hostNetwork: true` when asked (only then: `false` is the chart's default, and
///   leaving it out keeps a value reused with `--reuse-values`),
/// * `imagePullSecrets` as a list of `{name: …}` when any.
pub fn generated_values(
    image_repository_host: &str,
    feature_gates: Option<&str>,
    crds_off: &[String],
    host_network: bool,
    image_pull_secrets: &[String],
) -> Value {
    let mut root = Mapping::new();
    root.insert("imageRepositoryHost".into(), image_repository_host.into());
    if let Some(fg) = feature_gates {
        root.insert("featureGates".into(), fg.into());
    }
    if !crds_off.is_empty() {
        let mut crds = Mapping::new();
        for k in crds_off {
            crds.insert(k.as_str().into(), Value::Bool(false));
        }
        root.insert("crds".into(), Value::Mapping(crds));
    }
    if host_network {
        let mut manager = Mapping::new();
        manager.insert("hostNetwork".into(), Value::Bool(true));
        root.insert("manager".into(), Value::Mapping(manager));
    }
    if !image_pull_secrets.is_empty() {
        let list = image_pull_secrets
            .iter()
            .map(|s| {
                let mut m = Mapping::new();
                m.insert("name".into(), s.as_str().into());
                Value::Mapping(m)
            })
            .collect();
        root.insert("imagePullSecrets".into(), Value::Sequence(list));
    }
    Value::Mapping(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn y(s: &str) -> Value {
        crate::yaml::parse_value("test", s.as_bytes(), &crate::yaml::VALUES).expect("yaml")
    }

    fn set(base: &str, expr: &str) -> Value {
        let mut v = y(base);
        apply_set(&mut v, expr).expect(expr);
        v
    }

    #[test]
    fn merge_like_helm() {
        let mut base = y("a: {b: 1, c: [1, 2], d: {e: x}}\nf: keep\ng: {h: 1}\nk: scalar\n");
        let overlay =
            y("a: {b: 2, c: [3], d: null, n: {x: null, y: 1}}\ng: null\nk: {m: 1}\nnew: v\n");
        merge_values(&mut base, &overlay);
        assert_eq!(
            base,
            y("a: {b: 2, c: [3], n: {y: 1}}\nf: keep\nk: {m: 1}\nnew: v\n")
        );
        let before = base.clone();
        merge_values(&mut base, &Value::Null);
        assert_eq!(base, before);
        let mut empty = Value::Null;
        merge_values(&mut empty, &y("a: {b: null, c: 1}"));
        assert_eq!(empty, y("a: {c: 1}"));
    }

    #[test]
    fn set_syntax() {
        assert_eq!(set("{}", "a.b=c"), y("a: {b: c}"));
        assert_eq!(set("{}", "a=1,b=2"), y("a: 1\nb: 2"));
        assert_eq!(set("{}", "a={x,y}"), y("a: [x, y]"));
        assert_eq!(
            set("{}", "a={x, 1,true},b=2"),
            y("a: [x, ' 1', true]\nb: 2")
        );
        assert_eq!(set("{}", "a={}"), y("a: []"));
        assert_eq!(set("{}", "a[0]=x"), y("a: [x]"));
        assert_eq!(set("{}", "a[2]=x"), y("a: [null, null, x]"));
        assert_eq!(set("{a: [p, q]}", "a[1]=x"), y("a: [p, x]"));
        assert_eq!(set("{}", "a[0].b=x,a[0].c=y"), y("a: [{b: x, c: y}]"));
        assert_eq!(set("{}", "a[0][1]=x"), y("a: [[null, x]]"));
        assert_eq!(set("{}", r"a\.b=c"), y("a.b: c"));
        assert_eq!(set("{}", r"a=x\,y"), y("a: 'x,y'"));
        assert_eq!(set("{}", "a=b=c"), y("a: b=c"));
        assert_eq!(set("{}", "a="), y("a: ''"));
        // Types.
        assert_eq!(
            set("{}", "t=true,f=FALSE,i=42,n=-3,z=0,o=007,fl=1.5,s=v1.8.0,big=99999999999999999999"),
            y("t: true\nf: false\ni: 42\nn: -3\nz: 0\no: '007'\nfl: '1.5'\ns: v1.8.0\nbig: '99999999999999999999'")
        );
        // null deletes.
        assert_eq!(set("a: {b: 1, c: 2}", "a.b=null"), y("a: {c: 2}"));
        // A scalar in the way becomes a mapping.
        assert_eq!(set("a: 1", "a.b=2"), y("a: {b: 2}"));
        // Existing siblings are kept.
        assert_eq!(set("a: {b: 1, c: 2}", "a.b=3"), y("a: {b: 3, c: 2}"));
    }

    #[test]
    fn set_errors() {
        for bad in [
            "a",
            "a,b=1",
            "a={x,y",
            "a[x]=1",
            "a[0",
            "a[0]b=1",
            "a[0]",
            "a[99999999]=1",
            "",
            "a.=1",
            "[0]=1",
            "=x",
            "a.",
        ] {
            let mut v = y("{k: v}");
            let err = apply_set(&mut v, bad).expect_err(bad);
            assert!(err.to_string().contains("--set"), "{err}");
            assert_eq!(v, y("{k: v}"), "{bad}: values must be untouched");
        }
    }

    #[test]
    fn generated_values_shape() {
        let val = generated_values(
            "h:1/p",
            Some("X=true,Y=false"),
            &["reservations".into(), "devices".into()],
            true,
            &["regcred".into(), "other".into()],
        );
        let expected: Value = y(
            "imageRepositoryHost: h:1/p\nfeatureGates: X=true,Y=false\ncrds: {reservations: false, devices: false}\nmanager: {hostNetwork: true}\nimagePullSecrets: [{name: regcred}, {name: other}]\n",
        );
        assert_eq!(val, expected);
        let minimal = generated_values("h", None, &[], false, &[]);
        assert_eq!(minimal, y("imageRepositoryHost: h"));
    }
}
