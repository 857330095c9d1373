//! An indenting text writer for generated Rust. Emitters write lines in
//! rustfmt's layout (4-space indent, 100 columns, the repository's
//! `use_small_heuristics = "Max"`), so the output reads like hand-written
//! code without a formatting pass.

use std::fmt::Write as _;

/// rustfmt's line width (`max_width`).
const MAX_WIDTH: usize = 100;

/// Accumulates generated source, one line at a time.
#[derive(Debug, Default)]
pub struct CodeWriter {
    out: String,
    depth: usize,
}

impl CodeWriter {
    /// An empty writer at indentation level 0.
    pub fn new() -> CodeWriter {
        CodeWriter::default()
    }

    /// An empty writer whose lines start at indentation level `depth` (for
    /// text spliced into another writer with [`CodeWriter::raw`]).
    pub fn at_depth(depth: usize) -> CodeWriter {
        CodeWriter { out: String::new(), depth }
    }

    /// Writes one line at the current indentation (an empty `text` writes an
    /// empty line, without trailing spaces).
    pub fn line(&mut self, text: impl AsRef<str>) {
        let text = text.as_ref();
        if !text.is_empty() {
            for _ in 0..self.depth {
                self.out.push_str("    ");
            }
            self.out.push_str(text);
        }
        self.out.push('\n');
    }

    /// Writes several lines (split at `\n`) at the current indentation.
    pub fn lines(&mut self, text: &str) {
        for l in text.lines() {
            self.line(l);
        }
    }

    /// Writes `head {` and indents.
    pub fn open(&mut self, head: impl AsRef<str>) {
        let head = head.as_ref();
        if head.is_empty() {
            self.line("{");
        } else {
            self.line(format!("{head} {{"));
        }
        self.depth += 1;
    }

    /// Dedents and writes `}` followed by `tail` (e.g. `;` or `,`).
    pub fn close_with(&mut self, tail: &str) {
        self.depth = self.depth.saturating_sub(1);
        self.line(format!("}}{tail}"));
    }

    /// Dedents and writes `}`.
    pub fn close(&mut self) {
        self.close_with("");
    }

    /// Writes a `///` doc comment (each line of `text`).
    pub fn doc(&mut self, text: &str) {
        for l in text.lines() {
            if l.is_empty() {
                self.line("///");
            } else {
                self.line(format!("/// {l}"));
            }
        }
    }

    /// Writes a blank line unless the previous line already is one or opens a block.
    pub fn blank(&mut self) {
        if self.out.is_empty() || self.out.ends_with("\n\n") || self.out.ends_with("{\n") {
            return;
        }
        self.out.push('\n');
    }

    /// Whether `text` fits on one line at the current indentation.
    pub fn fits(&self, text: &str) -> bool {
        self.depth * 4 + text.len() <= MAX_WIDTH
    }

    /// `lead(arg, arg)tail` on one line when it fits, else one argument per
    /// line with a trailing comma (rustfmt's layout).
    pub fn call(&mut self, lead: &str, args: &[String], tail: &str) {
        let one = format!("{lead}({}){tail}", args.join(", "));
        // Observed rustfmt behaviour: a `?` after the call narrows its width.
        let reserve = if tail.contains('?') { 2 } else { 0 };
        if self.fits(&one) && self.depth * 4 + one.len() + reserve <= MAX_WIDTH {
            self.line(one);
            return;
        }
        // `let x = f(..);` breaks after the `=` first, if the call then fits.
        if let Some((binding, rhs)) = lead.split_once(" = ").filter(|_| lead.starts_with("let ")) {
            let rest = format!("{rhs}({}){tail}", args.join(", "));
            if (self.depth + 1) * 4 + rest.len() + reserve <= MAX_WIDTH {
                self.line(format!("{binding} ="));
                self.depth += 1;
                self.line(rest);
                self.depth -= 1;
                return;
            }
        }
        self.line(format!("{lead}("));
        self.depth += 1;
        for a in args {
            self.line(format!("{a},"));
        }
        self.depth -= 1;
        self.line(format!("){tail}"));
    }

    /// A function signature that opens its body: `lead(params) -> ret {`,
    /// with the parameters one per line when it does not fit.
    pub fn open_fn(&mut self, lead: &str, params: &[String], ret: &str) {
        let tail = if ret.is_empty() { " {".to_owned() } else { format!(" -> {ret} {{") };
        self.call(lead, params, &tail);
        self.depth += 1;
    }

    /// `head.link().link()tail` on one line when it fits, else one link per
    /// line, indented (rustfmt's chain layout).
    pub fn chain(&mut self, head: &str, links: &[String], tail: &str) {
        let one = format!("{head}{}{tail}", links.concat());
        if self.fits(&one) {
            self.line(one);
            return;
        }
        self.line(head);
        self.depth += 1;
        for (i, l) in links.iter().enumerate() {
            if i + 1 == links.len() {
                self.line(format!("{l}{tail}"));
            } else {
                self.line(l);
            }
        }
        self.depth -= 1;
    }

    /// `if cond {` a `} else {` b `}` (a function's tail expression: rustfmt
    /// always spreads it over five lines).
    pub fn if_else(&mut self, cond: &str, then: &str, otherwise: &str) {
        self.open(format!("if {cond}"));
        self.line(then);
        self.close_with(" else {");
        self.depth += 1;
        self.line(otherwise);
        self.close();
    }

    /// Indents the following lines one level.
    pub fn indent(&mut self) {
        self.depth += 1;
    }

    /// Dedents the following lines one level.
    pub fn dedent(&mut self) {
        self.depth = self.depth.saturating_sub(1);
    }

    /// Current indentation level.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Appends formatted text verbatim (no indentation).
    pub fn raw(&mut self, text: &str) {
        let _ = write!(self.out, "{text}");
    }

    /// The text written so far.
    pub fn into_string(self) -> String {
        self.out
    }
}
