//! Following a directory: writes, edits, deletions, breakage and repair become the right events.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

mod common;

use std::time::Duration;

use common::{ScratchDir, service};
use kproxy_source::{ManifestError, ManifestSource, WatchOptions};
use kproxy_state::{Change, Kind, Object, ObjectKey};
use tokio::sync::mpsc;

const WAIT: Duration = Duration::from_secs(10);
const QUIET: Duration = Duration::from_millis(600);

struct Running {
    changes: mpsc::Receiver<Change>,
    errors: mpsc::UnboundedReceiver<ManifestError>,
    task: tokio::task::JoinHandle<Result<(), kproxy_source::SourceError>>,
}

fn start(dir: &ScratchDir, options: WatchOptions) -> Running {
    let source = ManifestSource::open(dir.path(), options).unwrap();
    let (tx, changes) = mpsc::channel(64);
    let (error_tx, errors) = mpsc::unbounded_channel();
    let task = tokio::spawn(source.run(tx, move |e: &ManifestError| {
        let _ = error_tx.send(e.clone());
    }));
    Running { changes, errors, task }
}

impl Running {
    async fn next(&mut self) -> Change {
        tokio::time::timeout(WAIT, self.changes.recv()).await.expect("no change arrived in time").expect("source ended")
    }

    async fn next_error(&mut self) -> ManifestError {
        tokio::time::timeout(WAIT, self.errors.recv()).await.expect("no error arrived in time").expect("source ended")
    }

    async fn assert_quiet(&mut self) {
        if let Ok(Some(change)) = tokio::time::timeout(QUIET, self.changes.recv()).await {
            panic!("unexpected change {change:?}");
        }
    }

    /// The initial changes, as (kind, objects applied before its `Synced`) per kind.
    async fn initial(&mut self) -> Vec<(Kind, usize)> {
        let mut kinds = Vec::new();
        let mut applied = 0;
        while kinds.len() < Kind::ALL.len() {
            match self.next().await {
                Change::Applied(_) => applied += 1,
                Change::Synced(kind) => kinds.push((kind, std::mem::take(&mut applied))),
                other => panic!("expected Applied or Synced, got {other:?}"),
            }
        }
        kinds
    }
}

fn applied_service(change: &Change) -> (String, i32) {
    match change {
        Change::Applied(Object::Service(s)) => {
            let port = s.service.spec.as_ref().and_then(|spec| spec.ports.as_ref()).map(|p| p[0].port).unwrap_or(0);
            (s.service.metadata.name.clone().unwrap_or_default(), port)
        }
        other => panic!("expected an applied Service, got {other:?}"),
    }
}

fn deleted(kind: Kind, name: &str) -> Change {
    Change::Deleted(kind, ObjectKey::new("default", name))
}

fn slice(name: &str, service: &str) -> String {
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  labels:\n    \
         kubernetes.io/service-name: {service}\naddressType: IPv4\nendpoints:\n- addresses: [198.18.16.9]\n"
    )
}

fn fast() -> WatchOptions {
    WatchOptions { debounce: Duration::from_millis(50), ..WatchOptions::default() }
}

#[tokio::test]
async fn writes_edits_deletes_breakage_and_repair() {
    let dir = ScratchDir::new("watch");
    dir.write("a.yaml", &service("a", "198.18.128.1", 80));
    let mut source = start(&dir, fast());
    assert_eq!(
        source.initial().await,
        vec![(Kind::Node, 0), (Kind::ServiceCidr, 0), (Kind::Service, 1), (Kind::EndpointSlice, 0)]
    );
    source.assert_quiet().await;

    // A new file: its objects are applied.
    dir.write("b.yaml", &format!("{}---\n{}", service("b", "198.18.128.2", 90), slice("b-1", "b")));
    assert_eq!(applied_service(&source.next().await), ("b".into(), 90));
    assert!(matches!(source.next().await, Change::Applied(Object::EndpointSlice(_))));
    source.assert_quiet().await;

    // An edit: the object is applied again; nothing else moves.
    dir.write("a.yaml", &service("a", "198.18.128.1", 81));
    assert_eq!(applied_service(&source.next().await), ("a".into(), 81));
    source.assert_quiet().await;

    // Broken: the error is reported, nothing is deleted.
    dir.write("a.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: [a\n");
    let error = source.next_error().await;
    assert!(error.file.ends_with("a.yaml"), "{error}");
    assert_eq!(error.line, Some(3), "{error}");
    source.assert_quiet().await;

    // Fixed: changes resume.
    dir.write("a.yaml", &service("a", "198.18.128.1", 82));
    assert_eq!(applied_service(&source.next().await), ("a".into(), 82));
    source.assert_quiet().await;

    // Partly broken while an object was removed from it: the removed object stays until the file is whole.
    dir.write("a.yaml", &format!("{}---\n{}", service("a", "198.18.128.1", 82), service("a2", "198.18.128.3", 1)));
    assert_eq!(applied_service(&source.next().await), ("a2".into(), 1));
    dir.write(
        "a.yaml",
        &format!(
            "{}---\nkind: Service\napiVersion: v1\nmetadata: {{name: a2}}\nspec: {{ports: 5}}\n",
            service("a", "198.18.128.1", 83)
        ),
    );
    assert_eq!(applied_service(&source.next().await), ("a".into(), 83));
    let error = source.next_error().await;
    assert_eq!((error.name.as_deref(), error.line), (Some("a2"), Some(13)), "{error}");
    source.assert_quiet().await;
    dir.write("a.yaml", &service("a", "198.18.128.1", 83));
    assert_eq!(source.next().await, deleted(Kind::Service, "a2"));
    source.assert_quiet().await;

    // A deleted file deletes its objects, endpoints before their service.
    dir.remove("b.yaml");
    assert_eq!(source.next().await, deleted(Kind::EndpointSlice, "b-1"));
    assert_eq!(source.next().await, deleted(Kind::Service, "b"));
    source.assert_quiet().await;

    // Dropping the receiver ends the source.
    drop(source.changes);
    let ended = tokio::time::timeout(WAIT, source.task).await.expect("source did not stop");
    assert!(matches!(ended, Ok(Ok(()))), "{ended:?}");
}

#[tokio::test]
async fn a_broken_file_at_startup_is_reported_and_the_rest_loads() {
    let dir = ScratchDir::new("watch-startup");
    dir.write("bad.yaml", "kind: [\n");
    dir.write("good.yaml", &service("good", "198.18.128.1", 80));
    let mut source = start(&dir, fast());
    assert_eq!(source.initial().await[2], (Kind::Service, 1));
    let error = source.next_error().await;
    assert!(error.file.ends_with("bad.yaml"));
    assert_eq!(error.line, Some(1));
    source.assert_quiet().await;
    // Fixing it brings its objects in.
    dir.write("bad.yaml", &service("fixed", "198.18.128.2", 80));
    assert_eq!(applied_service(&source.next().await), ("fixed".into(), 80));
}

#[tokio::test]
async fn the_polling_fallback_follows_the_directory_too() {
    let dir = ScratchDir::new("watch-poll");
    let options = WatchOptions { poll: true, poll_interval: Duration::from_millis(100), ..fast() };
    let mut source = start(&dir, options);
    assert_eq!(
        source.initial().await,
        vec![(Kind::Node, 0), (Kind::ServiceCidr, 0), (Kind::Service, 0), (Kind::EndpointSlice, 0)]
    );
    dir.write("n.yaml", "apiVersion: v1\nkind: Node\nmetadata: {name: node-x}\n");
    assert!(matches!(source.next().await, Change::Applied(Object::Node(_))));
    dir.remove("n.yaml");
    assert_eq!(source.next().await, Change::Deleted(Kind::Node, ObjectKey::cluster("node-x")));
}

#[tokio::test]
async fn changes_between_open_and_run_are_not_lost() {
    let dir = ScratchDir::new("watch-race");
    let source = ManifestSource::open(dir.path(), fast()).unwrap();
    assert!(source.snapshot().is_empty());
    dir.write("late.yaml", &service("late", "198.18.128.1", 80));
    let (tx, mut rx) = mpsc::channel(16);
    let task = tokio::spawn(source.run(tx, |_: &ManifestError| {}));
    let mut seen = Vec::new();
    while seen.len() < 5 {
        seen.push(tokio::time::timeout(WAIT, rx.recv()).await.unwrap().unwrap());
    }
    assert_eq!(applied_service(&seen[4]), ("late".into(), 80));
    task.abort();
}
