//! Deciding when a command line needs a shell at all. Like GNU make, a line
//! made only of plain words (no quoting, expansion, redirection, globbing,
//! operators or assignments) whose first word is not a shell builtin or
//! keyword runs as a direct argv: the same result, one process fewer to start
//! (bash alone costs about half a millisecond). Anything else, and any direct
//! spawn the sandbox refuses (e.g. the program does not exist), goes through
//! `<shell> -c` so errors read exactly as a shell prints them.

/// Builtins and keywords whose meaning differs from (or does not exist as) a
/// program of the same name. `echo`, `printf`, `test`, `[`, `true`, `false`
/// and `pwd` behave the same as their coreutils programs and are not listed.
const SHELL_WORDS: &[&str] = &[
    "!",
    "{",
    "}",
    ".",
    ":",
    "alias",
    "bg",
    "bind",
    "break",
    "builtin",
    "caller",
    "case",
    "cd",
    "command",
    "compgen",
    "complete",
    "compopt",
    "continue",
    "coproc",
    "declare",
    "dirs",
    "disown",
    "do",
    "done",
    "elif",
    "else",
    "enable",
    "esac",
    "eval",
    "exec",
    "exit",
    "export",
    "fc",
    "fg",
    "fi",
    "for",
    "function",
    "getopts",
    "hash",
    "help",
    "history",
    "if",
    "in",
    "jobs",
    "kill",
    "let",
    "local",
    "logout",
    "mapfile",
    "popd",
    "pushd",
    "read",
    "readarray",
    "readonly",
    "return",
    "select",
    "set",
    "shift",
    "shopt",
    "source",
    "suspend",
    "then",
    "time",
    "times",
    "trap",
    "type",
    "typeset",
    "ulimit",
    "umask",
    "unalias",
    "unset",
    "until",
    "wait",
    "while",
];

/// The argv of `line` if it can run without a shell.
pub fn direct_argv(line: &str) -> Option<Vec<String>> {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./,:=+@%^".contains(c);
    if !line.chars().all(|c| plain(c) || c == ' ' || c == '\t') {
        return None;
    }
    let words: Vec<String> = line.split([' ', '\t']).filter(|w| !w.is_empty()).map(str::to_string).collect();
    let first = words.first()?;
    if first.contains('=') || SHELL_WORDS.contains(&first.as_str()) {
        return None;
    }
    Some(words)
}

/// Longest command line a sandbox can run: it goes to the shell as one
/// argument of `<shell> -c`, and Linux refuses any single argument of 128 KiB
/// or more (MAX_ARG_STRLEN, counting its terminating NUL).
pub const MAX_COMMAND_BYTES: usize = 128 * 1024 - 1;

/// Refuses a command line longer than [`MAX_COMMAND_BYTES`], naming the
/// limit and what to do instead.
pub fn check_length(line: &str) -> Result<(), crate::error::OrchestratorError> {
    if line.len() <= MAX_COMMAND_BYTES {
        return Ok(());
    }
    Err(crate::error::OrchestratorError::InvalidArgument(format!(
        "command is {} bytes; a command may be at most {MAX_COMMAND_BYTES} bytes (Linux's limit on one \
         argument). Write a longer script to a file with write_file and run that file",
        line.len()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_over_the_argument_limit_are_refused_naming_it() {
        assert!(check_length(&"a".repeat(MAX_COMMAND_BYTES)).is_ok());
        let err = check_length(&"a".repeat(MAX_COMMAND_BYTES + 1)).unwrap_err().to_string();
        assert!(err.contains("command is 131072 bytes") && err.contains("at most 131071 bytes"), "{err}");
    }

    #[test]
    fn plain_lines_run_directly() {
        assert_eq!(direct_argv("echo hi").unwrap(), vec!["echo", "hi"]);
        assert_eq!(direct_argv("  ls -la /tmp ").unwrap(), vec!["ls", "-la", "/tmp"]);
        assert_eq!(direct_argv("pip install x==1.0").unwrap(), vec!["pip", "install", "x==1.0"]);
    }

    #[test]
    fn anything_shell_needs_a_shell() {
        for line in [
            "",
            "   ",
            "echo $HOME",
            "echo 'a b'",
            "echo \"x\"",
            "ls *.py",
            "cat < f",
            "a | b",
            "a && b",
            "a; b",
            "echo a # c",
            "FOO=1 env",
            "cd /tmp",
            "export A=1",
            "exit 3",
            "source x",
            "time ls",
            "kill 1",
            "echo ~",
            "echo a\nb",
            "echo \\n",
            "(ls)",
            "ls &",
            "echo {a,b}",
            "echo !x",
            "echo `id`",
        ] {
            assert!(direct_argv(line).is_none(), "{line:?}");
        }
    }
}
