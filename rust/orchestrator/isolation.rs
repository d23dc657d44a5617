//! How a sandbox is isolated from the host: `isolation = "namespaces" |
//! "vm"` in the user config (its default, `[defaults]`, `[profiles.*]`), in
//! `.sandbox-mcp.toml` and in `spawn`. Each value is the name of the helper
//! driver that runs the sandbox (GetInfo's `DriverInfo.name`).
use std::fmt;

/// Which helper driver runs a sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Isolation {
    /// Linux namespaces, cgroups and seccomp around the host's kernel: fast,
    /// but a kernel exploit reaches the host.
    #[default]
    Namespaces,
    /// A microVM with its own kernel: a kernel exploit stays in the guest;
    /// slower to start.
    Vm,
}

/// The values an `isolation` setting takes, for error messages.
pub const ALLOWED: &str = "\"namespaces\" or \"vm\"";

impl Isolation {
    /// Its name in settings, in status, and as the helper's driver name.
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Namespaces => "namespaces",
            Isolation::Vm => "vm",
        }
    }

    /// A setting's value; the error says what is allowed.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "namespaces" => Ok(Isolation::Namespaces),
            "vm" => Ok(Isolation::Vm),
            other => Err(format!("must be {ALLOWED}, not {other:?}")),
        }
    }

    /// A TOML value of an `isolation` key.
    pub fn from_toml(value: &toml::Value) -> Result<Self, String> {
        match value.as_str() {
            Some(s) => Self::parse(s),
            None => Err(format!("expected {ALLOWED}, not {value}")),
        }
    }

    /// The isolation a helper reports for a VM by its driver name (a helper
    /// that reports none runs everything on namespaces).
    pub fn from_driver(driver: &str) -> Option<Self> {
        if driver.is_empty() { Some(Isolation::Namespaces) } else { Self::parse(driver).ok() }
    }
}

impl fmt::Display for Isolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_values_and_names_them_when_wrong() {
        assert_eq!(Isolation::parse("vm"), Ok(Isolation::Vm));
        assert_eq!(Isolation::parse("namespaces"), Ok(Isolation::Namespaces));
        let e = Isolation::parse("gvisor").unwrap_err();
        assert!(e.contains("\"namespaces\" or \"vm\"") && e.contains("gvisor"), "{e}");
        let e = Isolation::from_toml(&toml::Value::Integer(1)).unwrap_err();
        assert!(e.contains("\"namespaces\" or \"vm\""), "{e}");
        assert_eq!(Isolation::from_driver(""), Some(Isolation::Namespaces));
        assert_eq!(Isolation::from_driver("vz"), None);
    }
}
