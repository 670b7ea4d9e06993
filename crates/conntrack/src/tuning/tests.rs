//! Tuning against a scratch directory laid out like / .

use std::fs;
use std::path::Path;
use std::time::Duration;

use super::*;

const RW_SYSFS: &str = "proc /proc proc rw,nosuid 0 0\nsysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0\n";
const RO_SYSFS: &str = "sysfs /sys sysfs ro,nosuid,nodev,noexec,relatime 0 0\n";

/// A scratch root with every file tuning touches, holding Debian's defaults.
fn scratch_root(mounts: &str) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    for (path, value) in [
        (CONNTRACK_MAX, "65536"),
        (HASHSIZE, "16384"),
        (TCP_ESTABLISHED, "432000"),
        (TCP_CLOSE_WAIT, "60"),
        (TCP_BE_LIBERAL, "0"),
        (UDP_TIMEOUT, "30"),
        (UDP_STREAM_TIMEOUT, "120"),
    ] {
        let file = root.path().join(path);
        fs::create_dir_all(file.parent().unwrap()).unwrap();
        fs::write(file, format!("{value}\n")).unwrap();
    }
    fs::write(root.path().join(MOUNTS), mounts).unwrap();
    root
}

fn read(root: &Path, path: &str) -> String {
    fs::read_to_string(root.join(path)).unwrap().trim().to_string()
}

#[test]
fn conntrack_max_scales_with_cpus_above_the_floor() {
    let tuning = ConntrackTuning::default();
    assert_eq!(tuning.conntrack_max(2), 131_072, "2 × 32768 is below the 131072 floor");
    assert_eq!(tuning.conntrack_max(8), 262_144);
    assert_eq!(ConntrackTuning { max_per_core: 0, ..tuning.clone() }.conntrack_max(64), 0, "0 leaves it alone");
    assert_eq!(ConntrackTuning { min: 0, ..tuning }.conntrack_max(1), 32_768);
}

#[test]
fn applies_kube_proxy_defaults() {
    let root = scratch_root(RW_SYSFS);
    let report = ConntrackTuning::default().apply_with_cpus(root.path(), 8);
    assert_eq!(read(root.path(), CONNTRACK_MAX), "262144");
    assert_eq!(read(root.path(), HASHSIZE), "65536", "a quarter of the max");
    assert_eq!(read(root.path(), TCP_ESTABLISHED), "86400");
    assert_eq!(read(root.path(), TCP_CLOSE_WAIT), "3600");
    // Zero timeouts and tcpBeLiberal=false leave the kernel's values.
    assert_eq!(read(root.path(), UDP_TIMEOUT), "30");
    assert_eq!(read(root.path(), UDP_STREAM_TIMEOUT), "120");
    assert_eq!(read(root.path(), TCP_BE_LIBERAL), "0");
    assert_eq!(report.settings.len(), 4);
    assert!(report.failures().next().is_none());
    assert!(matches!(report.outcome(CONNTRACK_MAX), Some(SettingOutcome::Changed { from: Some(65_536), to: 262_144 })));
}

#[test]
fn applies_udp_timeouts_and_be_liberal_when_configured() {
    let root = scratch_root(RW_SYSFS);
    let tuning = ConntrackTuning {
        max_per_core: 0,
        tcp_be_liberal: true,
        udp_timeout: Duration::from_secs(45),
        udp_stream_timeout: Duration::from_secs(300),
        ..ConntrackTuning::default()
    };
    let report = tuning.apply_with_cpus(root.path(), 4);
    assert_eq!(read(root.path(), UDP_TIMEOUT), "45");
    assert_eq!(read(root.path(), UDP_STREAM_TIMEOUT), "300");
    assert_eq!(read(root.path(), TCP_BE_LIBERAL), "1");
    assert_eq!(read(root.path(), CONNTRACK_MAX), "65536", "maxPerCore 0 leaves the max");
    assert_eq!(read(root.path(), HASHSIZE), "16384", "and the hash size");
    assert!(report.outcome(CONNTRACK_MAX).is_none());
}

#[test]
fn does_not_shrink_a_larger_hash_size() {
    let root = scratch_root(RW_SYSFS);
    fs::write(root.path().join(HASHSIZE), "1048576\n").unwrap();
    let report = ConntrackTuning::default().apply_with_cpus(root.path(), 8);
    assert_eq!(read(root.path(), HASHSIZE), "1048576");
    assert!(matches!(report.outcome(HASHSIZE), Some(SettingOutcome::Unchanged(1_048_576))));
}

#[test]
fn leaves_the_hash_size_when_sysfs_is_read_only_and_still_applies_the_rest() {
    let root = scratch_root(RO_SYSFS);
    let report = ConntrackTuning::default().apply_with_cpus(root.path(), 8);
    assert_eq!(read(root.path(), HASHSIZE), "16384");
    assert!(matches!(report.outcome(HASHSIZE), Some(SettingOutcome::ReadOnlySysfs)));
    assert_eq!(read(root.path(), CONNTRACK_MAX), "262144");
    assert_eq!(read(root.path(), TCP_ESTABLISHED), "86400");
    assert_eq!(report.failures().count(), 1);
}

#[test]
fn a_value_already_set_is_not_rewritten() {
    let root = scratch_root(RW_SYSFS);
    fs::write(root.path().join(TCP_CLOSE_WAIT), "3600\n").unwrap();
    let report = ConntrackTuning::default().apply_with_cpus(root.path(), 8);
    assert!(matches!(report.outcome(TCP_CLOSE_WAIT), Some(SettingOutcome::Unchanged(3600))));
}

#[test]
fn a_setting_that_cannot_be_written_is_reported_and_the_others_applied() {
    let root = scratch_root(RW_SYSFS);
    // A directory where the file should be: neither readable as an integer nor writable.
    let max = root.path().join(CONNTRACK_MAX);
    fs::remove_file(&max).unwrap();
    fs::create_dir(&max).unwrap();
    let report = ConntrackTuning::default().apply_with_cpus(root.path(), 8);
    assert!(matches!(
        report.outcome(CONNTRACK_MAX),
        Some(SettingOutcome::Failed(Error::File { action: "writing", .. }))
    ));
    assert_eq!(read(root.path(), HASHSIZE), "65536");
    assert_eq!(read(root.path(), TCP_ESTABLISHED), "86400");
    assert_eq!(report.failures().count(), 1);
}

#[test]
fn a_missing_hash_size_file_is_a_failure_not_a_panic() {
    let root = scratch_root(RW_SYSFS);
    fs::remove_file(root.path().join(HASHSIZE)).unwrap();
    let report = ConntrackTuning::default().apply_with_cpus(root.path(), 8);
    assert!(matches!(report.outcome(HASHSIZE), Some(SettingOutcome::Failed(Error::File { action: "reading", .. }))));
}
