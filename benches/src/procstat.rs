//! Peak RSS and CPU time of a process, from /proc.

fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
}

/// Peak resident set size (VmHWM) in KiB.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmHWM:")
}

/// Resident set size now (VmRSS) in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS:")
}

/// The fields of /proc/PID/stat after the parenthesised command name (which
/// may hold spaces): the state is field 0 here, the 3rd of the whole line.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.get(stat.rfind(')')? + 2..)?;
    Some(after.split_whitespace().map(str::to_owned).collect())
}

/// The parent's process ID.
pub fn parent_pid(pid: u32) -> Option<u32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

/// User plus system CPU seconds so far.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    // utime and stime are the 14th and 15th fields of the whole line.
    let fields = stat_fields(pid)?;
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some((utime + stime) / ticks)
}

/// Samples a process's resident memory every 10 ms on a thread of its own,
/// until [`PeakRss::stop`]: catches a peak above where the process started
/// (VmHWM keeps the peak of its whole life).
pub struct PeakRss {
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    sampler: std::thread::JoinHandle<u64>,
}

impl PeakRss {
    pub fn start(pid: u32) -> Self {
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sampler = {
            let done = std::sync::Arc::clone(&done);
            std::thread::spawn(move || {
                // Sampled before `done` is read: a window so short (or a
                // machine so busy) that stop() comes before this thread
                // first runs still has one sample, not a peak of 0.
                let mut peak = 0;
                loop {
                    peak = peak.max(rss_kib(pid).unwrap_or(0));
                    if done.load(std::sync::atomic::Ordering::Relaxed) {
                        return peak;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            })
        };
        Self { done, sampler }
    }

    /// The highest RSS sampled, in KiB.
    pub fn stop(self) -> u64 {
        self.done.store(true, std::sync::atomic::Ordering::Relaxed);
        self.sampler.join().unwrap_or(0)
    }
}

/// CPU seconds used by each of a set of processes since [`CpuMeter::start`];
/// a process that is not there (None) used none.
pub struct CpuMeter {
    start: Vec<Option<(u32, f64)>>,
}

impl CpuMeter {
    pub fn start(pids: &[Option<u32>]) -> Self {
        Self {
            start: pids
                .iter()
                .map(|pid| pid.map(|pid| (pid, cpu_seconds(pid).unwrap_or(0.0))))
                .collect(),
        }
    }

    /// CPU seconds per process since the start, in the order given.
    pub fn used(&self) -> Vec<f64> {
        self.start
            .iter()
            .map(|start| {
                start.map_or(0.0, |(pid, start)| {
                    (cpu_seconds(pid).unwrap_or(start) - start).max(0.0)
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_this_process() {
        let pid = std::process::id();
        assert!(super::peak_rss_kib(pid).is_some_and(|k| k > 0));
        assert!(super::rss_kib(pid).is_some_and(|k| k > 0));
        assert!(super::cpu_seconds(pid).is_some_and(|s| s >= 0.0));
        assert_eq!(
            super::parent_pid(pid),
            Some(std::os::unix::process::parent_id())
        );
    }

    #[test]
    fn the_peak_sampler_reads_this_process() {
        let peak = super::PeakRss::start(std::process::id());
        std::thread::sleep(std::time::Duration::from_millis(30));
        assert!(peak.stop() > 0);
        // Stopped at once, before its thread may even have run.
        assert!(super::PeakRss::start(std::process::id()).stop() > 0);
    }

    #[test]
    fn a_meter_counts_cpu_used_since_its_start() {
        let meter = super::CpuMeter::start(&[Some(std::process::id()), None]);
        // Burn a little CPU (at least one clock tick) in this process.
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < std::time::Duration::from_millis(100) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let used = meter.used();
        assert!(used[0] > 0.0, "{used:?}");
        assert_eq!(used[1], 0.0, "an absent process used no CPU");
    }
}
