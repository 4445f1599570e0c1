//! The standard `process_*` metrics (CPU seconds, resident and virtual memory, open and maximum
//! file descriptors, start time), read from `/proc/self` at scrape time. prometheus-client has no
//! process collector; these names follow the Prometheus client libraries' convention so existing
//! dashboards and alerts work unchanged. Off Linux (no `/proc`) the collector reports nothing.

use std::fs;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

/// Kernel clock ticks per second in `/proc/<pid>/stat` (USER_HZ, 100 on every Linux ABI).
const USER_HZ: f64 = 100.0;

/// Collects the process metrics on every scrape (a few small `/proc` reads).
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessCollector;

/// One reading of `/proc/self`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ProcessStats {
    /// User plus system CPU time.
    pub cpu_seconds: f64,
    /// Resident set size.
    pub resident_bytes: i64,
    /// Virtual memory size.
    pub virtual_bytes: i64,
    /// Open file descriptors.
    pub open_fds: i64,
    /// Soft limit on open file descriptors.
    pub max_fds: i64,
    /// Start time since the Unix epoch.
    pub start_time_seconds: f64,
}

impl ProcessStats {
    /// Reads `/proc/self`; `None` where it does not exist or cannot be parsed.
    pub fn read() -> Option<Self> {
        let stat = fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name, which is in parentheses and may contain spaces.
        let rest = stat.get(stat.rfind(')')? + 2..)?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // In `rest`, field 0 is the state (field 3 of the full line): utime is 14 → index 11.
        let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
        let cpu_seconds = (ticks(11)? + ticks(12)?) / USER_HZ;
        let started_after_boot = ticks(19)? / USER_HZ;
        let boot_time = fs::read_to_string("/proc/stat")
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<f64>().ok())?;
        let status = fs::read_to_string("/proc/self/status").ok()?;
        let kib = |key: &str| {
            status.lines().find_map(|l| {
                let value = l.strip_prefix(key)?.trim().strip_suffix("kB")?.trim();
                value.parse::<i64>().ok().map(|k| k * 1024)
            })
        };
        let open_fds = fs::read_dir("/proc/self/fd").map(|d| d.count() as i64).unwrap_or(0);
        let max_fds = fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|l| {
                l.lines().find_map(|line| {
                    let rest = line.strip_prefix("Max open files")?;
                    rest.split_whitespace().next()?.parse::<i64>().ok()
                })
            })
            .unwrap_or(0);
        Some(Self {
            cpu_seconds,
            resident_bytes: kib("VmRSS:").unwrap_or(0),
            virtual_bytes: kib("VmSize:").unwrap_or(0),
            open_fds,
            max_fds,
            start_time_seconds: boot_time + started_after_boot,
        })
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(s) = ProcessStats::read() else { return Ok(()) };
        let cpu = ConstCounter::new(s.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu",
            "Total user and system CPU time spent",
            Some(&Unit::Seconds),
            cpu.metric_type(),
        )?)?;
        let gauges: [(&str, &str, Option<&Unit>, i64); 4] = [
            ("process_resident_memory", "Resident memory size", Some(&Unit::Bytes), s.resident_bytes),
            ("process_virtual_memory", "Virtual memory size", Some(&Unit::Bytes), s.virtual_bytes),
            ("process_open_fds", "Number of open file descriptors", None, s.open_fds),
            ("process_max_fds", "Maximum number of open file descriptors", None, s.max_fds),
        ];
        for (name, help, unit, value) in gauges {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, unit, gauge.metric_type())?)?;
        }
        let start = ConstGauge::new(s.start_time_seconds);
        start.encode(encoder.encode_descriptor(
            "process_start_time",
            "Start time of the process since the Unix epoch",
            Some(&Unit::Seconds),
            start.metric_type(),
        )?)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_plausible_values_for_this_process() {
        let Some(s) = ProcessStats::read() else { return }; // no /proc: nothing to check
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64());
        let now = now.unwrap_or_default();
        assert!(s.start_time_seconds > now - 86_400.0 && s.start_time_seconds <= now + 1.0, "{s:?}");
        assert!(s.resident_bytes > 1 << 20 && s.virtual_bytes >= s.resident_bytes, "{s:?}");
        assert!(s.open_fds >= 3 && s.max_fds >= s.open_fds, "{s:?}");
        assert!(s.cpu_seconds >= 0.0, "{s:?}");
    }
}
