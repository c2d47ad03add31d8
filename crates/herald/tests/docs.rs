//! The documentation's own check: in every Markdown file of the repository
//! (`README.md`, `ARCHITECTURE.md`, `docs/*.md`, ...), each code fence is
//! closed (before the next fence that opens a block: a fence with an info
//! string such as ```` ```sh ```` inside a block means the block was left
//! open, even when a later bare fence closes it), each relative link names a file or directory that exists, and
//! each `#anchor` of a link names a heading (or an HTML `id`) of the file
//! it points into, as GitHub renders them. Links to other sites are not
//! fetched.
//!
//! The check's own tests (`checker_*`) show it refusing a broken link, a
//! broken anchor and an unclosed fence.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

/// The repository's root (two levels above this package).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root")
}

/// Every `.md` file under `dir`, skipping hidden directories, build output
/// and installed packages.
fn markdown_files(dir: &Path, found: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let entry = entry.expect("a directory entry");
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let kind = entry.file_type().expect("a file type");
        if kind.is_dir() {
            if !name.starts_with('.') && name != "target" && name != "node_modules" {
                markdown_files(&path, found);
            }
        } else if name.ends_with(".md") {
            found.push(path);
        }
    }
}

/// What one Markdown text holds: its anchors, its links (with their line
/// numbers) and its fence problems.
#[derive(Debug, Default)]
struct Parsed {
    /// Heading anchors (GitHub's) and HTML `id`/`name` attributes.
    anchors: HashSet<String>,
    /// `(line, target)` of each link outside code.
    links: Vec<(usize, String)>,
    /// Problems found while parsing (an unclosed fence).
    problems: Vec<String>,
}

/// An open code fence: its character, its length and its line.
struct Fence {
    mark: char,
    len: usize,
    line: usize,
}

/// The fence that `line` opens or closes: its character and length, and
/// whether anything follows it (an info string).
fn fence_of(line: &str) -> Option<(char, usize, bool)> {
    let text = line.trim_start();
    let mark = text.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let len = text.chars().take_while(|c| *c == mark).count();
    (len >= 3).then(|| (mark, len, !text[len..].trim().is_empty()))
}

/// GitHub's anchor of a heading's text: lower case, every character that
/// is not a letter, a digit, a space, `-` or `_` dropped, spaces as `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// `line` with its inline code spans (`` `...` ``) removed.
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let ticks = rest[start..].chars().take_while(|c| *c == '`').count();
        let after = &rest[start + ticks..];
        let closing = "`".repeat(ticks);
        match after.find(&closing) {
            Some(end) => rest = &after[end + ticks..],
            None => {
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The targets of the inline links `[text](target)` in `line`.
fn link_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end].split_whitespace().next().unwrap_or_default();
        if !target.is_empty() {
            targets.push(target.trim_matches(['<', '>']).to_owned());
        }
        rest = &after[end..];
    }
    targets
}

/// The values of `id="..."` and `name="..."` attributes in `line`.
fn html_ids(line: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for attribute in ["id=\"", "name=\""] {
        let mut rest = line;
        while let Some(at) = rest.find(attribute) {
            let after = &rest[at + attribute.len()..];
            let Some(end) = after.find('"') else { break };
            ids.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    ids
}

fn parse(text: &str) -> Parsed {
    let mut parsed = Parsed::default();
    let mut open: Option<Fence> = None;
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        if let Some(fence) = &open {
            if let Some((mark, len, info)) = fence_of(line) {
                if mark == fence.mark && len >= fence.len {
                    if info {
                        // A fence with an info string cannot close a code
                        // block, so this one was meant to open the next
                        // block: the one before it was left open.
                        parsed.problems.push(format!(
                            "line {number}: a code fence with an info string inside the code \
                             block opened at line {}: close that block first",
                            fence.line
                        ));
                    } else {
                        open = None;
                    }
                }
            }
            continue;
        }
        if let Some((mark, len, _)) = fence_of(line) {
            open = Some(Fence {
                mark,
                len,
                line: number,
            });
            continue;
        }
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let base = slug(line[hashes..].trim().trim_end_matches('#'));
            let count = seen.entry(base.clone()).or_insert(0);
            let anchor = if *count == 0 {
                base.clone()
            } else {
                format!("{base}-{count}")
            };
            *count += 1;
            parsed.anchors.insert(anchor);
        }
        parsed.anchors.extend(html_ids(line));
        for target in link_targets(&without_code_spans(line)) {
            parsed.links.push((number, target));
        }
    }
    if let Some(fence) = open {
        parsed.problems.push(format!(
            "line {}: the code fence opened here is never closed",
            fence.line
        ));
    }
    parsed
}

/// The problems of the Markdown file `file` (`text`), whose relative links
/// are resolved from its directory; `anchors_of` gives the anchors of
/// another Markdown file.
fn check_file(
    file: &Path,
    text: &str,
    anchors_of: &mut dyn FnMut(&Path) -> Option<HashSet<String>>,
) -> Vec<String> {
    let parsed = parse(text);
    let mut problems = parsed.problems.clone();
    let dir = file.parent().expect("a file has a directory");
    for (line, target) in &parsed.links {
        let lower = target.to_ascii_lowercase();
        if lower.contains("://") || lower.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((path, anchor)) => (path, Some(anchor)),
            None => (target.as_str(), None),
        };
        let (resolved, anchors) = if path.is_empty() {
            (file.to_path_buf(), Some(parsed.anchors.clone()))
        } else {
            let resolved = dir.join(path);
            if !resolved.exists() {
                problems.push(format!(
                    "line {line}: link to {target}: {} does not exist",
                    resolved.display()
                ));
                continue;
            }
            let anchors = if path.ends_with(".md") {
                anchors_of(&resolved)
            } else {
                None
            };
            (resolved, anchors)
        };
        if let Some(anchor) = anchor {
            match anchors {
                Some(anchors) if anchors.contains(anchor) => {}
                Some(_) => problems.push(format!(
                    "line {line}: link to {target}: {} has no heading or id with the anchor #{anchor}",
                    resolved.display()
                )),
                None => problems.push(format!(
                    "line {line}: link to {target}: an anchor into a file that is not Markdown"
                )),
            }
        }
    }
    problems
}

#[test]
fn every_markdown_link_anchor_and_fence_of_the_repository_holds() {
    let root = repo_root();
    let mut files = Vec::new();
    markdown_files(&root, &mut files);
    files.sort();
    for expected in ["README.md", "ARCHITECTURE.md", "docs/operations.md"] {
        assert!(
            files.contains(&root.join(expected)),
            "{expected} not found among {files:?}"
        );
    }
    let mut anchors_of = |path: &Path| {
        let text = std::fs::read_to_string(path).ok()?;
        Some(parse(&text).anchors)
    };
    let mut problems = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read a Markdown file");
        let shown = file
            .strip_prefix(&root)
            .unwrap_or(file)
            .display()
            .to_string();
        for problem in check_file(file, &text, &mut anchors_of) {
            problems.push(format!("{shown}: {problem}"));
        }
    }
    assert!(
        problems.is_empty(),
        "{} problem(s) in the documentation:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// Checks `text` as the file `docs/page.md` of a repository whose other
/// Markdown file is `docs/other.md` (`other`), both in a temp dir.
fn check_sample(text: &str, other: &str) -> Vec<String> {
    let dir = tempfile::tempdir().expect("a temp dir");
    let docs = dir.path().join("docs");
    std::fs::create_dir(&docs).expect("create docs");
    std::fs::write(docs.join("other.md"), other).expect("write other.md");
    let page = docs.join("page.md");
    std::fs::write(&page, text).expect("write page.md");
    let mut anchors_of = |path: &Path| {
        let text = std::fs::read_to_string(path).ok()?;
        Some(parse(&text).anchors)
    };
    check_file(&page, text, &mut anchors_of)
}

const OTHER: &str = "# Other\n\n## `GET /metrics`\n\n## Limits today\n\n## Limits today\n";

#[test]
fn checker_accepts_sound_links_anchors_and_fences() {
    let text = "# Page\n\n## Step one: the `Host` header\n\n\
        See [other](other.md), [metrics](other.md#get-metrics),\n\
        [the second](other.md#limits-today-1), [here](#step-one-the-host-header),\n\
        [a site](https://example.com/x#y), `[not](a link)`.\n\n\
        ```sh\n[inside](missing.md)\n```\n\n  ```\n  indented\n  ```\n\n\
        ````md\n```\n````\n";
    assert_eq!(check_sample(text, OTHER), Vec::<String>::new());
}

#[test]
fn checker_refuses_a_link_to_a_missing_file() {
    let problems = check_sample("# Page\n\nSee [gone](gone.md).\n", OTHER);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with("line 3: link to gone.md"),
        "{problems:?}"
    );
}

#[test]
fn checker_refuses_an_anchor_that_names_no_heading() {
    let problems = check_sample(
        "# Page\n\n[m](other.md#metrics) and [x](#nowhere) and [y](other.md#limits-today-2)\n",
        OTHER,
    );
    assert_eq!(problems.len(), 3, "{problems:?}");
    assert!(problems[0].contains("#metrics"), "{problems:?}");
    assert!(problems[1].contains("#nowhere"), "{problems:?}");
    assert!(problems[2].contains("#limits-today-2"), "{problems:?}");
}

/// A block left open whose text a later bare fence closes, as a page
/// renders it: everything in between is shown as code.
#[test]
fn checker_refuses_a_fence_left_open_before_the_next_block() {
    let problems = check_sample(
        "# Page\n\n```sh\none\n## Next\n\n```sh\ntwo\n```\n\n[x](#page)\n",
        OTHER,
    );
    assert_eq!(
        problems,
        vec![
            "line 7: a code fence with an info string inside the code block opened at line 3: \
             close that block first"
                .to_owned()
        ]
    );
}

#[test]
fn checker_refuses_an_unclosed_fence() {
    let problems = check_sample(
        "# Page\n\n```sh\nsome command\n## Next\n\n[x](#next)\n",
        OTHER,
    );
    assert_eq!(
        problems,
        vec!["line 3: the code fence opened here is never closed".to_owned()]
    );
}
