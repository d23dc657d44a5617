//! Resolving `ProcessSpec.user` inside the VM: a name from the VM's
//! /etc/passwd (supplementary groups from /etc/group), or "uid" / "uid:gid".
//! The agent runs as root of the VM's user namespace, so it can take on any
//! id the VM maps.
use std::path::Path;

use super::AgentError;

/// Who a process runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Supplementary groups (the primary one included).
    pub groups: Vec<u32>,
    /// Login name, when the VM's passwd knows the user.
    pub name: Option<String>,
    /// Home directory ("/" for an unknown uid).
    pub home: String,
}

struct PasswdEntry {
    name: String,
    uid: u32,
    gid: u32,
    home: String,
}

/// Resolves `user` against the VM's /etc; `None` for an empty spec (root,
/// as before users existed).
pub fn resolve(user: &str) -> Result<Option<Credentials>, AgentError> {
    resolve_in(Path::new("/etc"), user)
}

fn resolve_in(etc: &Path, user: &str) -> Result<Option<Credentials>, AgentError> {
    if user.is_empty() {
        return Ok(None);
    }
    let passwd = std::fs::read_to_string(etc.join("passwd")).unwrap_or_default();
    let entries: Vec<PasswdEntry> = passwd.lines().filter_map(parse_passwd).collect();
    let (uid_part, gid_part) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    let numeric = uid_part.parse::<u32>().ok();
    let entry = match numeric {
        Some(uid) => entries.into_iter().find(|e| e.uid == uid),
        None if gid_part.is_none() => entries.into_iter().find(|e| e.name == uid_part),
        None => None,
    };
    let Some(uid) = numeric.or(entry.as_ref().map(|e| e.uid)) else {
        return Err(AgentError::Rejected(format!("no user '{user}' in VM '{}'", hostname())));
    };
    let gid = match gid_part {
        Some(g) => g.parse::<u32>().map_err(|_| {
            AgentError::Rejected(format!("user: {user:?} must be a name, \"uid\" or \"uid:gid\" with numeric ids"))
        })?,
        None => entry.as_ref().map_or(uid, |e| e.gid),
    };
    let mut groups = vec![gid];
    if let Some(e) = &entry {
        let group = std::fs::read_to_string(etc.join("group")).unwrap_or_default();
        groups.extend(member_of(&group, &e.name).into_iter().filter(|g| *g != gid));
    }
    Ok(Some(Credentials {
        uid,
        gid,
        groups,
        home: entry.as_ref().map_or_else(|| "/".to_string(), |e| e.home.clone()),
        name: entry.map(|e| e.name),
    }))
}

fn parse_passwd(line: &str) -> Option<PasswdEntry> {
    let f: Vec<&str> = line.split(':').collect();
    if f.len() < 7 || line.starts_with('#') {
        return None;
    }
    Some(PasswdEntry { name: f[0].into(), uid: f[2].parse().ok()?, gid: f[3].parse().ok()?, home: f[5].into() })
}

/// Gids of the /etc/group entries that list `name` as a member.
fn member_of(group: &str, name: &str) -> Vec<u32> {
    group
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(':').collect();
            (f.len() >= 4 && f[3].split(',').any(|m| m == name)).then(|| f[2].parse().ok()).flatten()
        })
        .collect()
}

fn hostname() -> String {
    nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake /etc per test (tests run in parallel).
    fn etc(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("smcp-agent-user-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("passwd"),
            "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n\
             dev:x:1000:1000::/home/dev:/bin/bash\n",
        )
        .unwrap();
        std::fs::write(d.join("group"), "root:x:0:\nsudo:x:27:dev\naudio:x:29:other,dev\ndev:x:1000:\n").unwrap();
        d
    }

    #[test]
    fn names_and_numbers_resolve() {
        let etc = etc("names");
        assert_eq!(resolve_in(&etc, "").unwrap(), None);
        let dev = resolve_in(&etc, "dev").unwrap().unwrap();
        assert_eq!((dev.uid, dev.gid, dev.groups.as_slice()), (1000, 1000, &[1000, 27, 29][..]));
        assert_eq!((dev.name.as_deref(), dev.home.as_str()), (Some("dev"), "/home/dev"));
        let nobody = resolve_in(&etc, "nobody").unwrap().unwrap();
        assert_eq!((nobody.uid, nobody.gid), (65534, 65534));
        let by_uid = resolve_in(&etc, "1000").unwrap().unwrap();
        assert_eq!((by_uid.uid, by_uid.gid, by_uid.name.as_deref()), (1000, 1000, Some("dev")));
        let raw = resolve_in(&etc, "4242:17").unwrap().unwrap();
        assert_eq!(
            (raw.uid, raw.gid, raw.groups.as_slice(), raw.name, raw.home.as_str()),
            (4242, 17, &[17][..], None, "/")
        );
        std::fs::remove_dir_all(etc).unwrap();
    }

    #[test]
    fn unknown_and_malformed_users_are_rejected() {
        let etc = etc("unknown");
        let err = resolve_in(&etc, "ghost").unwrap_err().to_string();
        assert!(err.starts_with("no user 'ghost' in VM '"), "{err}");
        assert!(resolve_in(&etc, "dev:staff").is_err());
        assert!(resolve_in(&etc, "ghost:1").is_err());
        std::fs::remove_dir_all(etc).unwrap();
    }
}
