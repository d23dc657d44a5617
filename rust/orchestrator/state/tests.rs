//! Tests of `state`.
use super::*;
use sandbox_base::test_support::scratch_dir;

fn open(path: &std::path::Path) -> Connection {
    let (store, _) = Store::open(path).unwrap();
    drop(store);
    Connection::open(path).unwrap()
}

fn key(db: &std::path::Path) -> SealKey {
    SealKey::load_or_create(&seal::key_path(db)).unwrap()
}

#[test]
fn env_values_are_stored_sealed_and_read_back_opened() {
    let dir = scratch_dir("state-env-sealed");
    let db = dir.join("state.db");
    let mut c = open(&db);
    let key = key(&db);
    let env = BTreeMap::from([("API_TOKEN".to_string(), "tok-sealed-42".to_string())]);
    ops::put_env(&c, &key, "default", &env).unwrap();
    ops::put_env(&c, &key, "other", &env).unwrap();
    let stored: Vec<String> =
        c.prepare("SELECT value FROM env").unwrap().query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect();
    assert_eq!(stored.len(), 2);
    assert!(stored.iter().all(|v| seal::is_sealed(v) && !v.contains("tok-sealed")), "{stored:?}");
    assert_eq!(load(&mut c, &key).unwrap().env["default"], env);
    // One sandbox's value moved into another's row does not open there:
    // that sandbox's saved env is left out, the rest is read.
    c.execute("UPDATE env SET value = ?1 WHERE sandbox = 'other'", [&stored[0]]).unwrap();
    let s = load(&mut c, &key).unwrap();
    assert_eq!(s.env["default"], env);
    assert!(!s.env.contains_key("other"));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn history_keeps_the_newest_entries() {
    let dir = scratch_dir("state-history");
    let c = open(&dir.join("state.db"));
    let n = crate::audit::AUDIT_LOG_SIZE + 5;
    for i in 0..n {
        let a = AuditRecord { command: format!("c{i}"), exit_code: 0, duration_ms: 1, at: i as f64 };
        ops::add_history(&c, "default", &a).unwrap();
    }
    let mut c = c;
    let s = load(&mut c, &key(&dir.join("state.db"))).unwrap();
    let h = &s.history["default"];
    assert_eq!(h.len(), crate::audit::AUDIT_LOG_SIZE);
    assert_eq!(h.first().unwrap().command, "c5");
    assert_eq!(h.last().unwrap().command, format!("c{}", n - 1));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn imports_a_v2_file_once_and_renames_it() {
    let dir = scratch_dir("state-import");
    let json = dir.join("state.json");
    std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/state_v2.json"), &json).unwrap();
    let mut c = open(&dir.join("state.db"));
    assert_eq!(import::import(&mut c, &json).unwrap(), import::Imported::Done);
    assert!(!json.exists() && dir.join("state.json.imported").exists());
    assert_eq!(import::import(&mut c, &json).unwrap(), import::Imported::Nothing);
    let s = load(&mut c, &key(&dir.join("state.db"))).unwrap();
    let commands: Vec<&str> = s.history["default"].iter().map(|a| a.command.as_str()).collect();
    assert_eq!(commands, ["echo imported-history-one", "echo imported-history-two"]);
    assert_eq!(s.sandboxes[0].0.name, "default");
    assert!(s.sandboxes[0].0.expires_at.is_some());
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn an_unreadable_old_file_is_moved_aside_not_deleted() {
    let dir = scratch_dir("state-badjson");
    let json = dir.join("state.json");
    let mut c = open(&dir.join("state.db"));
    for text in ["{not json", r#"{"schema_version": 7}"#, r#"{"schema_version": 2, "sandboxes": 5}"#] {
        std::fs::write(&json, text).unwrap();
        let err = import::import(&mut c, &json).unwrap_err();
        let StateError::Unimportable { moved_to, .. } = &err else { panic!("{err}") };
        assert_eq!(std::fs::read_to_string(moved_to).unwrap(), text);
        assert!(!json.exists());
        assert!(err.to_string().contains("is ignored"), "{err}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}
