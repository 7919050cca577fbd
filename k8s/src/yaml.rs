//! An ordered document tree and the YAML text of it, for the manifests `busbw k8s render`
//! prints and k8s/ commits. A small emitter instead of a YAML library: the manifests need
//! block maps and lists, quoted scalars, literal blocks for scripts and comments (the
//! commented-out options), and nothing else; serde_json (already a dependency) gives the
//! same tree as JSON for tests. A serde YAML serializer would lose the comments, which are
//! half of what the committed manifests tell a reader, and the maintained ones are parsers
//! first. What the emitter must guarantee (the text reads back as the tree) is checked by
//! reading it back with serde-saphyr over random and YAML-hostile scalars (below) and by
//! PyYAML with the upstream CRD schemas (bench/tests/k8s.rs).

use serde_json::Value;

/// A node of a manifest. Map keys keep their order; `Comment` entries (in maps, under any
/// key, and in lists) become `#` lines in YAML and vanish from JSON.
#[derive(Clone, Debug, PartialEq)]
pub enum Y {
    Map(Vec<(String, Y)>),
    List(Vec<Y>),
    Str(String),
    Int(i64),
    Bool(bool),
    Comment(String),
}

/// A map from `(key, value)` pairs.
pub fn map<K: Into<String>>(entries: Vec<(K, Y)>) -> Y {
    Y::Map(entries.into_iter().map(|(k, v)| (k.into(), v)).collect())
}

pub fn s(v: impl Into<String>) -> Y {
    Y::Str(v.into())
}

pub fn int(v: impl TryInto<i64>) -> Y {
    Y::Int(v.try_into().unwrap_or(i64::MAX))
}

pub fn list(items: Vec<Y>) -> Y {
    Y::List(items)
}

pub fn strs<S: AsRef<str>>(items: &[S]) -> Y {
    Y::List(items.iter().map(|i| s(i.as_ref())).collect())
}

/// A comment line (or lines) inside a map or list.
pub fn comment(text: impl Into<String>) -> (&'static str, Y) {
    ("", Y::Comment(text.into()))
}

impl Y {
    /// Append an entry to a map (no-op on other nodes).
    pub fn push(&mut self, key: impl Into<String>, v: Y) {
        if let Y::Map(m) = self {
            m.push((key.into(), v));
        }
    }

    /// Append a comment line (or lines) to a map.
    pub fn note(&mut self, text: impl Into<String>) {
        if let Y::Map(m) = self {
            m.push((String::new(), Y::Comment(text.into())));
        }
    }

    /// The same tree as JSON, comments dropped.
    pub fn to_json(&self) -> Value {
        match self {
            Y::Map(m) => Value::Object(
                m.iter()
                    .filter(|(_, v)| !matches!(v, Y::Comment(_)))
                    .map(|(k, v)| (k.clone(), v.to_json()))
                    .collect(),
            ),
            Y::List(l) => Value::Array(
                l.iter()
                    .filter(|v| !matches!(v, Y::Comment(_)))
                    .map(Y::to_json)
                    .collect(),
            ),
            Y::Str(v) => Value::String(v.clone()),
            Y::Int(v) => Value::from(*v),
            Y::Bool(v) => Value::Bool(*v),
            Y::Comment(_) => Value::Null,
        }
    }

    /// YAML text of one document (no `---`), ending with a newline.
    pub fn to_yaml(&self) -> String {
        let mut out = Vec::new();
        match self {
            Y::Map(_) | Y::List(_) => block(self, 0, &mut out),
            v => out.push(scalar(v, 0).join("\n")),
        }
        let mut text = out.join("\n");
        text.push('\n');
        text
    }
}

fn pad(n: usize) -> String {
    " ".repeat(n)
}

fn comment_lines(text: &str, indent: usize, out: &mut Vec<String>) {
    for l in text.lines() {
        if l.is_empty() {
            out.push(format!("{}#", pad(indent)));
        } else {
            out.push(format!("{}# {l}", pad(indent)));
        }
    }
}

fn is_empty_collection(v: &Y) -> bool {
    match v {
        Y::Map(m) => m.iter().all(|(_, v)| matches!(v, Y::Comment(_))),
        Y::List(l) => l.iter().all(|v| matches!(v, Y::Comment(_))),
        _ => false,
    }
}

/// A non-empty map or list at `indent`, one line per entry.
fn block(v: &Y, indent: usize, out: &mut Vec<String>) {
    match v {
        Y::Map(m) => {
            for (k, v) in m {
                let key = key_text(k);
                match v {
                    Y::Comment(c) => comment_lines(c, indent, out),
                    Y::Map(_) if is_empty_collection(v) => {
                        out.push(format!("{}{key}: {{}}", pad(indent)))
                    }
                    Y::List(_) if is_empty_collection(v) => {
                        out.push(format!("{}{key}: []", pad(indent)))
                    }
                    Y::Map(_) | Y::List(_) => {
                        out.push(format!("{}{key}:", pad(indent)));
                        block(v, indent + 2, out);
                    }
                    _ => {
                        let lines = scalar(v, indent + 2);
                        out.push(format!("{}{key}: {}", pad(indent), lines[0]));
                        out.extend(lines[1..].iter().cloned());
                    }
                }
            }
        }
        Y::List(l) => {
            for item in l {
                match item {
                    Y::Comment(c) => comment_lines(c, indent, out),
                    Y::Map(_) if is_empty_collection(item) => {
                        out.push(format!("{}- {{}}", pad(indent)))
                    }
                    Y::List(_) if is_empty_collection(item) => {
                        out.push(format!("{}- []", pad(indent)))
                    }
                    Y::Map(_) | Y::List(_) => {
                        let mut inner = Vec::new();
                        block(item, indent + 2, &mut inner);
                        // The first line of the item goes after the dash.
                        if let Some(first) = inner.first_mut() {
                            *first = format!("{}- {}", pad(indent), &first[indent + 2..]);
                        }
                        out.extend(inner);
                    }
                    _ => {
                        let lines = scalar(item, indent + 2);
                        out.push(format!("{}- {}", pad(indent), lines[0]));
                        out.extend(lines[1..].iter().cloned());
                    }
                }
            }
        }
        _ => {}
    }
}

fn key_text(k: &str) -> String {
    if plain_ok(k) {
        k.to_string()
    } else {
        quote(k)
    }
}

/// A scalar's lines: the first goes after `key: ` or `- `, the rest (a literal block's
/// body) are indented by `body_indent`.
fn scalar(v: &Y, body_indent: usize) -> Vec<String> {
    match v {
        Y::Int(i) => vec![i.to_string()],
        Y::Bool(b) => vec![b.to_string()],
        Y::Str(t) if t.contains('\n') && literal_ok(t) => {
            let indicator = if t.ends_with('\n') { "|" } else { "|-" };
            let mut lines = vec![indicator.to_string()];
            for l in t.trim_end_matches('\n').split('\n') {
                lines.push(if l.is_empty() {
                    String::new()
                } else {
                    format!("{}{l}", pad(body_indent))
                });
            }
            lines
        }
        Y::Str(t) if plain_ok(t) => vec![t.clone()],
        Y::Str(t) => vec![quote(t)],
        Y::Map(_) | Y::List(_) | Y::Comment(_) => vec!["null".into()],
    }
}

/// JSON's string syntax is valid YAML double-quoted syntax.
fn quote(t: &str) -> String {
    serde_json::to_string(t).unwrap_or_else(|_| "\"\"".into())
}

/// A literal block keeps every character except trailing blanks on a line and a first line
/// starting with a blank (which would need an indentation indicator); tabs are quoted.
fn literal_ok(t: &str) -> bool {
    !t.starts_with([' ', '\n'])
        && !t.contains('\t')
        && !t.contains('\r')
        && t.split('\n').all(|l| !l.ends_with(' '))
        && !t.ends_with("\n\n")
}

/// Strings that read back as the same string when written bare. Conservative: anything
/// that could be a number, a boolean, null, or YAML syntax is quoted.
fn plain_ok(t: &str) -> bool {
    let Some(first) = t.chars().next() else {
        return false;
    };
    if !(first.is_ascii_alphabetic() || first == '/' || first == '_') {
        return false;
    }
    const WORDS: [&str; 11] = [
        "true", "false", "yes", "no", "on", "off", "null", "y", "n", "~", "nan",
    ];
    if WORDS.contains(&t.to_ascii_lowercase().as_str()) {
        return false;
    }
    t.chars().all(|c| {
        c.is_ascii_alphanumeric()
            || matches!(
                c,
                ' ' | '/' | '.' | '_' | '-' | '=' | ',' | '+' | ':' | '$' | '(' | ')' | '@'
            )
    }) && !t.contains(": ")
        && !t.ends_with([':', ' '])
        && !t.contains(" #")
}

/// Documents joined with `---`, after the header comment lines.
pub fn documents(header: &[String], docs: &[Y]) -> String {
    let mut out = String::new();
    for h in header {
        out.push_str(&format!("# {h}\n"));
    }
    for (i, d) in docs.iter().enumerate() {
        if i > 0 || !header.is_empty() {
            out.push_str("---\n");
        }
        out.push_str(&d.to_yaml());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emits_block_yaml_with_comments_and_quoting() {
        let doc = map(vec![
            ("apiVersion", s("v1")),
            ("kind", s("ConfigMap")),
            comment("a comment\nover two lines"),
            (
                "data",
                map(vec![
                    ("plain", s("value with spaces")),
                    ("number", s("3")),
                    ("bool", s("true")),
                    ("colon", s("a: b")),
                    ("flag", s("-b")),
                    ("script", s("set -eu\necho hi\n")),
                    ("empty", s("")),
                ]),
            ),
            (
                "items",
                list(vec![
                    map(vec![("name", s("a")), ("value", int(1))]),
                    Y::Comment("between".into()),
                    s("x"),
                    list(vec![s("y")]),
                ]),
            ),
            ("none", Y::List(vec![])),
            ("nothing", Y::Map(vec![])),
            ("yes", Y::Bool(false)),
        ]);
        let want = "\
apiVersion: v1
kind: ConfigMap
# a comment
# over two lines
data:
  plain: value with spaces
  number: \"3\"
  bool: \"true\"
  colon: \"a: b\"
  flag: \"-b\"
  script: |
    set -eu
    echo hi
  empty: \"\"
items:
  - name: a
    value: 1
  # between
  - x
  - - \"y\"
none: []
nothing: {}
\"yes\": false
";
        assert_eq!(doc.to_yaml(), want);
        let j = doc.to_json();
        assert_eq!(j["data"]["script"], "set -eu\necho hi\n");
        assert_eq!(j["items"].as_array().unwrap().len(), 3, "comment dropped");
        assert_eq!(j.as_object().unwrap().len(), 7);
    }

    #[test]
    fn scripts_that_a_literal_block_cannot_hold_are_quoted() {
        let doc = map(vec![("a", s("x \ny")), ("b", s("\tz\nw"))]);
        assert_eq!(doc.to_yaml(), "a: \"x \\ny\"\nb: \"\\tz\\nw\"\n");
        let doc = map(vec![("c", s("no newline\nat end"))]);
        assert_eq!(doc.to_yaml(), "c: |-\n  no newline\n  at end\n");
    }

    /// Any tree of strings, numbers and booleans, under any keys, reads back through a YAML
    /// parser (serde-saphyr, which kube-rs already builds) as the tree it was: what the
    /// hand-written emitter must guarantee, checked on random and YAML-hostile scalars.
    mod parsed_back {
        use super::super::*;
        use proptest::prelude::*;

        fn hostile() -> impl Strategy<Value = String> {
            prop_oneof![
                any::<String>(),
                "[ -~]{0,12}",
                "[a-z]{1,6}(: |:| #|#|\n|\t|  )?[a-z ]{0,6}\n?",
                Just("yes".to_string()),
                Just("No".to_string()),
                Just("null".to_string()),
                Just("~".to_string()),
                Just("0x1F".to_string()),
                Just("1e3".to_string()),
                Just(".inf".to_string()),
                Just("- item".to_string()),
                Just("key: value".to_string()),
                Just("  leading".to_string()),
                Just("set -eu\n\necho 'a'  \n".to_string()),
            ]
        }

        fn tree() -> impl Strategy<Value = Y> {
            let leaf = prop_oneof![
                hostile().prop_map(Y::Str),
                any::<i64>().prop_map(Y::Int),
                any::<bool>().prop_map(Y::Bool),
            ];
            leaf.prop_recursive(3, 24, 4, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 1..4).prop_map(Y::List),
                    prop::collection::btree_map(hostile(), inner, 1..4)
                        .prop_map(|m| Y::Map(m.into_iter().collect())),
                ]
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]
            #[test]
            fn reads_back_as_written(doc in tree()) {
                let text = doc.to_yaml();
                let back: Value = serde_saphyr::from_str(&text)
                    .map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
                prop_assert_eq!(back, doc.to_json(), "{}", text);
            }
        }
    }
}
