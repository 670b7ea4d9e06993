//! Watches that cannot resume from their resource version, and so list again.
//!
//! kube-runtime's watcher resumes a broken watch from its last resource version and lists again
//! only after a `410 Gone` ERROR event inside a watch. Two answers say that resuming will never
//! work, and kube-runtime 5 retries both with the same version for ever:
//!
//! - a watch *start* refused with status `410` (kube-apiserver sends its 410 as an ERROR event
//!   inside a `200` watch; a proxy or an aggregated server in front may refuse the request);
//! - "Too large resource version" (`504`, cause `ResourceVersionTooLarge`): the version is newer
//!   than this server has seen (an etcd restored from a backup, an HA member far behind).
//!   kube-apiserver v1.36.2 answers a *list* from such a version that way after 3 s (measured);
//!   a *watch* from it stays open and silent until its timeout, which no client can tell from a
//!   quiet cluster, so only the answer that says so is acted on.
//!
//! client-go's reflector lists again after both (`isExpiredError`, `isTooLargeResourceVersionError`
//! in `tools/cache/reflector.go`). So does kproxy: [`relisting`] passes the error on (logged,
//! counted and backed off like any other) and takes the next events from a new watcher, which
//! starts with a list.

use futures::StreamExt;
use kube::core::Status;
use kube::runtime::watcher;

use crate::raw::ApiKind;
use crate::watch::WatchEvents;

/// The events of the watchers `start` makes: a new one whenever the current one answered that it
/// cannot resume from its resource version.
pub(crate) fn relisting<K, F>(start: F) -> WatchEvents<K>
where
    K: ApiKind,
    F: Fn() -> WatchEvents<K> + Send + 'static,
{
    let events = start();
    futures::stream::unfold((events, start), |(mut events, start)| async move {
        let event = events.next().await?;
        if let Err(error) = &event
            && cannot_resume(error)
        {
            tracing::info!(kind = %K::KIND, %error, "the watch cannot resume from its resource version: listing again");
            events = start();
        }
        Some((event, (events, start)))
    })
    .boxed()
}

/// Whether `error` says that no watch will ever resume from the watcher's resource version.
fn cannot_resume(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::WatchStartFailed(kube::Error::Api(status)) => status.code == 410 || too_large(status),
        watcher::Error::WatchError(status) => too_large(status),
        _ => false,
    }
}

/// kube-apiserver's "Too large resource version": the cause since 1.18, the message before.
fn too_large(status: &Status) -> bool {
    let cause = status
        .details
        .as_ref()
        .is_some_and(|details| details.causes.iter().any(|cause| cause.reason == "ResourceVersionTooLarge"));
    cause || (status.code == 504 && status.message.contains("Too large resource version"))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use k8s_openapi::api::core::v1::Service;
    use kube::runtime::watcher::Event;

    use super::*;
    use crate::watch::WatchEvent;

    fn refused(code: u16) -> watcher::Error {
        watcher::Error::WatchStartFailed(kube::Error::Api(Status::failure("refused", "Reason").with_code(code).boxed()))
    }

    /// kube-apiserver v1.36.2's answer to a list from a version it has not reached, as measured.
    fn too_large_status() -> Box<Status> {
        let body = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
            "message":"Timeout: Too large resource version: 100205, current: 208","reason":"Timeout",
            "details":{"causes":[{"reason":"ResourceVersionTooLarge","message":"Too large resource version"}],
            "retryAfterSeconds":1},"code":504}"#;
        serde_json::from_str::<Status>(body).expect("kube-apiserver's Status").boxed()
    }

    #[test]
    fn a_start_refused_410_and_a_too_large_version_cannot_resume_other_errors_can() {
        assert!(cannot_resume(&refused(410)));
        assert!(cannot_resume(&watcher::Error::WatchError(too_large_status())));
        assert!(cannot_resume(&watcher::Error::WatchStartFailed(kube::Error::Api(too_large_status()))));
        let old_server = Status::failure("Too large resource version: 9, current: 8", "Timeout").with_code(504);
        assert!(cannot_resume(&watcher::Error::WatchError(old_server.boxed())), "no cause, the message says it");
        // kube-runtime relists after a 410 ERROR event itself; the rest resume or are retried.
        let gone = Status::failure("too old resource version", "Expired").with_code(410).boxed();
        assert!(!cannot_resume(&watcher::Error::WatchError(gone)));
        for code in [403, 429, 500, 503, 504] {
            assert!(!cannot_resume(&refused(code)), "{code}");
        }
        let timeout = Status::failure("request timed out", "Timeout").with_code(504).boxed();
        assert!(!cannot_resume(&watcher::Error::WatchError(timeout)), "a plain 504 is retried");
        assert!(!cannot_resume(&watcher::Error::NoResourceVersion));
    }

    /// A watcher that answers `script` and then ends; `starts` counts the watchers made.
    fn scripted(starts: &Arc<AtomicUsize>, script: fn(usize) -> Vec<WatchEvent<Service>>) -> WatchEvents<Service> {
        let n = starts.fetch_add(1, Ordering::SeqCst);
        futures::stream::iter(script(n)).boxed()
    }

    fn labels(events: &[WatchEvent<Service>]) -> Vec<String> {
        events
            .iter()
            .map(|event| match event {
                Ok(Event::Init) => "init".to_owned(),
                Ok(Event::InitDone) => "done".to_owned(),
                Ok(_) => "object".to_owned(),
                Err(error) => format!("error: {error}"),
            })
            .collect()
    }

    #[tokio::test]
    async fn after_an_answer_that_cannot_resume_the_next_events_come_from_a_new_watcher_that_lists() {
        let starts = Arc::new(AtomicUsize::new(0));
        let made = starts.clone();
        // The first watcher lists, then its resumed watch is refused 410 at the start, and would
        // go on retrying the same version (what kube-runtime does): events the new watcher must
        // replace.
        let events = relisting(move || {
            scripted(&made, |n| match n {
                0 => vec![Ok(Event::Init), Ok(Event::InitDone), Err(refused(410)), Err(refused(410))],
                1 => vec![Ok(Event::Init), Ok(Event::InitDone), Err(watcher::Error::WatchError(too_large_status()))],
                _ => vec![Ok(Event::Init), Ok(Event::InitDone), Err(refused(500)), Err(refused(500))],
            })
        });
        let seen: Vec<_> = events.collect().await;
        let seen = labels(&seen);
        assert_eq!(starts.load(Ordering::SeqCst), 3, "{seen:?}");
        assert_eq!(seen.len(), 10, "the first two watchers' later events are dropped: {seen:?}");
        assert_eq!(&seen[..2], ["init", "done"], "{seen:?}");
        assert!(seen[2].contains("410"), "{seen:?}");
        assert_eq!(&seen[3..5], ["init", "done"], "the second watcher lists: {seen:?}");
        assert!(seen[5].contains("Too large"), "{seen:?}");
        assert_eq!(&seen[6..8], ["init", "done"], "the third watcher lists: {seen:?}");
        assert!(seen[8..].iter().all(|e| e.contains("500")), "an error that can resume keeps the watcher: {seen:?}");
    }
}
