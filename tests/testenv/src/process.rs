//! A child process that is killed when its handle drops.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::{Result, io};

pub struct Process {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl Process {
    /// Starts `command` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut command: Command, log: &Path) -> Result<Self> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .map_err(io(format!("opening {}", log.display())))?;
        let err = out.try_clone().map_err(io("cloning a log handle"))?;
        command.stdin(Stdio::null()).stdout(out).stderr(err);
        // SAFETY: prctl is async-signal-safe and touches no memory of ours.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command
            .spawn()
            .map_err(io(format!("starting {name} ({command:?})")))?;
        Ok(Self {
            name: name.to_owned(),
            child: Some(child),
            log: log.to_owned(),
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last `lines` lines of the process's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    pub fn log_contains(&self, needle: &str) -> bool {
        std::fs::read_to_string(&self.log)
            .map(|text| text.contains(needle))
            .unwrap_or(false)
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGKILL, like `kill -9`, and reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then wait up to `grace` before SIGKILL. Returns true if the
    /// process exited by itself with status 0.
    pub fn terminate(&mut self, grace: std::time::Duration) -> bool {
        let Some(mut child) = self.child.take() else {
            return false;
        };
        if let Ok(pid) = i32::try_from(child.id()) {
            // SAFETY: plain syscall on our own child's PID.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let deadline = std::time::Instant::now() + grace;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return status.success();
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if std::thread::panicking() && self.child.is_some() {
            eprintln!(
                "---- last lines of {} ({}) ----\n{}",
                self.name,
                self.log.display(),
                self.log_tail(40)
            );
        }
        self.kill();
    }
}
