//! Rust names for `.proto` names: case conversion (the rules prost uses, so
//! a schema maps to the names a prost user expects), keyword escaping, and
//! the relative paths between generated modules.

/// Rust keywords (strict and reserved, 2021 edition).
const KEYWORDS: &[&str] = &[
    "abstract", "as", "async", "await", "become", "box", "break", "const", "continue", "crate",
    "do", "dyn", "else", "enum", "extern", "false", "final", "fn", "for", "gen", "if", "impl",
    "in", "let", "loop", "macro", "match", "mod", "move", "mut", "override", "priv", "pub", "ref",
    "return", "self", "Self", "static", "struct", "super", "trait", "true", "try", "type",
    "typeof", "union", "unsafe", "unsized", "use", "virtual", "where", "while", "yield",
];

/// Keywords that cannot be raw identifiers: they get a trailing `_`.
const NOT_RAW: &[&str] = &["self", "Self", "super", "crate"];

/// Splits an identifier into words at underscores and case changes
/// (`HTTPServer_v2` -> `HTTP`, `Server`, `v2`).
fn words(name: &str) -> Vec<String> {
    let chars: Vec<char> = name.chars().collect();
    let mut out = Vec::new();
    let mut cur = String::new();
    for (i, &c) in chars.iter().enumerate() {
        if c == '_' || !c.is_alphanumeric() {
            if !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
            continue;
        }
        if c.is_uppercase() && !cur.is_empty() {
            let prev = chars[i - 1];
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_lowercase());
            // `fooBar` | `HTTPServer` (the S starts a word) | `v2X`
            if prev.is_lowercase() || prev.is_ascii_digit() || (prev.is_uppercase() && next_lower) {
                out.push(std::mem::take(&mut cur));
            }
        }
        cur.push(c);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// `snake_case` (fields, methods, modules).
pub(crate) fn snake(name: &str) -> String {
    let w = words(name);
    let s = w.iter().map(|w| w.to_lowercase()).collect::<Vec<_>>().join("_");
    if s.is_empty() {
        "_".to_owned()
    } else {
        s
    }
}

/// `UpperCamelCase` (types, enum variants).
pub(crate) fn camel(name: &str) -> String {
    let mut s = String::new();
    for w in words(name) {
        let mut cs = w.chars();
        if let Some(first) = cs.next() {
            s.extend(first.to_uppercase());
            s.push_str(&cs.as_str().to_lowercase());
        }
    }
    if s.is_empty() {
        "_".to_owned()
    } else {
        s
    }
}

/// `SCREAMING_SNAKE_CASE` (enum value prefixes).
pub(crate) fn screaming(name: &str) -> String {
    snake(name).to_uppercase()
}

/// An identifier usable in Rust: keywords are escaped (`r#type`, `self_`),
/// a leading digit gets an underscore.
pub(crate) fn ident(name: &str) -> String {
    if NOT_RAW.contains(&name) {
        return format!("{name}_");
    }
    if KEYWORDS.contains(&name) {
        return format!("r#{name}");
    }
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        return format!("_{name}");
    }
    name.to_owned()
}

/// Names the generated code uses unqualified (std's prelude): a message or
/// enum of that name would shadow them in its module, so it gets a `_`.
const PRELUDE: &[&str] = &[
    "Box",
    "Clone",
    "Copy",
    "Default",
    "Err",
    "From",
    "Into",
    "IntoIterator",
    "Iterator",
    "None",
    "Ok",
    "Option",
    "Result",
    "Self",
    "Sized",
    "Some",
    "String",
    "TryFrom",
    "Vec",
];

/// The Rust name of a message or enum type: `UpperCamelCase`, kept clear of
/// keywords and of the prelude names generated code relies on.
pub(crate) fn type_ident(name: &str) -> String {
    let c = camel(name);
    if PRELUDE.contains(&c.as_str()) {
        format!("{c}_")
    } else {
        ident(&c)
    }
}

/// An identifier with a prefix or suffix attached (`set_` + `type`): never
/// needs a raw escape unless the result is itself a keyword.
pub(crate) fn joined(a: &str, b: &str) -> String {
    ident(&format!("{a}{b}"))
}

/// The module path (identifiers) of a package: `foo.bar_baz` -> `foo`, `bar_baz`.
pub(crate) fn package_path(package: &str) -> Vec<String> {
    package.split('.').filter(|p| !p.is_empty()).map(|p| ident(&snake(p))).collect()
}

/// The relative Rust path from module `from` to item `name` in module `to`
/// (both absolute module paths from the crate's generated root).
pub(crate) fn relative(from: &[String], to: &[String], name: &str) -> String {
    let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<&str> = vec!["super"; from.len() - common];
    parts.extend(to[common..].iter().map(String::as_str));
    parts.push(name);
    parts.join("::")
}

/// Escapes bytes as the body of a Rust byte string literal.
pub(crate) fn byte_literal(bytes: &[u8]) -> String {
    let mut s = String::from("b\"");
    for &b in bytes {
        match b {
            b'"' => s.push_str("\\\""),
            b'\\' => s.push_str("\\\\"),
            b'\n' => s.push_str("\\n"),
            b'\r' => s.push_str("\\r"),
            b'\t' => s.push_str("\\t"),
            0x20..=0x7e => s.push(b as char),
            _ => s.push_str(&format!("\\x{b:02x}")),
        }
    }
    s.push('"');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_follow_prost() {
        assert_eq!(snake("userId"), "user_id");
        assert_eq!(snake("HTTPServer"), "http_server");
        assert_eq!(snake("foo_bar"), "foo_bar");
        assert_eq!(snake("Foo__Bar"), "foo_bar");
        assert_eq!(snake("field64"), "field64");
        assert_eq!(camel("foo_bar"), "FooBar");
        assert_eq!(camel("FOO_BAR"), "FooBar");
        assert_eq!(camel("HTTPRequest"), "HttpRequest");
        assert_eq!(camel("Post"), "Post");
        assert_eq!(screaming("PostType"), "POST_TYPE");
    }

    #[test]
    fn type_names_keep_clear_of_the_prelude() {
        assert_eq!(type_ident("option"), "Option_");
        assert_eq!(type_ident("Self"), "Self_");
        assert_eq!(type_ident("post_type"), "PostType");
    }

    #[test]
    fn keywords_are_escaped() {
        assert_eq!(ident("type"), "r#type");
        assert_eq!(ident("self"), "self_");
        assert_eq!(ident("name"), "name");
        assert_eq!(joined("set_", "type"), "set_type");
    }

    #[test]
    fn relative_paths() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(relative(&s(&["a", "b"]), &s(&["a", "b"]), "X"), "X");
        assert_eq!(relative(&s(&["a", "b"]), &s(&["a", "c"]), "X"), "super::c::X");
        assert_eq!(relative(&s(&["a"]), &s(&["a", "m"]), "X"), "m::X");
        assert_eq!(relative(&s(&["a", "m"]), &s(&["b"]), "X"), "super::super::b::X");
    }

    #[test]
    fn byte_literals_escape() {
        assert_eq!(byte_literal(b"a\"\\\x00\xff"), r#"b"a\"\\\x00\xff""#);
    }
}
