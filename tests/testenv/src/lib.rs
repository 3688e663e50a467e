//! testenv: boots a real Kubernetes control plane on 127.0.0.1, the way
//! controller-runtime's envtest does (etcd + kube-apiserver with TLS, RBAC
//! and service-account keys, plus kube-controller-manager running only the
//! namespace controller), and runs the project's real binaries against it.
//!
//! Every process is killed when its handle drops, including during a panic,
//! and is started with PR_SET_PDEATHSIG so it also dies if the harness is
//! killed outright.

pub mod certs;
mod process;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use process::Process;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{command} failed ({status}): {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(Duration, String),
}

pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

/// The repository root (this crate lives in tests/testenv).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Where cargo put this workspace's binaries (target/debug or target/release).
pub fn cargo_bin(name: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("PETSTORE_BIN_DIR") {
        return PathBuf::from(dir).join(name);
    }
    // Test executables live in target/<profile>/deps; binaries one level up.
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.join(name)
}

/// The control-plane tool binaries, built once by hack/control-plane/build.sh
/// into a cache outside the clone.
pub struct Tools {
    pub dir: PathBuf,
}

impl Tools {
    pub fn get() -> Result<&'static Tools> {
        static TOOLS: OnceLock<std::result::Result<Tools, String>> = OnceLock::new();
        TOOLS
            .get_or_init(|| {
                let script = repo_root().join("hack/control-plane/build.sh");
                let out = Command::new("bash")
                    .arg(&script)
                    .output()
                    .map_err(|e| format!("running {}: {e}", script.display()))?;
                if !out.status.success() {
                    return Err(format!(
                        "{} failed: {}",
                        script.display(),
                        String::from_utf8_lossy(&out.stderr)
                    ));
                }
                let dir = String::from_utf8_lossy(&out.stdout).trim().to_owned();
                Ok(Tools { dir: dir.into() })
            })
            .as_ref()
            .map_err(|message| Error::Command {
                command: "hack/control-plane/build.sh".into(),
                status: "error".into(),
                stderr: message.clone(),
            })
    }

    pub fn bin(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The cached kubectl if build.sh had to build one, else the machine's.
    pub fn kubectl(&self) -> PathBuf {
        let cached = self.bin("kubectl");
        if cached.exists() {
            cached
        } else {
            PathBuf::from("kubectl")
        }
    }
}

/// A TCP port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(io("finding a free port"))?;
    Ok(listener
        .local_addr()
        .map_err(io("finding a free port"))?
        .port())
}

/// Polls `check` until it yields a value or `timeout` passes.
pub fn wait_for<T>(
    timeout: Duration,
    what: &str,
    mut check: impl FnMut() -> Option<T>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout(timeout, what.to_owned()));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs a command and returns its stdout, or an error carrying its stderr.
pub fn run(command: &mut Command) -> Result<String> {
    let out = command
        .output()
        .map_err(io(format!("running {command:?}")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Error::Command {
            command: format!("{command:?}"),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

pub mod control_plane;
pub mod petstore;
pub mod postgres;

pub use control_plane::ControlPlane;
pub use petstore::{Operator, OperatorOptions, PetStoreServer, PostgresTarget, Storage};
pub mod bench;
pub mod chaos;
// A real one-node cluster (node, registry, Tilt) for the Tilt quick start.
pub mod cluster;
pub mod env;
pub mod forwarder;
pub use env::Env;
/// The original store's four RPCs only, for the ownership tests.
pub mod legacy_store;
