//! The `process_*` series every Kubernetes component exports (client_golang's process collector),
//! read from `/proc/self` at each scrape: CPU time, memory, open and maximum file descriptors,
//! start time.

use std::fs;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Clock ticks per second of `/proc/<pid>/stat` times: `USER_HZ`, 100 on every Linux ABI.
const USER_HZ: f64 = 100.0;

/// What one scrape reads about this process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessSample {
    /// User plus system CPU time, in seconds.
    pub cpu_seconds: f64,
    /// Resident set size, in bytes.
    pub resident_bytes: u64,
    /// Virtual memory size, in bytes.
    pub virtual_bytes: u64,
    /// Start time, in seconds since the Unix epoch.
    pub start_time_seconds: f64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// The soft limit on file descriptors.
    pub max_fds: Option<u64>,
}

impl ProcessSample {
    /// Reads `/proc/self`; `None` when it cannot be read or parsed (not Linux, no procfs).
    pub fn read() -> Option<Self> {
        let stat = fs::read_to_string("/proc/self/stat").ok()?;
        let status = fs::read_to_string("/proc/self/status").ok()?;
        let boot_time = fs::read_to_string("/proc/stat").ok().and_then(|text| boot_time(&text))?;
        let fields = StatFields::parse(&stat)?;
        let open_fds = fs::read_dir("/proc/self/fd").ok()?.count() as u64;
        let max_fds = fs::read_to_string("/proc/self/limits").ok().and_then(|text| max_open_files(&text));
        Some(ProcessSample {
            cpu_seconds: (fields.utime + fields.stime) as f64 / USER_HZ,
            resident_bytes: status_kib(&status, "VmRSS:")? * 1024,
            virtual_bytes: fields.vsize,
            start_time_seconds: boot_time as f64 + fields.starttime as f64 / USER_HZ,
            open_fds,
            max_fds,
        })
    }
}

/// The fields of `/proc/<pid>/stat` the collector needs.
#[derive(Debug, PartialEq, Eq)]
struct StatFields {
    utime: u64,
    stime: u64,
    starttime: u64,
    vsize: u64,
}

impl StatFields {
    /// Parses past the command name, which is in parentheses and may hold spaces or parentheses.
    fn parse(stat: &str) -> Option<Self> {
        let after_name = &stat[stat.rfind(')')? + 1..];
        // Field 3 (state) is the first after the name; utime is field 14.
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        let field = |number: usize| fields.get(number - 3)?.parse::<u64>().ok();
        Some(StatFields { utime: field(14)?, stime: field(15)?, starttime: field(22)?, vsize: field(23)? })
    }
}

/// `btime` of `/proc/stat`: boot time in seconds since the epoch.
fn boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat.lines().find_map(|line| line.strip_prefix("btime ")?.trim().parse().ok())
}

/// A `kB` value of `/proc/<pid>/status`.
fn status_kib(status: &str, key: &str) -> Option<u64> {
    status.lines().find_map(|line| line.strip_prefix(key)?.split_whitespace().next()?.parse().ok())
}

/// The soft `Max open files` limit of `/proc/<pid>/limits` (`unlimited` gives none).
fn max_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|line| line.starts_with("Max open files"))?;
    line["Max open files".len()..].split_whitespace().next()?.parse().ok()
}

/// Encodes a fresh [`ProcessSample`] at each scrape.
#[derive(Debug, Default)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(sample) = ProcessSample::read() else { return Ok(()) };
        let cpu = ConstCounter::new(sample.cpu_seconds);
        // The encoder appends `_total` to counters.
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        let gauges = [
            ("process_resident_memory_bytes", "Resident memory size in bytes", Some(sample.resident_bytes as f64)),
            ("process_virtual_memory_bytes", "Virtual memory size in bytes", Some(sample.virtual_bytes as f64)),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                Some(sample.start_time_seconds),
            ),
            ("process_open_fds", "Number of open file descriptors", Some(sample.open_fds as f64)),
            ("process_max_fds", "Maximum number of open file descriptors", sample.max_fds.map(|n| n as f64)),
        ];
        for (name, help, value) in gauges {
            let Some(value) = value else { continue };
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_found_past_a_command_name_with_spaces_and_parentheses() {
        let stat = "4242 (tokio (rt) 1) S 1 4242 4242 0 -1 4194560 2000 0 0 0 250 75 0 0 20 0 9 0 1234 987654321 2048 \
                    18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(
            StatFields::parse(stat),
            Some(StatFields { utime: 250, stime: 75, starttime: 1234, vsize: 987654321 })
        );
        assert_eq!(StatFields::parse("garbage"), None);
    }

    #[test]
    fn status_limits_and_boot_time_are_read() {
        assert_eq!(status_kib("Name:\tkproxy\nVmRSS:\t   51200 kB\n", "VmRSS:"), Some(51200));
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1048576              1048576              files\n";
        assert_eq!(max_open_files(limits), Some(1_048_576));
        assert_eq!(max_open_files("Max open files            unlimited            unlimited            files\n"), None);
        assert_eq!(boot_time("cpu  1 2 3\nbtime 1764547200\nprocesses 9\n"), Some(1_764_547_200));
    }

    #[test]
    fn this_process_is_sampled() {
        let sample = ProcessSample::read().expect("procfs");
        assert!(sample.resident_bytes > 0 && sample.virtual_bytes >= sample.resident_bytes, "{sample:?}");
        assert!(sample.open_fds >= 3, "{sample:?}");
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        assert!(sample.start_time_seconds <= now + 1.0 && sample.start_time_seconds > now - 3600.0, "{sample:?}");
    }
}
