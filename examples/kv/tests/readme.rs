//! The README's "Your first service" shows excerpts of this example: each
//! of its `proto` and `rust` snippets must appear, line for line (leading
//! spaces aside), in one of the example's files, so the guide cannot drift
//! from code that compiles. The commands are run by `tests/guide.sh`.

use std::path::Path;

fn section(readme: &str) -> &str {
    let start = readme.find("## Your first service").expect("the guide in the README");
    let rest = &readme[start + 3..];
    let end = rest.find("\n## ").map_or(rest.len(), |e| e + 1);
    &rest[..end]
}

/// The fenced blocks of `text` in `lang`.
fn blocks<'a>(text: &'a str, lang: &str) -> Vec<Vec<&'a str>> {
    let mut out = Vec::new();
    let mut cur: Option<Vec<&str>> = None;
    for line in text.lines() {
        match (&mut cur, line.trim_start()) {
            (None, l) if l == format!("```{lang}") => cur = Some(Vec::new()),
            (Some(_), "```") => out.extend(cur.take()),
            (Some(b), _) => b.push(line),
            _ => {}
        }
    }
    out
}

fn contains_lines(file: &str, snippet: &[&str]) -> bool {
    let lines: Vec<&str> = file.lines().map(str::trim).collect();
    let want: Vec<&str> = snippet.iter().map(|l| l.trim()).collect();
    lines.windows(want.len()).any(|w| w == want.as_slice())
}

#[test]
fn every_snippet_of_the_guide_is_in_the_example() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("../../README.md")).expect("README");
    let guide = section(&readme);
    let files: Vec<(String, String)> = ["proto/kv.proto", "build.rs", "src/lib.rs", "src/main.rs"]
        .iter()
        .map(|f| (f.to_string(), std::fs::read_to_string(root.join(f)).expect(f)))
        .collect();
    let mut checked = 0;
    for lang in ["proto", "rust"] {
        for b in blocks(guide, lang) {
            assert!(
                files.iter().any(|(_, text)| contains_lines(text, &b)),
                "this {lang} snippet of the README's guide is in no file of examples/kv:\n{}",
                b.join("\n")
            );
            checked += 1;
        }
    }
    assert!(checked >= 6, "only {checked} snippets found: did the guide's layout change?");
}
