//! Tests of `helper_client`.
use std::collections::HashMap;

use super::*;
use crate::network::EgressPolicy;

#[test]
fn driver_features_come_from_the_default_driver_or_the_flat_list() {
    let caps = pb::DriverCapabilities {
        network_egress: false,
        dial: true,
        snapshot: false,
        containers: true,
        ..Default::default()
    };
    let typed = pb::GetInfoResponse {
        driver: "vm".into(),
        drivers: vec![
            pb::DriverInfo { name: "namespaces".into(), ..Default::default() },
            pb::DriverInfo { name: "vm".into(), is_default: true, capabilities: Some(caps), ..Default::default() },
        ],
        ..Default::default()
    };
    let f = DriverFeatures::from_info(&typed);
    assert_eq!(
        f,
        DriverFeatures { name: "vm".into(), network_egress: false, dial: true, snapshot: false, containers: true }
    );
    let e = f.require(f.snapshot, "snapshotting a running sandbox").unwrap_err();
    assert_eq!(
        e.to_string(),
        "snapshotting a running sandbox is not available: the VM helper's \"vm\" driver does not support it \
         (it works with isolation = \"namespaces\")"
    );
    assert!(f.require(f.dial, "port forwarding").is_ok());
    let all = DriverFeatures::all_from_info(&typed);
    assert_eq!(all.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["namespaces", "vm"]);
    let old = pb::GetInfoResponse {
        driver: "namespaces".into(),
        capabilities: vec!["exec".into(), "network.egress".into()],
        ..Default::default()
    };
    let f = DriverFeatures::from_info(&old);
    assert!(f.network_egress && f.dial && f.snapshot && !f.containers && f.name == "namespaces", "{f:?}");
    // A helper from before drivers has only the namespace driver.
    assert_eq!(DriverFeatures::all_from_info(&old), vec![f]);
}

/// A client of a helper that answered GetInfo with `info`, whose channel
/// never connects: the gates answer before any request is sent.
fn client_of(info: &pb::GetInfoResponse) -> HelperClient {
    let channel = tonic::transport::Endpoint::try_from("http://localhost").unwrap().connect_with_connector_lazy(
        tower::service_fn(|_| async { Err::<TokioIo<UnixStream>, _>(std::io::Error::other("no helper in this test")) }),
    );
    HelperClient {
        client: VmHelperClient::new(channel),
        driver: std::sync::Arc::new(DriverFeatures::from_info(info)),
        drivers: std::sync::Arc::new(DriverFeatures::all_from_info(info)),
    }
}

#[tokio::test]
async fn snapshots_and_dials_are_gated_on_the_sandboxs_own_driver() {
    let lacking = pb::DriverCapabilities { dial: false, snapshot: false, ..Default::default() };
    let full = pb::DriverCapabilities { dial: true, snapshot: true, ..Default::default() };
    let commit = || CommitConfig { image: "snap".into(), config: None, parent: String::new(), labels: HashMap::new() };
    // Each driver in turn is the default, the other lacks dial and
    // snapshots: a sandbox on the lacking one is refused, naming it,
    // and one on the full one passes the gate (to fail only for want
    // of a helper).
    for (default_is_vm, lacking_one) in [(false, Isolation::Vm), (true, Isolation::Namespaces)] {
        let (ns, vm) = if lacking_one == Isolation::Vm { (&full, &lacking) } else { (&lacking, &full) };
        let info = pb::GetInfoResponse {
            drivers: vec![
                pb::DriverInfo {
                    name: "namespaces".into(),
                    is_default: !default_is_vm,
                    capabilities: Some(ns.clone()),
                    ..Default::default()
                },
                pb::DriverInfo {
                    name: "vm".into(),
                    is_default: default_is_vm,
                    capabilities: Some(vm.clone()),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let client = client_of(&info);
        let other = if lacking_one == Isolation::Vm { Isolation::Namespaces } else { Isolation::Vm };
        let name = lacking_one.as_str();
        let e = client.commit_vm("vm-1", lacking_one, commit()).await.unwrap_err();
        assert!(
            matches!(&e, HelperError::Unsupported { feature: "snapshotting a running sandbox", driver } if driver == name),
            "{e}"
        );
        let e = client.dial("vm-1", lacking_one, 8080).await.err().expect("dial refused");
        assert!(matches!(&e, HelperError::Unsupported { feature: "port forwarding", driver } if driver == name), "{e}");
        let e = client.commit_vm("vm-1", other, commit()).await.unwrap_err();
        assert!(!matches!(e, HelperError::Unsupported { .. }), "{e}");
        let e = client.dial("vm-1", other, 8080).await.err().expect("no helper to dial");
        assert!(!matches!(e, HelperError::Unsupported { .. }), "{e}");
    }
}

fn config(network: Network) -> VmConfig {
    VmConfig {
        id: "vm".into(),
        image: "img".into(),
        cpus: 1,
        memory_bytes: 256 << 20,
        pids: 0,
        mounts: Vec::new(),
        network,
        env: HashMap::from([("SSL_CERT_FILE".into(), "/etc/x".into())]),
        disk_bytes: 20 << 30,
        labels: HashMap::new(),
        clone_from: None,
        files: Vec::new(),
        isolation: Isolation::Namespaces,
    }
}

#[test]
fn the_spec_carries_mode_policy_disk_and_env() {
    let policy = EgressPolicy { allow: vec!["pypi.org".into()], deny: vec!["10.0.0.0/8".into()] };
    let spec = pb::VmSpec::from(config(Network::Egress(policy.clone())));
    assert_eq!(spec.network, pb::NetworkMode::Egress as i32);
    assert_eq!(spec.network_policy, Some(pb::NetworkPolicy { allow: policy.allow, deny: policy.deny }));
    assert_eq!(spec.disk_bytes, 20 << 30);
    assert_eq!(spec.env["SSL_CERT_FILE"], "/etc/x");
    assert_eq!(
        Network::from(&spec),
        Network::Egress(EgressPolicy { allow: vec!["pypi.org".into()], deny: vec!["10.0.0.0/8".into()] })
    );
    // The default policy and `none` leave the policy unset.
    let spec = pb::VmSpec::from(config(Network::default()));
    assert_eq!((spec.network, spec.network_policy), (pb::NetworkMode::Egress as i32, None));
    let spec = pb::VmSpec::from(config(Network::None));
    assert_eq!((spec.network, spec.network_policy.clone()), (pb::NetworkMode::None as i32, None));
    assert_eq!(Network::from(&spec), Network::None);
}
