//! Reading a manifest directory once: what loads, what is reported, with which file and line.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

mod common;

use common::{ScratchDir, service};
use kproxy_source::{ManifestError, load};
use kproxy_state::{Change, Kind, Object, ObjectKey};

fn errors_of(errors: &[ManifestError]) -> Vec<(String, Option<usize>, String)> {
    errors
        .iter()
        .map(|e| (e.file.file_name().unwrap().to_string_lossy().into_owned(), e.line, e.message.clone()))
        .collect()
}

fn svc<'a>(snapshot: &'a kproxy_source::Snapshot, ns: &str, name: &str) -> &'a kproxy_state::ServiceObject {
    match snapshot.get(Kind::Service, &ObjectKey::new(ns, name)) {
        Some(Object::Service(s)) => s,
        other => panic!("no service {ns}/{name}: {other:?}"),
    }
}

#[test]
fn multi_document_files_load_every_kind() {
    let dir = ScratchDir::new("multidoc");
    dir.write(
        "all.yaml",
        r#"# a comment before the first document
apiVersion: v1
kind: Node
metadata:
  name: node-a
  namespace: ignored-for-cluster-scoped
---
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata:
  name: v4
spec:
  cidrs: ["198.18.128.0/20"]
---
apiVersion: networking.k8s.io/v1beta1
kind: ServiceCIDR
metadata:
  name: v6
spec:
  cidrs: ["fd00:96::/112"]
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: shop
spec:
  clusterIP: 198.18.128.10
  trafficHint: LongLived
  ports:
  - port: 80
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
endpoints:
- addresses: ["198.18.16.5"]
ports:
- port: 8080
---
"#,
    );
    let snapshot = load(dir.path()).unwrap();
    assert!(snapshot.errors().is_empty(), "{:?}", snapshot.errors());
    assert_eq!(snapshot.len(), 5);
    assert!(snapshot.get(Kind::Node, &ObjectKey::cluster("node-a")).is_some(), "namespace dropped on a Node");
    assert!(snapshot.get(Kind::ServiceCidr, &ObjectKey::cluster("v6")).is_some());
    let web = svc(&snapshot, "shop", "web");
    assert_eq!(web.traffic_hint.as_deref(), Some("LongLived"));
    assert!(
        snapshot.get(Kind::EndpointSlice, &ObjectKey::new("default", "web-1")).is_some(),
        "a namespaced object without namespace lands in default"
    );
    let origin = snapshot.origin(Kind::Service, &ObjectKey::new("shop", "web")).unwrap();
    assert_eq!((origin.file.file_name().unwrap().to_str().unwrap(), origin.line), ("all.yaml", 22));
}

#[test]
fn initial_changes_apply_then_sync_every_kind_in_order() {
    let dir = ScratchDir::new("initial");
    dir.write("svc.yaml", &service("a", "198.18.128.1", 80));
    dir.write("svc-b.yaml", &service("b", "198.18.128.2", 80));
    let snapshot = load(dir.path()).unwrap();
    let changes: Vec<Change> = snapshot.initial_changes().collect();
    let events: Vec<(Kind, String)> = changes
        .iter()
        .map(|c| match c {
            Change::Applied(object) => (object.kind(), object.key().to_string()),
            Change::Synced(kind) => (*kind, "synced".to_owned()),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    let want = [
        (Kind::Node, "synced"),
        (Kind::ServiceCidr, "synced"),
        (Kind::Service, "default/a"),
        (Kind::Service, "default/b"),
        (Kind::Service, "synced"),
        (Kind::EndpointSlice, "synced"),
    ];
    assert_eq!(events, want.map(|(kind, what)| (kind, what.to_owned())));
    assert_eq!(changes, kproxy_source::initial_changes(&snapshot).collect::<Vec<_>>());
}

#[test]
fn lists_typed_lists_and_json_files() {
    let dir = ScratchDir::new("lists");
    dir.write(
        "list.yaml",
        "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Node\n  metadata:\n    name: n1\n\
         - apiVersion: v1\n  kind: ConfigMap\n  metadata:\n    name: cm\n\
         - apiVersion: v1\n  kind: Node\n  metadata:\n    name: n2\n",
    );
    // What the API server returns for a list of Services: items without kind/apiVersion.
    dir.write(
        "services.json",
        r#"{"apiVersion": "v1", "kind": "ServiceList", "items": [
             {"metadata": {"name": "j1", "namespace": "x"}, "spec": {"clusterIP": "198.18.128.3", "ports": [{"port": 53, "protocol": "UDP"}]}}
           ]}
           {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "j2"}, "spec": {"clusterIP": "198.18.128.4"}}"#,
    );
    let snapshot = load(dir.path()).unwrap();
    assert!(snapshot.errors().is_empty(), "{:?}", snapshot.errors());
    assert_eq!(snapshot.objects_of(Kind::Node).count(), 2);
    assert_eq!(snapshot.objects_of(Kind::Service).count(), 2);
    svc(&snapshot, "x", "j1");
    svc(&snapshot, "default", "j2");
    let n2 = snapshot.origin(Kind::Node, &ObjectKey::cluster("n2")).unwrap();
    assert_eq!(n2.line, 12, "list items report their own line");
    let j2 = snapshot.origin(Kind::Service, &ObjectKey::new("default", "j2")).unwrap();
    assert_eq!(j2.line, 4, "second JSON value of the stream");
}

#[test]
fn malformed_yaml_names_file_and_line_and_spares_the_other_documents() {
    let dir = ScratchDir::new("malformed");
    let good = service("good", "198.18.128.1", 80);
    dir.write(
        "a.yaml",
        &format!(
            "{good}---\napiVersion: v1\nkind: Service\nmetadata: {{name: [broken\n---\n{}",
            service("after", "198.18.128.2", 81)
        ),
    );
    dir.write("b.yaml", &service("other-file", "198.18.128.3", 82));
    let snapshot = load(dir.path()).unwrap();
    let errors = errors_of(snapshot.errors());
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].0, "a.yaml");
    // The broken flow sequence is on line 12 of a.yaml (good: lines 1-8, '---' 9).
    assert_eq!(errors[0].1, Some(12), "{errors:?}");
    let names: Vec<String> = snapshot.objects_of(Kind::Service).map(|o| o.key().name.to_string()).collect();
    assert_eq!(names, vec!["after", "good", "other-file"]);
}

#[test]
fn a_bad_field_is_reported_at_its_line_with_its_path() {
    let dir = ScratchDir::new("badfield");
    dir.write(
        "svc.yaml",
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: bad\nspec:\n  ports:\n  - port: 80\n  - port: eighty\n---\n",
    );
    dir.write("z.yaml", &service("fine", "198.18.128.9", 80));
    let snapshot = load(dir.path()).unwrap();
    let error = &snapshot.errors()[0];
    assert_eq!(snapshot.errors().len(), 1);
    assert_eq!(error.line, Some(8), "{error}");
    assert_eq!(error.kind.as_deref(), Some("Service"));
    assert_eq!(error.name.as_deref(), Some("bad"));
    assert!(error.message.starts_with("spec.ports[1].port: "), "{error}");
    assert!(error.to_string().contains("svc.yaml:8: Service bad: spec.ports[1].port"), "{error}");
    assert_eq!(snapshot.len(), 1);
    svc(&snapshot, "default", "fine");
}

#[test]
fn a_bad_list_item_is_reported_at_its_line() {
    let dir = ScratchDir::new("baditem");
    dir.write(
        "list.yaml",
        "kind: List\napiVersion: v1\nitems:\n- apiVersion: v1\n  kind: Node\n  metadata:\n    name: ok\n\
         - apiVersion: v1\n  kind: Node\n  metadata:\n    name: bad\n  spec:\n    podCIDRs: 7\n",
    );
    let snapshot = load(dir.path()).unwrap();
    let errors = errors_of(snapshot.errors());
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].1, Some(13));
    assert!(errors[0].2.starts_with("spec.podCIDRs: "), "{errors:?}");
    assert_eq!(snapshot.len(), 1);
}

#[test]
fn documents_without_kind_name_or_known_apiversion_are_errors() {
    let dir = ScratchDir::new("nokind");
    dir.write(
        "x.yaml",
        "apiVersion: v1\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Service\nmetadata: {}\n\
         ---\napiVersion: discovery.k8s.io/v1beta1\nkind: EndpointSlice\nmetadata: {name: e}\n---\n- 1\n",
    );
    let snapshot = load(dir.path()).unwrap();
    let errors = errors_of(snapshot.errors());
    let lines: Vec<Option<usize>> = errors.iter().map(|e| e.1).collect();
    assert_eq!(lines, vec![Some(1), Some(4), Some(8), Some(12)], "{errors:?}");
    assert!(errors[0].2.contains("kind is missing"));
    assert!(errors[1].2.contains("metadata.name"));
    assert!(errors[2].2.contains("unsupported apiVersion"));
    assert!(errors[3].2.contains("expected an object"));
    assert!(snapshot.is_empty());
}

#[test]
fn unknown_kinds_and_other_files_are_skipped_quietly() {
    let dir = ScratchDir::new("unknown");
    dir.write(
        "app.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec: {replicas: many}\n---\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n---\n",
    );
    dir.write("notes.txt", "not: [yaml");
    dir.write(".hidden.yaml", "not: [yaml");
    std::fs::create_dir(dir.path().join("sub.yaml")).unwrap();
    std::fs::write(dir.path().join("sub.yaml/svc.yaml"), service("nested", "198.18.128.1", 1)).unwrap();
    let snapshot = load(dir.path()).unwrap();
    assert!(snapshot.errors().is_empty(), "{:?}", snapshot.errors());
    assert!(snapshot.is_empty(), "non-recursive, other extensions and hidden files ignored");
}

#[test]
fn duplicates_keep_the_first_definition_in_file_order() {
    let dir = ScratchDir::new("dups");
    dir.write("b.yaml", &format!("# pad\n{}", service("dup", "198.18.128.2", 2)));
    dir.write("a.yaml", &service("dup", "198.18.128.1", 1));
    let snapshot = load(dir.path()).unwrap();
    let errors = errors_of(snapshot.errors());
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!((errors[0].0.as_str(), errors[0].1), ("b.yaml", Some(2)));
    assert!(errors[0].2.contains("a.yaml:1"), "{errors:?}");
    let dup = svc(&snapshot, "default", "dup");
    assert_eq!(dup.service.spec.as_ref().unwrap().cluster_ip.as_deref(), Some("198.18.128.1"));
}

#[test]
fn invalid_utf8_and_bad_traffic_hint_are_reported() {
    let dir = ScratchDir::new("utf8");
    std::fs::write(dir.path().join("bin.yaml"), b"a: 1\nb: \xff\n").unwrap();
    dir.write(
        "hint.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: h}\nspec:\n  clusterIP: 198.18.128.1\n  trafficHint: [x]\n",
    );
    let snapshot = load(dir.path()).unwrap();
    let errors = errors_of(snapshot.errors());
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert_eq!((errors[0].0.as_str(), errors[0].1), ("bin.yaml", Some(2)));
    assert_eq!((errors[1].0.as_str(), errors[1].1), ("hint.yaml", Some(6)));
}

#[test]
fn an_unreadable_directory_is_a_hard_error() {
    let dir = ScratchDir::new("gone");
    let missing = dir.path().join("missing");
    let err = load(&missing).unwrap_err();
    assert!(err.to_string().contains("missing"), "{err}");
}
