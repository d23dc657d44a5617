//! The inline build context of COPY/ADD: which context files a source
//! names, where each lands, checks before a build starts, and the tar the
//! files are copied into a build VM with.
use std::collections::BTreeMap;

use super::{BuildError, State};
use crate::containerfile::{Instruction, Op, Source};

fn normalize(src: &str) -> String {
    src.trim_start_matches("./").trim_end_matches('/').to_string()
}

/// Refuse bad context paths and COPY sources missing from the context
/// before anything runs (sources naming variables are checked at their step).
pub(super) fn check_context(context: &BTreeMap<String, String>, steps: &[Instruction]) -> Result<(), BuildError> {
    if let Some(bad) = context.keys().find(|k| k.starts_with('/') || k.split('/').any(|c| c == ".." || c.is_empty())) {
        return Err(BuildError::Invalid(format!(
            "context path '{bad}' must be relative, without '..' or empty components"
        )));
    }
    for step in steps {
        let Op::Copy { sources, .. } = &step.op else { continue };
        for src in sources {
            if let Source::Context(s) = src
                && !s.contains('$')
                && context_files(context, s).is_empty()
            {
                return Err(BuildError::Invalid(missing(step.line, s, context)));
            }
        }
    }
    Ok(())
}

fn missing(line: usize, src: &str, context: &BTreeMap<String, String>) -> String {
    let names: Vec<&str> = context.keys().map(String::as_str).collect();
    format!(
        "line {line}: COPY source '{src}' is not in the build context (context files: {}); pass files with context={{\"path\": \"content\"}} or use a heredoc",
        if names.is_empty() { "none".to_string() } else { names.join(", ") }
    )
}

/// Context files a source names: (path below the source, content); a file
/// source yields one entry with an empty relative path.
fn context_files<'a>(context: &'a BTreeMap<String, String>, src: &str) -> Vec<(String, &'a str)> {
    let src = normalize(src);
    if let Some(content) = context.get(&src) {
        return vec![(String::new(), content.as_str())];
    }
    let prefix = if src.is_empty() || src == "." { String::new() } else { format!("{src}/") };
    context.iter().filter_map(|(k, v)| k.strip_prefix(&prefix).map(|rel| (rel.to_string(), v.as_str()))).collect()
}

/// Absolute destination path and content of every file a COPY writes.
pub(super) fn resolve_copy(
    state: &State,
    context: &BTreeMap<String, String>,
    sources: &[Source],
    dest: &str,
) -> Result<Vec<(String, String)>, String> {
    let dest = state.path(dest);
    let into_dir = dest.ends_with('/') || sources.len() > 1;
    let dir = dest.trim_end_matches('/');
    let mut files = Vec::new();
    for src in sources {
        match src {
            Source::Heredoc { name, body } => {
                let path = if into_dir { format!("{dir}/{name}") } else { dest.clone() };
                files.push((path, body.clone()));
            }
            Source::Context(s) => {
                let s = state.expand(s);
                let found = context_files(context, &s);
                if found.is_empty() {
                    return Err(format!("COPY source '{s}' is not in the build context"));
                }
                for (rel, content) in found {
                    let path = match (rel.is_empty(), into_dir) {
                        (true, false) => dest.clone(),
                        (true, true) => format!("{dir}/{}", normalize(&s).rsplit('/').next().unwrap_or_default()),
                        (false, _) => format!("{dir}/{rel}"),
                    };
                    files.push((path, content.to_string()));
                }
            }
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::containerfile::Source;

    #[test]
    fn copy_destinations() {
        let state = State { workdir: "/app".into(), ..State::default() };
        let ctx = BTreeMap::from([
            ("a.txt".to_string(), "A".to_string()),
            ("src/x.py".to_string(), "X".to_string()),
            ("src/lib/y.py".to_string(), "Y".to_string()),
        ]);
        let c = |s: &str| Source::Context(s.to_string());
        assert_eq!(
            resolve_copy(&state, &ctx, &[c("a.txt")], "b.txt").expect("ok"),
            vec![("/app/b.txt".into(), "A".into())]
        );
        assert_eq!(
            resolve_copy(&state, &ctx, &[c("./src/")], "/opt/").expect("ok"),
            vec![("/opt/lib/y.py".into(), "Y".into()), ("/opt/x.py".into(), "X".into())]
        );
        assert_eq!(
            resolve_copy(&state, &ctx, &[c("a.txt")], "/d/").expect("ok"),
            vec![("/d/a.txt".into(), "A".into())]
        );
        assert_eq!(resolve_copy(&state, &ctx, &[c(".")], "/all").expect("ok").len(), 3);
        assert!(resolve_copy(&state, &ctx, &[c("nope")], "/x").is_err());
    }
}
