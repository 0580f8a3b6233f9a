//! The process's own resource use, read at scrape time: Prometheus's standard `process_*`
//! series (resident memory, CPU, start time) and the container's memory limit, so that "memory
//! near the limit" is one expression over our own scrape (no cAdvisor or kube-state-metrics).
//!
//! Also who this process is: its Pod (from the downward API, where Events about the controller
//! itself go) and its default leader-election identity.
//!
//! Owns: reading `/proc/self`, the cgroup memory limit, the downward API's variables, the
//! hostname and the ServiceAccount's namespace file. Linux only for the resource series;
//! elsewhere they are absent (the start time is always written).

use std::{
    fmt::Write as _,
    sync::LazyLock,
    time::{SystemTime, UNIX_EPOCH},
};

static STARTED: LazyLock<f64> = LazyLock::new(|| {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
});

/// Note the start time (called once at start-up; later calls change nothing).
pub(crate) fn started() {
    LazyLock::force(&STARTED);
}

/// Resident set size in bytes, from `/proc/self/status` (`VmRSS`, in kB whatever the page size).
pub(crate) fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_vm_rss(&status)
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// User + system CPU seconds, from `/proc/self/stat` (fields 14 and 15, in clock ticks; the
/// kernel's user-visible tick rate, USER_HZ, is 100 on every Linux architecture we ship).
pub(crate) fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    parse_cpu_ticks(&stat).map(|t| t as f64 / 100.0)
}

fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) is in parentheses and may contain spaces: count from after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name, field 3 is at index 0: utime (14) is at 11, stime (15) at 12.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// The container's memory limit in bytes (cgroup v2 `memory.max`, else v1
/// `memory.limit_in_bytes`); `None` when there is none.
pub(crate) fn memory_limit_bytes() -> Option<u64> {
    let v2 = std::fs::read_to_string("/sys/fs/cgroup/memory.max").ok();
    let v1 = || std::fs::read_to_string("/sys/fs/cgroup/memory/memory.limit_in_bytes").ok();
    parse_limit(v2.or_else(v1)?.trim())
}

fn parse_limit(s: &str) -> Option<u64> {
    // v2 says "max"; v1 says a number close to 2^63 rounded to the page size.
    let n: u64 = s.parse().ok()?;
    (n < 1 << 60).then_some(n)
}

/// Append the series in the OpenMetrics text format.
pub(crate) fn encode(out: &mut String) -> std::fmt::Result {
    encode_values(out, resident_bytes(), cpu_seconds(), memory_limit_bytes())
}

/// Append these values' series (a value this machine does not have is left out).
pub(crate) fn encode_values(
    out: &mut String,
    rss: Option<u64>,
    cpu: Option<f64>,
    limit: Option<u64>,
) -> std::fmt::Result {
    if let Some(rss) = rss {
        writeln!(
            out,
            "# HELP process_resident_memory_bytes Resident memory size in bytes."
        )?;
        writeln!(out, "# TYPE process_resident_memory_bytes gauge")?;
        writeln!(out, "# UNIT process_resident_memory_bytes bytes")?;
        writeln!(out, "process_resident_memory_bytes {rss}")?;
    }
    if let Some(cpu) = cpu {
        writeln!(
            out,
            "# HELP process_cpu_seconds Total user and system CPU time spent in seconds."
        )?;
        writeln!(out, "# TYPE process_cpu_seconds counter")?;
        writeln!(out, "# UNIT process_cpu_seconds seconds")?;
        writeln!(out, "process_cpu_seconds_total {cpu}")?;
    }
    writeln!(
        out,
        "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds."
    )?;
    writeln!(out, "# TYPE process_start_time_seconds gauge")?;
    writeln!(out, "# UNIT process_start_time_seconds seconds")?;
    writeln!(out, "process_start_time_seconds {}", *STARTED)?;
    if let Some(limit) = limit {
        writeln!(
            out,
            "# HELP ec2_topology_labeler_memory_limit_bytes The container's memory limit (cgroup), in bytes; absent when unlimited."
        )?;
        writeln!(out, "# TYPE ec2_topology_labeler_memory_limit_bytes gauge")?;
        writeln!(out, "# UNIT ec2_topology_labeler_memory_limit_bytes bytes")?;
        writeln!(out, "ec2_topology_labeler_memory_limit_bytes {limit}")?;
    }
    Ok(())
}

/// This replica's Pod, from the downward API (`POD_NAME`, `POD_NAMESPACE`, `POD_UID`, which the
/// chart sets): where Events about the controller itself go. `None` outside a Pod.
pub(crate) fn own_pod() -> Option<k8s_openapi::api::core::v1::ObjectReference> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let name = env("POD_NAME")?;
    let namespace = env("POD_NAMESPACE").or_else(|| {
        std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
            .ok()
            .map(|ns| ns.trim().to_string())
    })?;
    Some(k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(name),
        namespace: Some(namespace),
        // `kubectl describe pod` finds Events by the Pod's UID.
        uid: env("POD_UID"),
        ..Default::default()
    })
}

/// Hostname and PID: unique enough among replicas when no Pod name is given.
pub(crate) fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "ec2-topology-labeler".into());
    format!("{host}-{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_is_read_in_bytes() {
        let status = "Name:\tapp\nVmPeak:\t  9000 kB\nVmRSS:\t  2048 kB\nThreads:\t4\n";
        assert_eq!(parse_vm_rss(status), Some(2048 * 1024));
        assert_eq!(parse_vm_rss("Name:\tapp\n"), None);
    }

    #[test]
    fn cpu_ticks_are_counted_after_a_command_name_with_spaces() {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
        let stat = "42 (my app) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 4 0";
        assert_eq!(parse_cpu_ticks(stat), Some(300));
        assert_eq!(parse_cpu_ticks("garbage"), None);
    }

    #[test]
    fn an_unlimited_cgroup_has_no_limit() {
        assert_eq!(parse_limit("max"), None);
        assert_eq!(
            parse_limit("9223372036854771712"),
            None,
            "cgroup v1's unlimited"
        );
        assert_eq!(parse_limit("536870912"), Some(512 << 20));
    }

    #[test]
    fn this_process_reports_its_memory() {
        let mut out = String::new();
        encode(&mut out).unwrap();
        assert!(out.contains("process_resident_memory_bytes "), "{out}");
        assert!(out.contains("process_cpu_seconds_total "), "{out}");
    }
}
