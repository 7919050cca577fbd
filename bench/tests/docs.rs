//! Documents that stay true: every repository path a document names exists.
//!
//! Code moves (renamed scripts, modules split into directories, crates carved out) and the
//! prose that points at it does not follow by itself; a reader then looks for a file that is
//! gone. This test reads every markdown document of the repository and checks the paths it
//! names: in inline code spans and fenced blocks, every word that starts with a top-level
//! entry (`bench/...`, `docs/...`, `README.md`), and every relative link target. Words that
//! start elsewhere (flags, free text, `src/lib.rs` inside a crate's own README) are not taken
//! for repository paths. It reads files only; it never runs the binary.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Component, Path, PathBuf};

/// Top-level directories a document may name even before they exist on this branch: a path
/// under one that does not exist is reported like any other missing path.
const TOP_DIRS: &[&str] = &[
    "bench",
    "collectives",
    "transports",
    "launchers",
    "tiers",
    "reports",
    "k8s",
    "http",
    "fuzz",
    "docs",
    "measure",
    "job",
    ".ci",
];

/// Directories whose markdown is not documentation: build output, fuzzing state, VCS data.
const SKIP_DIRS: &[&str] = &["target", ".git", "corpus", "artifacts", "node_modules"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("bench/ has a parent: the repository root")
        .to_path_buf()
}

/// A path a document names, where it names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Named {
    doc: String,
    line: usize,
    /// As written (after trimming), for the message.
    written: String,
    /// Relative to the repository root.
    path: String,
}

/// The first segments that make a word a repository path: the fixed top-level directories,
/// every directory at the root that holds a crate (a new crate is covered without editing
/// this test), and the files at the root (`README.md`, `Cargo.toml`, ...).
fn top_level(root: &Path) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut dirs: BTreeSet<String> = TOP_DIRS.iter().map(|s| s.to_string()).collect();
    let mut files = BTreeSet::new();
    for entry in fs::read_dir(root).expect("the repository root is readable") {
        let entry = entry.expect("a root entry is readable");
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if path.is_file() {
            files.insert(name);
        } else if path.join("Cargo.toml").is_file() && !SKIP_DIRS.contains(&name.as_str()) {
            dirs.insert(name);
        }
    }
    (dirs, files)
}

/// Every markdown file under `dir`, outside build output and fuzzing state.
fn documents(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry is readable").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let name = name.unwrap_or_default();
        if path.is_dir() {
            if !SKIP_DIRS.contains(&name.as_str()) {
                documents(&path, out);
            }
        } else if name.ends_with(".md") {
            out.push(path);
        }
    }
}

/// The text of a document split in two, offsets kept: inline code spans and fenced blocks
/// (whose words may be paths) and the prose outside them (whose links are). Both are the
/// document with everything else blanked, newlines kept, so an offset gives the line.
fn split_code(text: &str) -> (Vec<(usize, String)>, String) {
    let mut code = Vec::new();
    let mut prose = String::with_capacity(text.len());
    // Fenced blocks first, line by line: their backticks are not spans.
    let mut fence: Option<(char, usize)> = None;
    let mut inline = String::with_capacity(text.len());
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        let marker = trimmed.chars().next().filter(|c| *c == '`' || *c == '~');
        let run = marker.map_or(0, |c| trimmed.chars().take_while(|x| *x == c).count());
        match (fence, marker) {
            (None, Some(c)) if run >= 3 => fence = Some((c, run)),
            (Some((c, n)), Some(m)) if m == c && run >= n && trimmed.trim().len() == run => {
                fence = None
            }
            (Some(_), _) => code.push((offset, line.to_string())),
            (None, _) => {
                inline.push_str(line);
                offset += line.len();
                continue;
            }
        }
        inline.push_str(&blank(line));
        offset += line.len();
    }
    // Inline spans: a run of N backticks up to the next run of exactly N.
    let bytes = inline.as_bytes();
    let run_at = |i: usize| bytes[i..].iter().take_while(|b| **b == b'`').count();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'`' {
            let next = inline[i..].find('`').map_or(bytes.len(), |k| i + k);
            prose.push_str(&inline[i..next]);
            i = next;
            continue;
        }
        let n = run_at(i);
        let mut j = i + n;
        let mut close = None;
        while j < bytes.len() {
            if bytes[j] == b'`' {
                let m = run_at(j);
                if m == n {
                    close = Some(j);
                    break;
                }
                j += m;
            } else {
                j += 1;
            }
        }
        match close {
            Some(j) => {
                code.push((i + n, inline[i + n..j].to_string()));
                prose.push_str(&blank(&inline[i..j + n]));
                i = j + n;
            }
            None => {
                // An unmatched run is literal text.
                prose.push_str(&inline[i..i + n]);
                i += n;
            }
        }
    }
    (code, prose)
}

/// Spaces for `text`, byte for byte, newlines kept: offsets into the result are offsets into
/// the document.
fn blank(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c == '\n' {
                "\n".to_string()
            } else {
                " ".repeat(c.len_utf8())
            }
        })
        .collect()
}

/// `a/{b,c}/d` as `a/b/d` and `a/c/d`, as a shell expands it; braces without a comma (a
/// placeholder such as `{index}`) stay.
fn expand_braces(word: &str) -> Vec<String> {
    if let Some(open) = word.find('{') {
        if let Some(len) = word[open..].find('}') {
            let inner = &word[open + 1..open + len];
            if inner.contains(',') {
                let (head, tail) = (&word[..open], &word[open + len + 1..]);
                return inner
                    .split(',')
                    .flat_map(|alt| expand_braces(&format!("{head}{alt}{tail}")))
                    .collect();
            }
        }
    }
    vec![word.to_string()]
}

/// A word as a path: without an anchor, an item (`::name`), a line (`:12`, `:12-20`) or the
/// punctuation of the sentence around it.
fn trim_path(word: &str) -> String {
    let mut w = word.trim_start_matches(['(', '[', '"', '\'', '<']);
    if let Some(eq) = w.rfind('=') {
        // `--flag=path`, `VAR=path`.
        w = &w[eq + 1..];
    }
    for cut in ["#", "::"] {
        if let Some(k) = w.find(cut) {
            w = &w[..k];
        }
    }
    loop {
        let before = w;
        w = w.trim_end_matches(['.', ',', ';', ':', '!', '?', ')', ']', '"', '\'', '>']);
        if let Some(colon) = w.rfind(':') {
            let tail = &w[colon + 1..];
            if !tail.is_empty() && tail.chars().all(|c| c.is_ascii_digit() || c == '-') {
                w = &w[..colon];
            }
        }
        if w == before {
            break;
        }
    }
    w.strip_prefix("./").unwrap_or(w).to_string()
}

/// The paths named in one document's text, relative to the repository root. `doc_dir` is
/// the document's directory relative to the root: links resolve from there, code from the
/// root (the project's documents name paths from the root).
fn named_paths(
    doc: &str,
    doc_dir: &Path,
    text: &str,
    dirs: &BTreeSet<String>,
    files: &BTreeSet<String>,
) -> Vec<Named> {
    let line_of = |offset: usize| {
        let before = &text.as_bytes()[..offset.min(text.len())];
        before.iter().filter(|b| **b == b'\n').count() + 1
    };
    let (code, prose) = split_code(text);
    let mut out = Vec::new();
    for (start, span) in &code {
        let mut at = 0;
        for word in span.split_whitespace() {
            let k = span[at..].find(word).map_or(at, |k| at + k);
            at = k + word.len();
            for cand in expand_braces(word) {
                let path = trim_path(&cand);
                let first = path.split('/').next().unwrap_or_default();
                // A placeholder (`<target>`, `$DIR`, `{index}`) names paths made at run time,
                // or names in the store, not a file of the repository.
                let placeholder = path.contains(['<', '>', '$', '{', '}']);
                let is_path = (path.contains('/') && dirs.contains(first)) || files.contains(&path);
                let is_path = is_path && !placeholder;
                if is_path {
                    let written = word.to_string();
                    out.push(Named {
                        doc: doc.to_string(),
                        line: line_of(start + k),
                        written,
                        path,
                    });
                }
            }
        }
    }
    // Links `[text](target)` and reference definitions `[id]: target`.
    let mut targets = Vec::new();
    let mut from = 0;
    while let Some(k) = prose[from..].find("](") {
        let s = from + k + 2;
        let end = prose[s..]
            .find([')', ' ', '\n'])
            .map_or(prose.len(), |e| s + e);
        targets.push((s, &prose[s..end]));
        from = end;
    }
    let mut offset = 0;
    for line in prose.split_inclusive('\n') {
        let t = line.trim_start();
        if let (true, Some(k)) = (t.starts_with('['), t.find("]: ")) {
            let target = t[k + 3..].split_whitespace().next().unwrap_or_default();
            targets.push((offset + line.len() - t.len() + k + 3, target));
        }
        offset += line.len();
    }
    for (start, target) in targets {
        let target = target.trim_start_matches('<').trim_end_matches('>');
        let remote = target.contains("://") || target.starts_with("mailto:");
        let path = target.split('#').next().unwrap_or_default();
        if remote || path.is_empty() {
            continue;
        }
        let mut joined = PathBuf::new();
        for c in doc_dir.join(path).components() {
            match c {
                Component::ParentDir => {
                    joined.pop();
                }
                Component::Normal(s) => joined.push(s),
                _ => {}
            }
        }
        let path = joined.to_string_lossy().into_owned();
        out.push(Named {
            doc: doc.to_string(),
            line: line_of(start),
            written: target.to_string(),
            path,
        });
    }
    out
}

/// Whether `a*b` matches `name` (`*`: any run of characters).
fn glob_match(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(k) => rest = &rest[k + part.len()..],
            None => return false,
        }
    }
    true
}

/// Whether the path exists under `base`; a `*` segment matches at least one entry, `**` any
/// depth of directories.
fn exists(base: &Path, segments: &[&str]) -> bool {
    let Some((seg, rest)) = segments.split_first() else {
        return base.exists();
    };
    if seg.is_empty() || *seg == "." {
        return exists(base, rest);
    }
    if !seg.contains('*') {
        return exists(&base.join(seg), rest);
    }
    let Ok(entries) = fs::read_dir(base) else {
        return false;
    };
    let entries: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    if *seg == "**" {
        return exists(base, rest) || entries.iter().any(|p| p.is_dir() && exists(p, segments));
    }
    entries.iter().any(|p| {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        glob_match(seg, &name) && exists(p, rest)
    })
}

fn missing(root: &Path, named: Vec<Named>) -> Vec<Named> {
    let set: BTreeSet<Named> = named.into_iter().collect();
    set.into_iter()
        .filter(|n| !exists(root, &n.path.split('/').collect::<Vec<_>>()))
        .collect()
}

#[test]
fn every_path_a_document_names_exists() {
    let root = repo();
    let (dirs, files) = top_level(&root);
    let mut docs = Vec::new();
    documents(&root, &mut docs);
    assert!(
        docs.iter().any(|d| d.ends_with("README.md")),
        "no README.md found under {}: is the repository root right?",
        root.display()
    );
    let mut named = Vec::new();
    for path in &docs {
        let rel = path
            .strip_prefix(&root)
            .expect("a document lies under the root");
        let text = fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let dir = rel.parent().unwrap_or(Path::new(""));
        named.extend(named_paths(
            &rel.to_string_lossy(),
            dir,
            &text,
            &dirs,
            &files,
        ));
    }
    let gone = missing(&root, named);
    let list: Vec<String> = gone
        .iter()
        .map(|n| format!("  {}:{}: `{}` (no {})", n.doc, n.line, n.written, n.path))
        .collect();
    assert!(
        gone.is_empty(),
        "{} path(s) named in documents do not exist:\n{}\nFix each: name the path as it is now \
         (a renamed or moved file), or change the document (a removed one: say what replaced it)",
        gone.len(),
        list.join("\n")
    );
}

/// The checker itself: it must find a wrong path, or the test above proves nothing.
#[test]
fn a_wrong_path_is_reported() {
    let root = repo();
    let (dirs, files) = top_level(&root);
    let text = "Intro `bench/scripts/no-such-script.sh --flag`, `transports/src/{tcp,nowhere}/`,\n\
                see [the map](../docs/NO-SUCH.md#top) and `README.md:3`, `--np 4`, `src/lib.rs`,\n\
                `bench/tests/*.rs`, `bench/tests/docs.rs::every_path_a_document_names_exists`.\n\
                ```sh\nbench/scripts/gone.sh --x\n```\n";
    let named = named_paths("docs/x.md", Path::new("docs"), text, &dirs, &files);
    let paths: Vec<&str> = named.iter().map(|n| n.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "bench/scripts/gone.sh",
            "bench/scripts/no-such-script.sh",
            "transports/src/tcp/",
            "transports/src/nowhere/",
            "README.md",
            "bench/tests/*.rs",
            "bench/tests/docs.rs",
            "docs/NO-SUCH.md",
        ]
    );
    let gone: Vec<(String, usize)> = missing(&root, named)
        .into_iter()
        .map(|n| (n.path, n.line))
        .collect();
    assert_eq!(
        gone,
        [
            ("bench/scripts/no-such-script.sh".to_string(), 1),
            ("transports/src/nowhere/".to_string(), 1),
            ("docs/NO-SUCH.md".to_string(), 2),
            ("bench/scripts/gone.sh".to_string(), 5),
        ]
    );
}
