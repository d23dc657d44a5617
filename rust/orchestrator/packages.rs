//! Installing packages with the package manager the sandbox's image carries.
//! Package names are validated and passed as separate arguments, never pasted
//! into a shell line, so a "package" cannot smuggle in options or commands.
use std::time::Duration;

use super::{
    error::OrchestratorError,
    exec::ExecResult,
    sandbox::{Command, Sandbox, SandboxManager},
};

/// apt is slow on a cold cache; the reference's 120 s is not enough for npm-sized installs.
pub const INSTALL_TIMEOUT: Duration = Duration::from_secs(600);

/// Split and validate a package list ("a b,c").
pub fn parse_packages(packages: &str) -> Result<Vec<String>, OrchestratorError> {
    let list: Vec<String> =
        packages.split([' ', ',', '\t', '\n']).filter(|s| !s.is_empty()).map(str::to_string).collect();
    if list.is_empty() {
        return Err(OrchestratorError::InvalidArgument("packages must name at least one package".into()));
    }
    for p in &list {
        let first_ok = p.chars().next().is_some_and(|c| c.is_ascii_alphanumeric());
        let rest_ok = p.chars().all(|c| c.is_ascii_alphanumeric() || "+-.:=~_/@".contains(c));
        if !first_ok || !rest_ok {
            return Err(OrchestratorError::InvalidArgument(format!(
                "invalid package name '{p}' (letters, digits and + - . : = ~ _ / @ only, starting with a letter or digit)"
            )));
        }
    }
    Ok(list)
}

/// The script for each package manager; packages arrive as "$@".
fn script(package_manager: &str) -> Option<&'static str> {
    Some(match package_manager {
        // Refresh the package lists only when they are missing or older than
        // an hour: most installs then skip a network round trip.
        "apt" => concat!(
            "export DEBIAN_FRONTEND=noninteractive; ",
            "if [ -z \"$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mmin -60 2>/dev/null | head -n 1)\" ]; ",
            "then apt-get update -q >/dev/null || exit $?; fi; ",
            "apt-get install -y -q --no-install-recommends \"$@\""
        ),
        "apk" => "apk add \"$@\"",
        "dnf" => "dnf install -y \"$@\"",
        _ => return None,
    })
}

impl SandboxManager {
    /// Install packages; returns the package manager's result.
    pub async fn install(&self, sandbox: &Sandbox, packages: &[String]) -> Result<ExecResult, OrchestratorError> {
        let package_manager = self
            .helper
            .list_images()
            .await?
            .into_iter()
            .find(|i| i.name == sandbox.image)
            .map(|i| i.package_manager)
            .unwrap_or_default();
        let script =
            script(&package_manager).ok_or_else(|| OrchestratorError::NoPackageManager(sandbox.image.clone()))?;
        let mut argv = vec!["/bin/sh".to_string(), "-c".to_string(), script.to_string(), "install".to_string()];
        argv.extend(packages.iter().cloned());
        let mut cmd = Command::argv(argv, INSTALL_TIMEOUT);
        cmd.audit_as = Some(format!("install {}", packages.join(" ")));
        self.run_in(sandbox, cmd).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_lists() {
        assert_eq!(parse_packages("jq, curl  git").unwrap(), vec!["jq", "curl", "git"]);
        assert_eq!(parse_packages("python3=3.11.2-1").unwrap(), vec!["python3=3.11.2-1"]);
        assert!(parse_packages("").is_err());
        assert!(parse_packages("--allow-unauthenticated").is_err());
        assert!(parse_packages("jq;rm").is_err());
        assert!(parse_packages("$(id)").is_err());
    }
}
