//! Calls back when files change, by watching their directories (inotify on
//! Linux, through the `notify` crate).
//!
//! Not the files themselves: Kubernetes updates a Secret or ConfigMap volume
//! by writing a new timestamped directory and renaming a `..data` symlink
//! onto it, so `tls.crt` (a symlink through `..data`) changes without any
//! event on it; and editors and `mv` replace a file's inode, which ends a
//! watch on the file. A directory sees all of these.

use std::collections::HashSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use notify::event::{AccessKind, AccessMode};
use notify::{Event, EventKind, RecursiveMode, Watcher as _};

use crate::TlsError;

/// A write of several files (a certificate, then its key) comes as a burst
/// of events: one call for the burst, once it has been quiet this long.
pub const SETTLE: Duration = Duration::from_millis(100);
/// A burst that never goes quiet still calls back this often.
const SETTLE_MAX: Duration = Duration::from_secs(1);

/// Watches until dropped; the callback runs on a thread of its own.
pub struct FileWatcher {
    _watcher: notify::RecommendedWatcher,
}

impl std::fmt::Debug for FileWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileWatcher").finish_non_exhaustive()
    }
}

/// The directory a file's changes show up in.
fn directory(file: &Path) -> PathBuf {
    match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    }
}

impl FileWatcher {
    /// Calls `on_change` after each change to any of `files` (its content,
    /// its inode, or a `..`-named entry beside it, as Kubernetes' atomic
    /// writer makes). Each directory must exist; a file need not yet.
    pub fn start(
        files: &[PathBuf],
        on_change: impl FnMut() + Send + 'static,
    ) -> Result<Self, TlsError> {
        Self::start_settling(files, SETTLE, on_change)
    }

    fn start_settling(
        files: &[PathBuf],
        settle: Duration,
        on_change: impl FnMut() + Send + 'static,
    ) -> Result<Self, TlsError> {
        let (events, received) = std::sync::mpsc::channel();
        let mut watcher =
            notify::recommended_watcher(events).map_err(|source| TlsError::Watch {
                path: PathBuf::new(),
                source,
            })?;
        let mut directories = files.iter().map(|f| directory(f)).collect::<Vec<_>>();
        directories.sort();
        directories.dedup();
        for dir in &directories {
            watcher
                .watch(dir, RecursiveMode::NonRecursive)
                .map_err(|source| TlsError::Watch {
                    path: dir.clone(),
                    source,
                })?;
        }
        let names = files
            .iter()
            .filter_map(|f| f.file_name().map(OsString::from))
            .collect::<HashSet<_>>();
        // Ends when the watcher is dropped: that closes the channel.
        std::thread::Builder::new()
            .name("tls-files".into())
            .spawn(move || call_back(&received, &names, settle, on_change))
            .map_err(TlsError::WatchThread)?;
        Ok(Self { _watcher: watcher })
    }
}

/// Whether `event` may have changed one of the files named `names`.
fn concerns(event: &notify::Result<Event>, names: &HashSet<OsString>) -> bool {
    let event = match event {
        Ok(event) => event,
        // Events may have been lost (the kernel's queue overflowed):
        // reading the files again is the safe answer.
        Err(error) => {
            tracing::warn!(%error, "watching the TLS files");
            return true;
        }
    };
    // Opening and reading (our own reloads among them) change nothing.
    if let EventKind::Access(access) = event.kind
        && access != AccessKind::Close(AccessMode::Write)
    {
        return false;
    }
    event.paths.iter().any(|path| {
        path.file_name()
            .is_some_and(|name| names.contains(name) || name.as_encoded_bytes().starts_with(b".."))
    })
}

fn call_back(
    received: &Receiver<notify::Result<Event>>,
    names: &HashSet<OsString>,
    settle: Duration,
    mut on_change: impl FnMut(),
) {
    while let Ok(event) = received.recv() {
        if !concerns(&event, names) {
            continue;
        }
        let deadline = Instant::now() + SETTLE_MAX.max(settle);
        loop {
            let wait = settle.min(deadline.saturating_duration_since(Instant::now()));
            match received.recv_timeout(wait) {
                Ok(_) if !wait.is_zero() => continue,
                Ok(_) | Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
        on_change();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    /// Long enough for an event on a loaded machine; a wait that ends
    /// sooner is the test's answer.
    const EVENT: Duration = Duration::from_secs(10);
    /// How long to listen for a call that must not come.
    const QUIET: Duration = Duration::from_millis(600);

    fn watch(files: &[PathBuf]) -> (FileWatcher, mpsc::Receiver<()>) {
        let (calls, called) = mpsc::channel();
        let watcher = FileWatcher::start_settling(files, Duration::from_millis(50), move || {
            let _ = calls.send(());
        })
        .expect("watch");
        (watcher, called)
    }

    fn no_more_calls(called: &mpsc::Receiver<()>) -> bool {
        called.recv_timeout(QUIET).is_err()
    }

    #[test]
    fn a_rewrite_and_a_replaced_inode_call_back_and_reads_do_not() {
        let dir = tempfile::tempdir().expect("dir");
        let cert = dir.path().join("tls.crt");
        std::fs::write(&cert, "one").expect("write");
        let (_watcher, called) = watch(std::slice::from_ref(&cert));

        std::fs::write(&cert, "two").expect("rewrite");
        called.recv_timeout(EVENT).expect("a call for the rewrite");
        assert!(no_more_calls(&called), "one call for one write");

        // What editors and `mv` do: a new inode renamed over the file.
        let next = dir.path().join("tls.crt.new");
        std::fs::write(&next, "three").expect("write");
        std::fs::rename(&next, &cert).expect("rename");
        called.recv_timeout(EVENT).expect("a call for the rename");
        assert!(no_more_calls(&called));

        // Reading the file, as a reload does, is no change.
        assert_eq!(std::fs::read_to_string(&cert).expect("read"), "three");
        // Nor is another file of the directory.
        std::fs::write(dir.path().join("unrelated.txt"), "x").expect("write");
        assert!(no_more_calls(&called), "a read or another file called back");
    }

    /// Kubernetes' atomic writer: the visible names are symlinks through
    /// `..data`, which is renamed onto a new timestamped directory.
    #[test]
    fn a_secret_volume_update_calls_back() {
        let dir = tempfile::tempdir().expect("dir");
        let volume = dir.path();
        let version = |name: &str, text: &str| {
            let data = volume.join(name);
            std::fs::create_dir(&data).expect("version dir");
            std::fs::write(data.join("tls.crt"), text).expect("write");
        };
        version("..2024_01_01", "one");
        std::os::unix::fs::symlink("..2024_01_01", volume.join("..data")).expect("..data");
        std::os::unix::fs::symlink("..data/tls.crt", volume.join("tls.crt")).expect("tls.crt");
        let cert = volume.join("tls.crt");
        let (_watcher, called) = watch(std::slice::from_ref(&cert));

        version("..2024_01_02", "two");
        std::os::unix::fs::symlink("..2024_01_02", volume.join("..data_tmp")).expect("tmp");
        std::fs::rename(volume.join("..data_tmp"), volume.join("..data")).expect("swap");
        std::fs::remove_dir_all(volume.join("..2024_01_01")).expect("old version");

        called.recv_timeout(EVENT).expect("a call for the swap");
        assert_eq!(std::fs::read_to_string(&cert).expect("read"), "two");
        assert!(no_more_calls(&called), "one call for one update");
    }

    #[test]
    fn files_in_two_directories_are_both_watched() {
        let one = tempfile::tempdir().expect("dir");
        let two = tempfile::tempdir().expect("dir");
        let ca = one.path().join("ca.crt");
        let key = two.path().join("tls.key");
        let (_watcher, called) = watch(&[ca.clone(), key.clone()]);
        std::fs::write(&ca, "ca").expect("write");
        called.recv_timeout(EVENT).expect("a call for the CA");
        std::fs::write(&key, "key").expect("write");
        called.recv_timeout(EVENT).expect("a call for the key");
    }

    #[test]
    fn a_missing_directory_is_an_error() {
        let dir = tempfile::tempdir().expect("dir");
        let missing = dir.path().join("nowhere").join("tls.crt");
        let error = FileWatcher::start(&[missing], || {}).expect_err("no directory");
        assert!(error.to_string().contains("nowhere"), "{error}");
    }

    #[test]
    fn a_dropped_watcher_calls_no_more() {
        let dir = tempfile::tempdir().expect("dir");
        let cert = dir.path().join("tls.crt");
        let (watcher, called) = watch(std::slice::from_ref(&cert));
        drop(watcher);
        std::fs::write(&cert, "after").expect("write");
        assert!(no_more_calls(&called));
    }
}
