//! Parsing a Containerfile into the instructions `build_image` supports:
//! comments, `\` continuations, BuildKit heredocs (`RUN <<EOF`, `COPY <<EOF
//! /dest`), and FROM, RUN, COPY, ADD, ENV, ARG, WORKDIR, USER, LABEL. Every
//! other instruction is refused here, so a build never starts only to fail
//! half-way on something it cannot do. Variable references (`$VAR`) are kept
//! for the build to expand with the values known at that step.
use std::sync::LazyLock;

use regex::Regex;

mod words;
pub use words::expand;
use words::{split_words, unquote, valid_var};

/// What the builder supports, in the order the error lists them.
const SUPPORTED: &str = "FROM, RUN, COPY, ADD, ENV, ARG, WORKDIR, USER, LABEL";

/// `<<EOF`, `<<-EOF`, `<<"EOF"`, `<<'EOF'`.
static HEREDOC: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"<<(-?)(?:"([A-Za-z_][A-Za-z0-9_]*)"|'([A-Za-z_][A-Za-z0-9_]*)'|([A-Za-z_][A-Za-z0-9_]*))"#)
        .expect("valid regex")
});

/// A Containerfile the builder cannot run, with the line it is about.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ContainerfileError {
    /// 1-based line of the instruction.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// One instruction and the line it starts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instruction {
    /// 1-based line.
    pub line: usize,
    /// The instruction as written (continuations joined), for progress and errors.
    pub text: String,
    /// What it does.
    pub op: Op,
}

/// A supported instruction, arguments unexpanded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// The base image.
    From(String),
    /// A command: argv (`/bin/sh -c …` for the shell form) and its stdin
    /// (a heredoc fed to a command).
    Run {
        /// What to execute.
        argv: Vec<String>,
        /// Bytes for stdin.
        stdin: Option<String>,
    },
    /// COPY or ADD from heredocs or the inline context.
    Copy {
        /// ADD (refuses URLs and archives) rather than COPY.
        add: bool,
        /// What to copy.
        sources: Vec<Source>,
        /// Where to (relative to the working directory unless absolute).
        dest: String,
        /// `--chown=user[:group]`.
        chown: Option<String>,
        /// `--chmod=mode`.
        chmod: Option<String>,
    },
    /// Variables of every later step and of the image.
    Env(Vec<(String, String)>),
    /// A build-time variable with an optional default.
    Arg(String, Option<String>),
    /// The working directory of later steps and of the image.
    Workdir(String),
    /// The user of later RUNs and of the image.
    User(String),
    /// Image labels.
    Label(Vec<(String, String)>),
}

/// Where a COPY source comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// An inline heredoc: its name becomes the file name.
    Heredoc {
        /// The delimiter word.
        name: String,
        /// The content.
        body: String,
    },
    /// A path in the build context.
    Context(String),
}

fn err(line: usize, message: impl Into<String>) -> ContainerfileError {
    ContainerfileError { line, message: message.into() }
}

/// Parse a Containerfile. The first instruction must be FROM and the only
/// one (no multi-stage builds).
pub fn parse(text: &str) -> Result<Vec<Instruction>, ContainerfileError> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out: Vec<Instruction> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let start = i + 1;
        let first = lines[i].trim();
        if first.is_empty() || first.starts_with('#') {
            i += 1;
            continue;
        }
        let mut logical = String::new();
        loop {
            let line = lines[i].trim_end();
            i += 1;
            match line.strip_suffix('\\') {
                Some(head) => {
                    logical.push_str(head);
                    logical.push(' ');
                    // Comment and empty lines inside a continuation are dropped, as Docker does.
                    while i < lines.len() && (lines[i].trim().is_empty() || lines[i].trim_start().starts_with('#')) {
                        i += 1;
                    }
                    // A continuation into the end of the file ends the instruction.
                    if i == lines.len() {
                        break;
                    }
                }
                None => {
                    logical.push_str(line);
                    break;
                }
            }
        }
        let logical = logical.trim().to_string();
        let (keyword, rest) = logical.split_once(char::is_whitespace).unwrap_or((&logical, ""));
        let keyword = keyword.to_ascii_uppercase();
        let rest = rest.trim();
        let mut heredocs = Vec::new();
        if matches!(keyword.as_str(), "RUN" | "COPY" | "ADD") {
            let quoted = quoted_bytes(rest);
            // `echo "<<EOF"` and `["<<EOF"]` quote the text: no heredoc, as in BuildKit.
            for cap in HEREDOC.captures_iter(rest).filter(|c| !quoted[c.get(0).map_or(0, |m| m.start())]) {
                let strip_tabs = !cap[1].is_empty();
                let word = cap.get(2).or(cap.get(3)).or(cap.get(4)).map(|m| m.as_str()).unwrap_or_default();
                let mut body = String::new();
                loop {
                    let Some(line) = lines.get(i) else {
                        return Err(err(start, format!("heredoc <<{word} is not terminated by a line '{word}'")));
                    };
                    i += 1;
                    let line = if strip_tabs { line.trim_start_matches('\t') } else { line };
                    if line == word {
                        break;
                    }
                    body.push_str(line);
                    body.push('\n');
                }
                heredocs.push((cap[0].to_string(), word.to_string(), body));
            }
        }
        let op = instruction(start, &keyword, rest, heredocs)?;
        match (&op, out.is_empty()) {
            (Op::From(_), false) => {
                return Err(err(start, "multi-stage builds are not supported (only one FROM)"));
            }
            (Op::From(_), true) => {}
            (_, true) => return Err(err(start, format!("FROM must be the first instruction, not {keyword}"))),
            _ => {}
        }
        out.push(Instruction { line: start, text: logical, op });
    }
    if out.is_empty() {
        return Err(err(1, "empty Containerfile: it needs at least FROM <image>"));
    }
    Ok(out)
}

type Heredocs = Vec<(String, String, String)>;

/// For each byte of `s`: whether it lies inside single or double quotes
/// (backslash escapes honoured outside single quotes).
fn quoted_bytes(s: &str) -> Vec<bool> {
    let mut out = vec![false; s.len() + 1];
    let (mut quote, mut escaped) = (None, false);
    for (i, c) in s.char_indices() {
        out[i] = quote.is_some();
        match (quote, c) {
            _ if escaped => escaped = false,
            (Some('\''), '\'') | (Some('"'), '"') => quote = None,
            (Some('\''), _) => {}
            (_, '\\') => escaped = true,
            (None, '\'' | '"') => quote = Some(c),
            _ => {}
        }
    }
    out
}

fn instruction(line: usize, keyword: &str, rest: &str, heredocs: Heredocs) -> Result<Op, ContainerfileError> {
    let needs_args = || if rest.is_empty() { Err(err(line, format!("{keyword} needs arguments"))) } else { Ok(()) };
    match keyword {
        "FROM" => {
            needs_args()?;
            let words: Vec<&str> = rest.split_whitespace().collect();
            match words.as_slice() {
                [flag, ..] if flag.starts_with("--") => Err(err(line, format!("FROM {flag} is not supported"))),
                [image] => Ok(Op::From(image.to_string())),
                [image, as_, _alias] if as_.eq_ignore_ascii_case("as") => Ok(Op::From(image.to_string())),
                _ => Err(err(line, "FROM takes an image and an optional 'AS name'")),
            }
        }
        "RUN" => run(line, rest, heredocs),
        "COPY" | "ADD" => copy(line, keyword == "ADD", rest, heredocs),
        "ENV" | "LABEL" => {
            needs_args()?;
            let words = split_words(rest).map_err(|m| err(line, m))?;
            let pairs = if words.len() >= 2 && !words[0].contains('=') {
                // Legacy `ENV key value with spaces`.
                let value = rest.split_once(char::is_whitespace).map(|(_, v)| v.trim()).unwrap_or_default();
                vec![(words[0].clone(), unquote(value))]
            } else {
                let mut pairs = Vec::new();
                for w in words {
                    let Some((k, v)) = w.split_once('=') else {
                        return Err(err(line, format!("{keyword} expects key=value, got '{w}'")));
                    };
                    pairs.push((k.to_string(), v.to_string()));
                }
                pairs
            };
            if keyword == "ENV" {
                if let Some((k, _)) = pairs.iter().find(|(k, _)| !valid_var(k)) {
                    return Err(err(line, format!("invalid variable name '{k}'")));
                }
                Ok(Op::Env(pairs))
            } else {
                Ok(Op::Label(pairs))
            }
        }
        "ARG" => {
            needs_args()?;
            let words = split_words(rest).map_err(|m| err(line, m))?;
            let [word] = words.as_slice() else {
                return Err(err(line, "ARG takes one name[=default]"));
            };
            let (name, default) = match word.split_once('=') {
                Some((n, d)) => (n.to_string(), Some(d.to_string())),
                None => (word.clone(), None),
            };
            if !valid_var(&name) {
                return Err(err(line, format!("invalid variable name '{name}'")));
            }
            Ok(Op::Arg(name, default))
        }
        "WORKDIR" => {
            needs_args()?;
            Ok(Op::Workdir(unquote(rest)))
        }
        "USER" => {
            needs_args()?;
            Ok(Op::User(unquote(rest)))
        }
        other => Err(err(line, format!("unsupported instruction {other} (supported: {SUPPORTED})"))),
    }
}

fn run(line: usize, rest: &str, heredocs: Heredocs) -> Result<Op, ContainerfileError> {
    if let Some(flag) = rest.split_whitespace().next().filter(|w| w.starts_with("--")) {
        return Err(err(line, format!("RUN {flag} is not supported")));
    }
    let sh = |script: String| vec!["/bin/sh".to_string(), "-c".to_string(), script];
    match heredocs.as_slice() {
        [] if rest.is_empty() => Err(err(line, "RUN needs a command")),
        [] => match rest.starts_with('[').then(|| serde_json::from_str::<Vec<String>>(rest).ok()).flatten() {
            Some(argv) if argv.is_empty() => Err(err(line, "RUN [] has no command")),
            Some(argv) => Ok(Op::Run { argv, stdin: None }),
            None => Ok(Op::Run { argv: sh(rest.to_string()), stdin: None }),
        },
        [(marker, _, body)] => {
            let command = rest.replacen(marker.as_str(), "", 1);
            let command = command.trim();
            if command.is_empty() {
                Ok(Op::Run { argv: sh(body.clone()), stdin: None })
            } else {
                Ok(Op::Run { argv: sh(command.to_string()), stdin: Some(body.clone()) })
            }
        }
        _ => Err(err(line, "RUN with more than one heredoc is not supported")),
    }
}

fn copy(line: usize, add: bool, rest: &str, heredocs: Heredocs) -> Result<Op, ContainerfileError> {
    let keyword = if add { "ADD" } else { "COPY" };
    let mut words: Vec<String> = if rest.starts_with('[') {
        serde_json::from_str(rest).map_err(|e| err(line, format!("{keyword} JSON form: {e}")))?
    } else {
        split_words(rest).map_err(|m| err(line, m))?
    };
    let (mut chown, mut chmod) = (None, None);
    while words.first().is_some_and(|w| w.starts_with("--")) {
        let flag = words.remove(0);
        match flag.split_once('=') {
            Some(("--chown", v)) if !v.is_empty() => chown = Some(v.to_string()),
            Some(("--chmod", v)) if u32::from_str_radix(v, 8).is_ok() => chmod = Some(v.to_string()),
            Some(("--chmod", v)) => return Err(err(line, format!("--chmod={v} must be an octal mode"))),
            Some(("--from", _)) => {
                return Err(err(line, format!("{keyword} --from is not supported (no multi-stage builds)")));
            }
            None if flag == "--link" => {}
            _ => {
                return Err(err(line, format!("{keyword} flag {flag} is not supported (supported: --chown, --chmod)")));
            }
        }
    }
    let Some(dest) = words.pop().filter(|_| !words.is_empty()) else {
        return Err(err(line, format!("{keyword} needs at least one source and a destination")));
    };
    let mut sources = Vec::new();
    for w in words {
        // Word splitting took the quotes off `<<'EOF'` and `<<"EOF"`.
        let is_marker = |marker: &str| marker == w || marker.replace(['\'', '"'], "") == w;
        if let Some((_, name, body)) = heredocs.iter().find(|(marker, _, _)| is_marker(marker)) {
            sources.push(Source::Heredoc { name: name.clone(), body: body.clone() });
            continue;
        }
        if add && (w.contains("://") || w.starts_with("git@")) {
            return Err(err(line, format!("ADD of a URL ({w}) is not supported: RUN curl or git in a step instead")));
        }
        let archive = [".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst"];
        if add && archive.iter().any(|ext| w.ends_with(ext)) {
            return Err(err(
                line,
                format!("ADD of an archive ({w}) is not supported (no auto-extraction): COPY it and RUN tar"),
            ));
        }
        sources.push(Source::Context(w));
    }
    Ok(Op::Copy { add, sources, dest, chown, chmod })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(text: &str) -> Vec<Op> {
        parse(text).expect("parses").into_iter().map(|i| i.op).collect()
    }

    #[test]
    fn parses_the_supported_instructions() {
        let text = "# syntax comment\nFROM base AS b\nARG V=1\nENV A=1 B=\"two words\"\nENV C three words\n\
                    WORKDIR /app\nUSER nobody\nLABEL x=y\nRUN echo $A \\\n  && true\nRUN [\"ls\", \"-l\"]\n";
        let sh = |s: &str| vec!["/bin/sh".to_string(), "-c".to_string(), s.to_string()];
        assert_eq!(
            ops(text),
            vec![
                Op::From("base".into()),
                Op::Arg("V".into(), Some("1".into())),
                Op::Env(vec![("A".into(), "1".into()), ("B".into(), "two words".into())]),
                Op::Env(vec![("C".into(), "three words".into())]),
                Op::Workdir("/app".into()),
                Op::User("nobody".into()),
                Op::Label(vec![("x".into(), "y".into())]),
                Op::Run { argv: sh("echo $A    && true"), stdin: None },
                Op::Run { argv: vec!["ls".into(), "-l".into()], stdin: None },
            ]
        );
    }

    #[test]
    fn heredocs() {
        let text = "FROM b\nCOPY <<EOF /etc/app.conf\nkey=1\n  indented\nEOF\nRUN <<-END\n\techo hi\n\tEND\nRUN python3 <<PY\nprint(1)\nPY\n";
        let parsed = parse(text).expect("parses");
        assert_eq!(
            parsed[1].op,
            Op::Copy {
                add: false,
                sources: vec![Source::Heredoc { name: "EOF".into(), body: "key=1\n  indented\n".into() }],
                dest: "/etc/app.conf".into(),
                chown: None,
                chmod: None,
            }
        );
        assert_eq!(
            parsed[2].op,
            Op::Run { argv: vec!["/bin/sh".into(), "-c".into(), "echo hi\n".into()], stdin: None }
        );
        assert_eq!(parsed[3].line, 9);
        assert_eq!(
            parsed[3].op,
            Op::Run { argv: vec!["/bin/sh".into(), "-c".into(), "python3".into()], stdin: Some("print(1)\n".into()) }
        );
    }

    #[test]
    fn errors_name_the_line() {
        let e = |t: &str| parse(t).expect_err("refused").to_string();
        assert_eq!(
            e("FROM b\n\nCMD [\"x\"]\n"),
            "line 3: unsupported instruction CMD (supported: FROM, RUN, COPY, ADD, ENV, ARG, WORKDIR, USER, LABEL)"
        );
        assert_eq!(e("RUN true\n"), "line 1: FROM must be the first instruction, not RUN");
        assert_eq!(e("FROM a\nFROM b\n"), "line 2: multi-stage builds are not supported (only one FROM)");
        assert_eq!(e("FROM a\nCOPY <<EOF /x\nno end\n"), "line 2: heredoc <<EOF is not terminated by a line 'EOF'");
        assert!(e("FROM a\nADD https://x/y.tgz /\n").contains("ADD of a URL"));
        assert!(e("FROM a\nADD a.tar.gz /\n").contains("ADD of an archive"));
        assert!(e("FROM a\nCOPY --from=x a /\n").contains("--from is not supported"));
        assert!(e("FROM a\nCOPY a\n").contains("needs at least one source"));
        assert!(e("FROM a\nENV 1A=x\n").contains("invalid variable name '1A'"));
        assert_eq!(e(""), "line 1: empty Containerfile: it needs at least FROM <image>");
    }

    #[test]
    fn quoted_heredoc_markers_are_text() {
        let sh = |s: &str| Op::Run { argv: vec!["/bin/sh".into(), "-c".into(), s.into()], stdin: None };
        assert_eq!(ops("FROM b\nRUN echo \"<<EOF\" 'a<<B'\n")[1], sh("echo \"<<EOF\" 'a<<B'"));
        assert_eq!(
            ops("FROM b\nRUN [\"echo\", \"<<EOF\"]\n")[1],
            Op::Run { argv: vec!["echo".into(), "<<EOF".into()], stdin: None }
        );
        let parsed = parse("FROM b\nRUN echo \"it's\" && cat <<EOF > /f\nx\nEOF\n").expect("parses");
        let argv = vec!["/bin/sh".into(), "-c".into(), "echo \"it's\" && cat  > /f".into()];
        assert_eq!(parsed[1].op, Op::Run { argv, stdin: Some("x\n".into()) });
    }

    #[test]
    fn copy_from_quoted_heredocs() {
        let parsed = parse("FROM b\nCOPY <<'A' <<-\"B\" /d/\nx $V\nA\n\ty\n\tB\n").expect("parses");
        let Op::Copy { sources, dest, .. } = &parsed[1].op else { panic!("not a COPY: {:?}", parsed[1].op) };
        assert_eq!(dest, "/d/");
        assert_eq!(
            sources,
            &vec![
                Source::Heredoc { name: "A".into(), body: "x $V\n".into() },
                Source::Heredoc { name: "B".into(), body: "y\n".into() },
            ]
        );
    }

    #[test]
    fn continuations_skip_comments_and_empty_lines_up_to_the_end() {
        let sh = |s: &str| Op::Run { argv: vec!["/bin/sh".into(), "-c".into(), s.into()], stdin: None };
        assert_eq!(ops("FROM b\nRUN echo a \\\n# c\n"), vec![Op::From("b".into()), sh("echo a")]);
        assert_eq!(ops("FROM b\nRUN echo a \\"), vec![Op::From("b".into()), sh("echo a")]);
        let parsed = parse("FROM b\nRUN echo a \\\n\n  # c\n   && echo b\nUSER u\n").expect("parses");
        assert_eq!(parsed[1].op, sh("echo a     && echo b"));
        assert_eq!((parsed[2].line, &parsed[2].op), (6, &Op::User("u".into())));
    }
}
