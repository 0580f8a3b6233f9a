//! Child processes that are stopped cleanly, by PID, and never outlive their owner.

use std::{
    fs::File,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::Context;

/// A child process with its output in a log file. Dropping it stops it.
pub struct Proc {
    name: String,
    child: Option<Child>,
}

impl Proc {
    /// Start `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> anyhow::Result<Self> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        let err = out.try_clone()?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {name} ({:?})", cmd.get_program()))?;
        Ok(Self {
            name: name.to_string(),
            child: Some(child),
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Still running?
    pub fn alive(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGTERM, then SIGKILL after `grace`; waits for the exit so no zombie or orphan remains.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        signal(child.id(), libc::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("{} did not stop within {grace:?}; killing it", self.name);
        let _ = child.kill();
        let _ = child.wait();
    }

    /// SIGKILL at once (a crash, for failure tests).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

fn signal(pid: u32, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) on a PID we spawned and have not yet reaped.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// A free TCP port on loopback, for a server the tests start: picked below the kernel's
/// ephemeral range (`ip_local_port_range`, 32768 and up by default) and handed out once per
/// process. A port from the ephemeral range (what binding port 0 gives) can be taken by any
/// outgoing connection between this check and the server's bind: CI saw kube-apiserver fail
/// with "address already in use" while a second control plane started beside it.
pub fn free_port() -> anyhow::Result<u16> {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let ephemeral_from = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (lo, hi) = (ephemeral_from / 2, ephemeral_from);
    anyhow::ensure!(
        lo >= 1024,
        "the ephemeral range starts at {ephemeral_from}: no room below it"
    );
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..1000 {
        let port = fastrand::u16(lo..hi);
        if !given.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.insert(port);
            return Ok(port);
        }
    }
    anyhow::bail!("no free port found in {lo}..{hi}")
}
