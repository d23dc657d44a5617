//! Validation of every name that comes from a client before it is used
//! anywhere (VM ids, paths, /etc/hosts later): sandbox names and env keys.
use super::error::OrchestratorError;

/// Longest sandbox name; it becomes the VM id, which the contract caps at 63.
pub const MAX_NAME_LEN: usize = 48;

/// Check a sandbox name against `^[A-Za-z0-9][A-Za-z0-9._-]*$` (at most 48 characters).
pub fn validate_sandbox_name(name: &str) -> Result<(), OrchestratorError> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if first_ok && rest_ok && name.len() <= MAX_NAME_LEN {
        Ok(())
    } else {
        Err(OrchestratorError::InvalidName(name.to_string()))
    }
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

/// Check a background process id against the sandbox-name rule.
pub fn validate_process_name(name: &str) -> Result<(), OrchestratorError> {
    validate_sandbox_name(name).map_err(|_| {
        OrchestratorError::InvalidArgument(format!(
            "invalid process name '{name}' (must match ^[A-Za-z0-9][A-Za-z0-9._-]*$, at most 48 characters)"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_names() {
        for ok in ["default", "a", "my-box_1.2", "A9"] {
            assert!(validate_sandbox_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-x", ".x", "a b", "a'b", "a/b", "ü", &"x".repeat(49)] {
            assert!(validate_sandbox_name(bad).is_err(), "{bad}");
        }
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
