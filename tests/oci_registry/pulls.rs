//! Pulls from a plain-HTTP loopback registry: by tag and by digest with
//! nothing fetched twice, Docker schema 2 media types, an index resolved to
//! this host's platform, concurrent pulls, a tampered blob, a missing tag,
//! basic auth, mirrors, and a cancelled pull.
use super::*;

#[tokio::test]
async fn pulls_by_tag_and_digest_and_fetches_nothing_twice() {
    if !tools() {
        return;
    }
    let reg = Registry::start(None);
    let (dir, image) = layout("plain", true);
    push(&format!("oci:{}:v1", dir.path().display()), &format!("{}/test/img:v1", reg.host()), &[]);
    let t = TempDir::new("store");
    let store = BlobStore::new(t.path().join("blobs"));
    let cfg = RegistryConfig::default();
    let cancel = CancellationToken::new();
    let tagged = format!("{}/test/img:v1", reg.host());

    let (got, events) = pull_collect(&tagged, &cfg, &store, &cancel).await;
    let got = got.unwrap();
    check_image(&got, &image, "plain");
    assert_eq!(got.manifest_digest, image.manifest, "skopeo kept the manifest as written");
    assert_eq!(got.source, format!("{tagged}@{}", image.manifest));
    assert_eq!((count(&events, LayerState::Done), count(&events, LayerState::Present)), (3, 0));
    assert!(events.iter().all(|e| e.layers == 3 && e.done <= e.total));
    let mut want: BTreeSet<String> = image.layers.iter().map(|l| l.0.clone()).collect();
    want.insert(image.manifest.clone());
    want.insert(image.config.clone());
    assert_eq!(stored(&store), want);
    for digest in &want {
        assert_eq!(&sha256_of(&store.read(digest).unwrap()), digest);
    }

    let (again, events) = pull_collect(&tagged, &cfg, &store, &cancel).await;
    assert_eq!(again.unwrap(), got);
    assert_eq!((count(&events, LayerState::Done), count(&events, LayerState::Present)), (0, 3));

    let t2 = TempDir::new("store");
    let store2 = BlobStore::new(t2.path().join("blobs"));
    let pinned = format!("{}/test/img@{}", reg.host(), image.manifest);
    let (by_digest, events) = pull_collect(&pinned, &cfg, &store2, &cancel).await;
    let by_digest = by_digest.unwrap();
    check_image(&by_digest, &image, "plain");
    assert_eq!(by_digest.manifest_digest, image.manifest);
    assert_eq!(count(&events, LayerState::Done), 3);
    assert_eq!(stored(&store2), want);
    let both = format!("{}/test/img:v1@{}", reg.host(), image.manifest);
    assert_eq!(pull_collect(&both, &cfg, &store2, &cancel).await.0.unwrap().manifest_digest, image.manifest);
    let wrong = format!("{}/test/img@{}", reg.host(), image.config);
    let (err, _) = pull_collect(&wrong, &cfg, &BlobStore::new(t2.path().join("other")), &cancel).await;
    assert!(err.is_err(), "a digest that names no manifest");
}

#[tokio::test]
async fn docker_schema_2_images_pull_with_docker_media_types() {
    if !tools() {
        return;
    }
    let reg = Registry::start(None);
    let (dir, image) = layout("docker", false);
    push(&format!("oci:{}:v1", dir.path().display()), &format!("{}/test/docker:v1", reg.host()), &["--format", "v2s2"]);
    let t = TempDir::new("store");
    let store = BlobStore::new(t.path().join("blobs"));
    let (got, _) = pull_collect(
        &format!("{}/test/docker:v1", reg.host()),
        &RegistryConfig::default(),
        &store,
        &CancellationToken::new(),
    )
    .await;
    let got = got.unwrap();
    let manifest: serde_json::Value = serde_json::from_slice(&store.read(&got.manifest_digest).unwrap()).unwrap();
    assert_eq!(manifest["mediaType"], media::DOCKER_MANIFEST);
    let digests: Vec<_> = got.layers.iter().map(|l| (l.digest.clone(), l.diff_id.clone())).collect();
    let want: Vec<_> = image.layers.iter().map(|l| (l.0.clone(), l.2.clone())).collect();
    assert_eq!(digests, want);
    assert!(got.layers.iter().all(|l| l.media_type == "application/vnd.docker.image.rootfs.diff.tar.gzip"));
    assert_eq!(got.run.env["IMAGE"], "docker");
}

#[tokio::test]
async fn an_index_resolves_to_this_hosts_platform_or_says_what_it_has() {
    if !tools() {
        return;
    }
    let reg = Registry::start(None);
    let other = if goarch() == "s390x" { "ppc64le" } else { "s390x" };
    let dir = TempDir::new("layout");
    let (mine, image) = write_image(dir.path(), goarch(), "mine", true);
    let (theirs, _) = write_image(dir.path(), other, "theirs", false);
    let index = json!({"schemaVersion": 2, "mediaType": media::OCI_INDEX, "manifests": [theirs, mine]});
    let index_desc = put_blob(dir.path(), media::OCI_INDEX, index.to_string().as_bytes());
    write_layout_index(dir.path(), "v1", index_desc.clone());
    push(&format!("oci:{}:v1", dir.path().display()), &format!("{}/test/multi:v1", reg.host()), &["--all"]);

    let t = TempDir::new("store");
    let store = BlobStore::new(t.path().join("blobs"));
    let cancel = CancellationToken::new();
    let (got, _) =
        pull_collect(&format!("{}/test/multi:v1", reg.host()), &RegistryConfig::default(), &store, &cancel).await;
    let got = got.unwrap();
    check_image(&got, &image, "mine");
    assert_eq!(got.manifest_digest, image.manifest);
    let index_digest = index_desc["digest"].as_str().unwrap();
    assert!(got.source.ends_with(index_digest), "{}", got.source);
    assert!(store.contains(index_digest), "the index is stored too");

    let (only_other, _) = write_image(dir.path(), other, "only", false);
    let index = json!({"schemaVersion": 2, "mediaType": media::OCI_INDEX, "manifests": [only_other]});
    write_layout_index(dir.path(), "v2", put_blob(dir.path(), media::OCI_INDEX, index.to_string().as_bytes()));
    push(&format!("oci:{}:v2", dir.path().display()), &format!("{}/test/multi:v2", reg.host()), &["--all"]);
    let (err, _) =
        pull_collect(&format!("{}/test/multi:v2", reg.host()), &RegistryConfig::default(), &store, &cancel).await;
    match err {
        Err(OciError::NoPlatform { platform, available, .. }) => {
            assert!(platform.starts_with(&format!("linux/{}", goarch())), "{platform}");
            assert_eq!(available, format!("linux/{other}"));
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn concurrent_pulls_store_each_blob_once() {
    if !tools() {
        return;
    }
    let reg = Registry::start(None);
    let (dir, image) = layout("both", true);
    push(&format!("oci:{}:v1", dir.path().display()), &format!("{}/test/img:v1", reg.host()), &[]);
    let t = TempDir::new("store");
    let store = BlobStore::new(t.path().join("blobs"));
    let cfg = RegistryConfig::default();
    let cancel = CancellationToken::new();
    let reference = format!("{}/test/img:v1", reg.host());
    let ((a, ea), (b, eb)) =
        tokio::join!(pull_collect(&reference, &cfg, &store, &cancel), pull_collect(&reference, &cfg, &store, &cancel));
    assert_eq!(a.unwrap(), b.unwrap());
    let events: Vec<_> = ea.into_iter().chain(eb).collect();
    assert_eq!(count(&events, LayerState::Done), 3, "each layer fetched once: {events:?}");
    assert_eq!(count(&events, LayerState::Present), 3);
    let mut want: BTreeSet<String> = image.layers.iter().map(|l| l.0.clone()).collect();
    want.extend([image.manifest, image.config]);
    assert_eq!(stored(&store), want);
}

#[tokio::test]
async fn a_tampered_blob_is_refused_and_not_kept() {
    if !tools() {
        return;
    }
    let reg = Registry::start(None);
    let (dir, image) = layout("tamper", true);
    push(&format!("oci:{}:v1", dir.path().display()), &format!("{}/test/img:v1", reg.host()), &[]);
    let victim = &image.layers[1].0;
    let data = reg.blob_data(victim);
    let mut bytes = std::fs::read(&data).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&data, bytes).unwrap();

    let t = TempDir::new("store");
    let store = BlobStore::new(t.path().join("blobs"));
    let (got, _) = pull_collect(
        &format!("{}/test/img:v1", reg.host()),
        &RegistryConfig::default(),
        &store,
        &CancellationToken::new(),
    )
    .await;
    match got {
        Err(OciError::DigestMismatch { expected, .. }) => assert_eq!(&expected, victim),
        other => panic!("{other:?}"),
    }
    assert!(!store.contains(victim));
    assert!(!stored(&store).contains(victim));
}

#[tokio::test]
async fn a_missing_tag_says_so() {
    if !tools() {
        return;
    }
    let reg = Registry::start(None);
    let (dir, _) = layout("missing", false);
    push(&format!("oci:{}:v1", dir.path().display()), &format!("{}/test/img:v1", reg.host()), &[]);
    let t = TempDir::new("store");
    let store = BlobStore::new(t.path().join("blobs"));
    let reference = format!("{}/test/img:nope", reg.host());
    let (got, _) = pull_collect(&reference, &RegistryConfig::default(), &store, &CancellationToken::new()).await;
    match got {
        Err(e @ OciError::Registry { .. }) => {
            let text = e.to_string();
            assert!(text.contains(&format!("{reference} not found")), "{text}");
        }
        other => panic!("{other:?}"),
    }
    assert!(stored(&store).is_empty());
}

#[tokio::test]
async fn basic_auth_with_credentials_from_the_auth_file() {
    if !tools() {
        return;
    }
    let (user, password) = ("tester", "s3cret-pw");
    let hash = bcrypt::hash(password, 4).unwrap();
    let reg = Registry::start(Some(&format!("{user}:{hash}\n")));
    let (dir, image) = layout("auth", false);
    let creds = format!("--dest-creds={user}:{password}");
    push(&format!("oci:{}:v1", dir.path().display()), &format!("{}/test/img:v1", reg.host()), &[&creds]);
    let t = TempDir::new("store");
    let store = BlobStore::new(t.path().join("blobs"));
    let cfg = RegistryConfig::default();
    let cancel = CancellationToken::new();
    let reference = format!("{}/test/img:v1", reg.host());

    let auth_file = t.path().join("auth.json");
    let write_auth = |pw: &str| {
        let auth = base64_encode(&format!("{user}:{pw}"));
        let json = json!({"auths": {reg.host(): {"auth": auth}}});
        std::fs::write(&auth_file, json.to_string()).unwrap();
    };
    let mut env = EnvGuard::lock().await;
    env.set("REGISTRY_AUTH_FILE", Some(auth_file.as_os_str()));

    write_auth("wrong");
    match pull_collect(&reference, &cfg, &store, &cancel).await.0 {
        Err(e @ OciError::Unauthorized { .. }) => assert!(!e.to_string().contains(password)),
        other => panic!("{other:?}"),
    }
    std::fs::remove_file(&auth_file).unwrap();
    assert!(matches!(pull_collect(&reference, &cfg, &store, &cancel).await.0, Err(OciError::Unauthorized { .. })));
    write_auth(password);
    let got = pull_collect(&reference, &cfg, &store, &cancel).await.0.unwrap();
    check_image(&got, &image, "auth");
}

#[tokio::test]
async fn mirrors_are_tried_first_and_plain_http_elsewhere_is_refused() {
    if !tools() {
        return;
    }
    // The registry named in the reference lacks the image; the first mirror
    // is down, the second has it.
    let named = Registry::start(None);
    let mirror = Registry::start(None);
    let (dir, image) = layout("mirror", false);
    push(&format!("oci:{}:v1", dir.path().display()), &format!("{}/test/img:v1", mirror.host()), &[]);
    let down = format!("127.0.0.1:{}", free_port());
    let t = TempDir::new("store");
    let store = BlobStore::new(t.path().join("blobs"));
    let cancel = CancellationToken::new();
    let reference = format!("{}/test/img:v1", named.host());
    let mut cfg = RegistryConfig::default();
    cfg.mirrors.insert(named.host(), vec![down.clone(), format!("http://{}", mirror.host())]);
    let got = pull_collect(&reference, &cfg, &store, &cancel).await.0.unwrap();
    check_image(&got, &image, "mirror");
    cfg.mirrors.clear();
    let t2 = TempDir::new("store");
    let (err, _) = pull_collect(&reference, &cfg, &BlobStore::new(t2.path().join("blobs")), &cancel).await;
    assert!(matches!(err, Err(OciError::Registry { .. })), "{err:?}");

    // Plain HTTP to a name that is not loopback is refused before anything
    // is sent (the name could never be resolved anyway).
    cfg.mirrors.insert(named.host(), vec!["http://registry.invalid:5000".to_string()]);
    match pull_collect(&reference, &cfg, &store, &cancel).await.0 {
        Err(e @ OciError::Registry { .. }) => assert!(e.to_string().contains("plain HTTP is refused"), "{e}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_cancelled_pull_keeps_no_partial_blob() {
    if !tools() {
        return;
    }
    let reg = Registry::start(None);
    let (dir, image) = layout("cancel", true);
    push(&format!("oci:{}:v1", dir.path().display()), &format!("{}/test/img:v1", reg.host()), &[]);
    let t = TempDir::new("store");
    let store = BlobStore::new(t.path().join("blobs"));
    let cancel = CancellationToken::new();
    let report = |p: PullProgress| {
        if p.state == LayerState::Downloading && p.layer == 1 {
            cancel.cancel();
        }
    };
    let reference = Reference::parse(&format!("{}/test/img:v1", reg.host())).unwrap();
    let got = pull(&reference, &RegistryConfig::default(), &store, &report, &cancel).await;
    assert!(matches!(got, Err(OciError::Cancelled)), "{got:?}");
    let kept = stored(&store);
    assert!(kept.contains(&image.layers[0].0));
    assert!(!kept.contains(&image.layers[1].0) && !kept.contains(&image.layers[2].0));

    let (before, _) = pull_collect(&reference.to_string(), &RegistryConfig::default(), &store, &cancel).await;
    assert!(matches!(before, Err(OciError::Cancelled)), "a cancelled token stops a pull before it starts");
    assert_eq!(stored(&store), kept);
}
