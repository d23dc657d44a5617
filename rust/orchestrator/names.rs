//! Validation of every name that comes from a client before it is used
//! anywhere (VM ids, paths, /etc/hosts later): sandbox names and env keys.
//!
//! Two kinds of sandbox names never overlap. A top-level name is a plain
//! segment without `..`; a child's full name is its parent's full name, `..`
//! and the child's own segment (`default..worker`, `default..worker..sub`).
//! No top-level name contains `..`, so whatever in-sandbox code names a
//! child, the child can never take a name a user or agent uses at top level
//! (`default`, a profile's or a spawn policy's name, a destroyed sandbox's
//! preserved workspace). Both kinds are valid VM ids
//! (`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`) and valid path components, so the
//! full name is the VM id and the volume directory as before.
//!
//! Names belong to a project (see [`super::project::Project`]): what a
//! client writes is its **plain** name; the orchestrator keys a sandbox by
//! `<tag>-<plain>` (the project's 6-hex tag, see [`key`]), which is also its
//! VM id and volume directory, so two projects' `default`s never meet.
//! Sandboxes made before projects existed keep their plain name as key and
//! belong to the `legacy` project.
use super::error::OrchestratorError;

/// Hex digits of a project's tag.
pub const TAG_LEN: usize = 6;
/// The project id of sandboxes made before names belonged to projects.
pub const LEGACY_PROJECT: &str = "legacy";
/// Between a project id and a name in a qualified name (`api-3f2a1c:default`).
pub const QUALIFIER_SEPARATOR: char = ':';

/// The key of `plain` in the project tagged `tag`: `<tag>-<plain>`, or
/// `plain` itself in the legacy project (empty tag).
pub fn key(tag: &str, plain: &str) -> String {
    if tag.is_empty() { plain.to_string() } else { format!("{tag}-{plain}") }
}

/// A key's project tag (empty: legacy) and plain name.
pub fn split_key(key: &str) -> (&str, &str) {
    let bytes = key.as_bytes();
    let tagged = bytes.len() > TAG_LEN + 1
        && bytes[TAG_LEN] == b'-'
        && bytes[..TAG_LEN].iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b));
    if tagged { (&key[..TAG_LEN], &key[TAG_LEN + 1..]) } else { ("", key) }
}

/// The plain name a user knows the sandbox keyed `key` by.
pub fn plain(key: &str) -> &str {
    split_key(key).1
}

/// How the sandbox keyed `key` is shown to the session serving this task:
/// its plain name in the session's own project, else the qualified name
/// that reaches it (`<project-id>:<plain>`).
pub fn display(key: &str) -> String {
    let (tag, plain) = split_key(key);
    let own = super::config::session().map(|c| c.project.tag.clone()).unwrap_or_default();
    if tag == own {
        return plain.to_string();
    }
    format!("{}{QUALIFIER_SEPARATOR}{plain}", super::project::Project::id_of_tag(tag))
}

/// Longest top-level sandbox name (and child segment).
pub const MAX_NAME_LEN: usize = 48;
/// Longest full name of a child: the contract's VM id limit.
pub const MAX_FULL_NAME_LEN: usize = 63;
/// Between a parent's full name and a child's segment.
pub const CHILD_SEPARATOR: &str = "..";
/// Segments in the deepest full name: root, child, grandchild.
const MAX_SEGMENTS: usize = 3;

/// `^[A-Za-z0-9][A-Za-z0-9._-]*$`, at most 48 characters.
fn is_plain_name(s: &str) -> bool {
    let mut chars = s.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    first_ok && rest_ok && s.len() <= MAX_NAME_LEN
}

/// A plain name without `..`: a top-level sandbox name or a child's segment.
fn is_segment(s: &str) -> bool {
    is_plain_name(s) && !s.contains(CHILD_SEPARATOR)
}

fn invalid_name(name: &str) -> OrchestratorError {
    OrchestratorError::InvalidName(name.to_string())
}

/// A name a user or agent may create at top level (and a profile's or spawn
/// policy's name): one segment, `^[A-Za-z0-9][A-Za-z0-9._-]*$` without `..`,
/// at most 48 characters.
pub fn validate_top_level_name(name: &str) -> Result<(), OrchestratorError> {
    if is_segment(name) { Ok(()) } else { Err(invalid_name(name)) }
}

/// Split a child's full name into its parent's full name and its own
/// segment; `None` for a top-level name. The separator is the last `..`: a
/// segment starts with a letter or digit and holds no `..`.
pub fn split_child_name(name: &str) -> Option<(&str, &str)> {
    let at = name.rfind(CHILD_SEPARATOR)?;
    Some((&name[..at], &name[at + CHILD_SEPARATOR.len()..]))
}

/// Whether `name` has the form of a child's full name.
pub fn is_child_name(name: &str) -> bool {
    name.contains(CHILD_SEPARATOR)
}

/// The top-level sandbox `name` belongs to (itself when top-level).
pub fn root_of_name(name: &str) -> &str {
    name.split(CHILD_SEPARATOR).next().unwrap_or(name)
}

/// Check any sandbox name a tool may be given: a top-level name, or a
/// child's full name (at most two levels below its root, 63 characters).
pub fn validate_sandbox_name(name: &str) -> Result<(), OrchestratorError> {
    let mut rest = name;
    for _ in 0..MAX_SEGMENTS {
        match split_child_name(rest) {
            None => {
                return if is_segment(rest) && name.len() <= MAX_FULL_NAME_LEN {
                    Ok(())
                } else {
                    Err(invalid_name(name))
                };
            }
            Some((parent, segment)) if is_segment(segment) => rest = parent,
            Some(_) => break,
        }
    }
    Err(invalid_name(name))
}

/// Check a key (see [`key`]): its plain name is a valid sandbox name and the
/// whole key a valid VM id.
pub fn validate_key(key: &str) -> Result<(), OrchestratorError> {
    validate_sandbox_name(plain(key))?;
    if key.len() > MAX_FULL_NAME_LEN {
        return Err(invalid_name(plain(key)));
    }
    Ok(())
}

/// Check the key of a top-level sandbox.
pub fn validate_top_level_key(key: &str) -> Result<(), OrchestratorError> {
    validate_top_level_name(plain(key))
}

/// Why a child's segment cannot be used under a parent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChildNameError {
    /// The segment breaks the name rule.
    #[error("Invalid child name: {0}")]
    Invalid(String),
    /// The full name would be longer than a VM id may be (with its
    /// project's tag, see [`key`]).
    #[error(
        "Child name '{0}' is too long: its full name '{full}' has {len} characters, at most {max} (63 less the \
         project's tag)",
        full = plain(.1),
        len = plain(.1).len(),
        max = MAX_FULL_NAME_LEN - TAG_LEN - 1
    )]
    TooLong(String, String, usize),
}

/// The full name of `parent`'s child `segment`: `<parent>..<segment>`.
pub fn child_name(parent: &str, segment: &str) -> Result<String, ChildNameError> {
    if !is_segment(segment) {
        return Err(ChildNameError::Invalid(segment.to_string()));
    }
    let full = format!("{parent}{CHILD_SEPARATOR}{segment}");
    if full.len() > MAX_FULL_NAME_LEN {
        let len = full.len();
        return Err(ChildNameError::TooLong(segment.to_string(), full, len));
    }
    Ok(full)
}

/// Whether `name` is the full name of a direct child of `parent`.
pub fn is_child_of(name: &str, parent: &str) -> bool {
    split_child_name(name).is_some_and(|(p, segment)| p == parent && is_segment(segment))
}

/// The hostname a sandbox sees: its name with `_` (valid in names, never in
/// hostnames: RFC 1123) turned into `-`, so every valid name can boot.
pub fn hostname(name: &str) -> String {
    name.replace('_', "-")
}

/// Check an environment variable name against `^[A-Za-z_][A-Za-z0-9_]*$`.
pub fn validate_env_key(key: &str) -> Result<(), OrchestratorError> {
    let mut chars = key.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if first_ok && chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        Ok(())
    } else {
        Err(OrchestratorError::InvalidEnvKey(key.to_string()))
    }
}

/// `n` random lowercase hex digits for generated ids (`bg-…`, `sync-…`).
pub fn random_hex(n: usize) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut out = String::with_capacity(n);
    while out.len() < n {
        // RandomState is seeded from the OS per instance; mixing in the time
        // keeps ids distinct even if two states were seeded alike.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0),
        );
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out.truncate(n);
    out
}

/// Check a background process id against the plain-name rule.
pub fn validate_process_name(name: &str) -> Result<(), OrchestratorError> {
    if is_plain_name(name) {
        Ok(())
    } else {
        Err(OrchestratorError::InvalidArgument(format!(
            "invalid process name '{name}' (must match ^[A-Za-z0-9][A-Za-z0-9._-]*$, at most 48 characters)"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostnames_have_no_underscores() {
        assert_eq!(hostname("my_box_1"), "my-box-1");
        assert_eq!(hostname("default..kid"), "default..kid");
    }

    #[test]
    fn sandbox_names() {
        for ok in ["default", "a", "my-box_1.2", "A9", "x."] {
            assert!(validate_top_level_name(ok).is_ok(), "{ok}");
            assert!(validate_sandbox_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-x", ".x", "a b", "a'b", "a/b", "ü", &"x".repeat(49), "a..b", "a..", "..a"] {
            assert!(validate_top_level_name(bad).is_err(), "{bad}");
        }
        for ok in ["default..kid", "default..kid..sub", "x...y", "a..b...c", "Default..Kid"] {
            assert!(validate_sandbox_name(ok).is_ok(), "{ok}");
            assert!(validate_top_level_name(ok).is_err(), "{ok}");
        }
        let long = format!("{}..{}", "p".repeat(48), "c".repeat(14));
        for bad in ["a..b..c..d", "a..", "..a", "a...", "a..-b", "a..b c", &long] {
            assert!(validate_sandbox_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn child_names_live_in_their_parents_namespace() {
        assert_eq!(child_name("default", "kid").unwrap(), "default..kid");
        assert_eq!(child_name("default..kid", "sub").unwrap(), "default..kid..sub");
        assert_eq!(child_name("x.", "y").unwrap(), "x...y");
        assert_eq!(split_child_name("x...y"), Some(("x.", "y")));
        assert_eq!(split_child_name("a..b...c"), Some(("a..b.", "c")));
        assert_eq!(split_child_name("default"), None);
        assert_eq!(root_of_name("default..kid..sub"), "default");
        assert!(is_child_of("default..kid", "default"));
        assert!(!is_child_of("default..kid..sub", "default"));
        assert!(!is_child_of("defaultx..kid", "default"));
        for bad in ["", ".x", "a..b", "a b", &"x".repeat(49)] {
            assert_eq!(child_name("p", bad), Err(ChildNameError::Invalid(bad.to_string())), "{bad}");
        }
        assert!(matches!(child_name(&"p".repeat(48), "c".repeat(13).as_str()), Ok(n) if n.len() == 63));
        assert!(matches!(child_name(&"p".repeat(48), &"c".repeat(14)), Err(ChildNameError::TooLong(..))));
        // Every full name a child can get is a valid sandbox name and never a top-level one.
        for (parent, seg) in [("default", "default"), ("a", "B"), ("x.", "y.")] {
            let full = child_name(parent, seg).unwrap();
            assert!(validate_sandbox_name(&full).is_ok() && validate_top_level_name(&full).is_err(), "{full}");
        }
    }

    #[test]
    fn keys_carry_the_project_tag() {
        assert_eq!(key("3f2a1c", "default"), "3f2a1c-default");
        assert_eq!(key("", "default"), "default");
        assert_eq!(split_key("3f2a1c-default..kid"), ("3f2a1c", "default..kid"));
        assert_eq!(plain("3f2a1c-default..kid"), "default..kid");
        // A legacy name that is not a tag and a dash stays whole.
        for legacy in ["default", "3F2A1C-x", "3f2a1-x", "3f2a1c-", "3f2a1cx-y", "3f2a1g-x"] {
            assert_eq!(split_key(legacy), ("", legacy), "{legacy}");
        }
        // Every valid top-level name keeps a valid VM id as a key.
        let long = "x".repeat(MAX_NAME_LEN);
        assert!(validate_top_level_key(&key("3f2a1c", &long)).is_ok());
        assert!(validate_key(&key("3f2a1c", "a..b")).is_ok());
        assert!(validate_top_level_key(&key("3f2a1c", "a..b")).is_err());
        assert!(validate_key(&key("3f2a1c", &format!("{long}..{}", "c".repeat(14)))).is_err());
    }

    #[test]
    fn env_keys() {
        for ok in ["FOO", "_x", "a1"] {
            assert!(validate_env_key(ok).is_ok(), "{ok}");
        }
        for bad in ["", "1A", "A-B", "A B", "A=B"] {
            assert!(validate_env_key(bad).is_err(), "{bad}");
        }
    }
}
