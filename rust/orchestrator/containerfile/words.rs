//! Words of instruction arguments: splitting with shell-like quoting, and
//! `$VAR` expansion with the values a build step knows.

/// A variable name as ENV and ARG accept it: `[A-Za-z_][A-Za-z0-9_]*`.
pub(super) fn valid_var(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// A single word with its quotes removed; text of several words (the legacy
/// `ENV key some value`) is kept as written.
pub(super) fn unquote(s: &str) -> String {
    split_words(s).ok().filter(|w| w.len() == 1).and_then(|mut w| w.pop()).unwrap_or_else(|| s.to_string())
}

/// Split on whitespace honouring quotes and backslashes. `$` stays for
/// [`expand`], escaped (`\$`) where quoting made it literal.
pub(super) fn split_words(s: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => words.extend(word.take()),
            '\\' => {
                let next = chars.next().unwrap_or('\\');
                let w = word.get_or_insert_with(String::new);
                if next == '$' {
                    w.push('\\');
                }
                w.push(next);
            }
            '\'' | '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        None => return Err(format!("unterminated {c}quote{c}")),
                        Some(q) if q == c => break,
                        Some('$') if c == '\'' => w.push_str("\\$"),
                        Some('\\') if c == '"' => match chars.next() {
                            Some(n @ ('"' | '\\')) => w.push(n),
                            Some('$') => w.push_str("\\$"),
                            Some(n) => {
                                w.push('\\');
                                w.push(n);
                            }
                            None => return Err("unterminated \"quote\"".into()),
                        },
                        Some(q) => w.push(q),
                    }
                }
            }
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    Ok(words)
}

/// Expand `$VAR`, `${VAR}` and `${VAR:-default}` with `lookup`; `\$` is a
/// literal `$`. Unknown variables expand to nothing, as in Docker.
pub fn expand(s: &str, lookup: &dyn Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'$') => {
                chars.next();
                out.push('$');
            }
            '$' if chars.peek() == Some(&'{') => {
                chars.next();
                let inner: String = chars.by_ref().take_while(|&c| c != '}').collect();
                let (name, default) = match inner.split_once(":-") {
                    Some((n, d)) => (n, Some(d)),
                    None => (inner.as_str(), None),
                };
                match (lookup(name).filter(|v| !v.is_empty()), default) {
                    (Some(v), _) => out.push_str(&v),
                    (None, Some(d)) => out.push_str(d),
                    (None, None) => out.push_str(&lookup(name).unwrap_or_default()),
                }
            }
            '$' if chars.peek().is_some_and(|c| *c == '_' || c.is_ascii_alphabetic()) => {
                let mut name = String::new();
                while let Some(&c) = chars.peek().filter(|c| **c == '_' || c.is_ascii_alphanumeric()) {
                    name.push(c);
                    chars.next();
                }
                out.push_str(&lookup(&name).unwrap_or_default());
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expansion_respects_quoting() {
        let vars = |n: &str| (n == "A").then(|| "x".to_string());
        let words = split_words(r#"$A "${A}y" '$A' \$A ${B:-d}"#).expect("splits");
        let expanded: Vec<String> = words.iter().map(|w| expand(w, &vars)).collect();
        assert_eq!(expanded, vec!["x", "xy", "$A", "$A", "d"]);
    }
}
