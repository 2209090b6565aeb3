//! `tank bench-engine --awake`: the CPUs kept out of halt while a benchmark runs, and what
//! the machine says about its idle states.
//!
//! # Theory of operation
//! A FUSE metadata operation is a chain of wake-ups: the caller sleeps while a server thread
//! works, then the reply wakes the caller, and the scheduler puts it on an idle CPU when
//! there is one. On a virtual machine whose guest does not poll before halting (cpuidle's
//! `haltpoll` with `guest_halt_poll_ns=0`) waking a halted vCPU is a trip through the
//! hypervisor of tens of microseconds: more than tank's own work for a create or an unlink,
//! so every FUSE server's small-file rates are mostly the platform's.
//!
//! `Awake` holds one thread per CPU this process may run on, pinned there at `SCHED_IDLE`
//! priority, spinning until it is dropped. A `SCHED_IDLE` thread runs only when nothing else
//! wants its CPU and yields as soon as something does, so the CPUs stop halting without
//! taking time from any task: the effect of halt polling, applied to every system a run
//! measures alike. It is a measurement condition, off by default and named in the report;
//! tank does not spin in normal service (an operator who turned halt polling off chose to
//! give idle time back to the host).

#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{bail, Result};
use parking_lot::Mutex;

/// Thread ids of the running spinners (a benchmark's CPU time leaves theirs out).
static SPINNERS: Mutex<Vec<libc::pid_t>> = Mutex::new(Vec::new());

/// Spinning idle-priority threads, one per CPU; they stop when this is dropped.
pub struct Awake {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Awake {
    /// Starts a spinner on every CPU of the process's affinity mask. Fails if the mask
    /// cannot be read or a spinner cannot lower itself to `SCHED_IDLE` (a spinner at normal
    /// priority would take CPU time from what is measured).
    pub fn start() -> Result<Awake> {
        let cpus = allowed_cpus()?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut awake = Awake {
            stop: stop.clone(),
            threads: Vec::new(),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        for cpu in cpus {
            let (stop, tx) = (stop.clone(), tx.clone());
            let t = std::thread::Builder::new()
                .name(format!("awake-{cpu}"))
                .spawn(move || {
                    // SAFETY: gettid has no arguments and cannot fail.
                    let tid = unsafe { libc::gettid() };
                    SPINNERS.lock().push(tid);
                    let ready = idle_priority_on(cpu);
                    let ok = ready.is_ok();
                    let _ = tx.send(ready);
                    drop(tx);
                    while ok && !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                    SPINNERS.lock().retain(|&t| t != tid);
                })?;
            awake.threads.push(t);
        }
        drop(tx);
        for _ in 0..awake.threads.len() {
            // On an error `awake` is dropped here, which stops and joins the others.
            rx.recv()??;
        }
        Ok(awake)
    }

    /// Spinners running.
    pub fn count(&self) -> usize {
        self.threads.len()
    }
}

impl Drop for Awake {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// User and system CPU seconds in a /proc `stat` file (of a process or a thread).
pub fn stat_cpu_seconds(path: &str) -> f64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            let rest = s.rsplit_once(')')?.1.to_string();
            let f: Vec<&str> = rest.split_whitespace().collect();
            let utime: f64 = f.get(11)?.parse().ok()?;
            let stime: f64 = f.get(12)?.parse().ok()?;
            // The kernel's USER_HZ, 100 on every Linux architecture tank builds for.
            Some((utime + stime) / 100.0)
        })
        .unwrap_or(0.0)
}

/// CPU seconds the running spinners have used.
pub fn spinners_cpu_seconds() -> f64 {
    SPINNERS
        .lock()
        .iter()
        .map(|tid| stat_cpu_seconds(&format!("/proc/self/task/{tid}/stat")))
        .sum()
}

/// The CPUs the calling thread may run on.
fn allowed_cpus() -> Result<Vec<usize>> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set, filled by the kernel; CPU_ISSET reads
    // within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            bail!(
                "cannot read the CPU affinity: {}",
                std::io::Error::last_os_error()
            );
        }
        Ok((0..8 * std::mem::size_of::<libc::cpu_set_t>())
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect())
    }
}

/// Pins the calling thread to `cpu` and lowers it to `SCHED_IDLE`.
fn idle_priority_on(cpu: usize) -> Result<()> {
    // SAFETY: as in `allowed_cpus`; sched_param is a plain struct the call only reads.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            bail!(
                "cannot pin a spinner to CPU {cpu}: {}",
                std::io::Error::last_os_error()
            );
        }
        let param = libc::sched_param { sched_priority: 0 };
        if libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) != 0 {
            bail!(
                "cannot lower a spinner to SCHED_IDLE: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    Ok(())
}

/// What the machine says about its CPUs' idle states, for a benchmark's report: the cpuidle
/// driver and governor, and the guest halt-polling window where the `haltpoll` governor has
/// one (0: a halted vCPU is woken through the hypervisor every time).
pub fn idle_states() -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let driver = read("/sys/devices/system/cpu/cpuidle/current_driver");
    let governor = read("/sys/devices/system/cpu/cpuidle/current_governor")
        .or_else(|| read("/sys/devices/system/cpu/cpuidle/current_governor_ro"));
    let poll = read("/sys/module/haltpoll/parameters/guest_halt_poll_ns");
    let mut out = format!(
        "cpuidle driver {}, governor {}",
        driver.as_deref().unwrap_or("none"),
        governor.as_deref().unwrap_or("none")
    );
    if governor.as_deref() == Some("haltpoll") {
        if let Some(ns) = poll {
            out.push_str(&format!(", guest halt polling {ns} ns"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scheduling policy of thread `tid`, from /proc (field 41 of stat).
    fn policy_of(tid: &str) -> Option<i32> {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
        let rest = stat.rsplit_once(')')?.1;
        rest.split_whitespace().nth(38)?.parse().ok()
    }

    fn spinners() -> Vec<(String, Option<i32>)> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .filter_map(|e| {
                let tid = e.file_name().to_string_lossy().into_owned();
                let comm = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).ok()?;
                comm.starts_with("awake-")
                    .then(|| (comm.trim().to_string(), policy_of(&tid)))
            })
            .collect()
    }

    #[test]
    fn one_idle_priority_spinner_per_cpu_until_dropped() {
        let cpus = allowed_cpus().unwrap();
        assert!(!cpus.is_empty());
        let awake = Awake::start().unwrap();
        assert_eq!(awake.count(), cpus.len());
        let running = spinners();
        assert_eq!(running.len(), cpus.len(), "{running:?}");
        for (name, policy) in &running {
            assert_eq!(*policy, Some(libc::SCHED_IDLE), "{name}");
        }
        // The spinners use what the CPUs have left (a little even on a busy machine: idle
        // priority still gets a share), and the count sees it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while spinners_cpu_seconds() == 0.0 {
            assert!(std::time::Instant::now() < deadline, "no spinner ran");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        drop(awake);
        assert!(spinners().is_empty());
        assert_eq!(spinners_cpu_seconds(), 0.0);
    }

    #[test]
    fn idle_states_names_the_driver_and_governor() {
        let s = idle_states();
        assert!(s.starts_with("cpuidle driver "), "{s}");
        assert!(s.contains(", governor "), "{s}");
    }
}
