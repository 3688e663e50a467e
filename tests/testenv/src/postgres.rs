//! A real PostgreSQL server for tests and benchmarks: `initdb` into a
//! temporary directory, listening on 127.0.0.1 only (no Unix socket), on a
//! free port, with a random password kept in a file. Stopped, and its files
//! removed, when the handle drops.
//!
//! PostgreSQL refuses to run as root; under root the server runs as the
//! `postgres` user (or `nobody`).

use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::{Error, Process, Result, free_port, io, run, wait_for};

/// The user the database runs as, when the harness runs as root.
#[derive(Clone, Copy, Debug)]
struct RunAs {
    uid: libc::uid_t,
    gid: libc::gid_t,
}

fn run_as() -> Option<RunAs> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    for name in ["postgres", "nobody"] {
        let Ok(cname) = CString::new(name) else {
            continue;
        };
        // SAFETY: getpwnam returns a pointer into static storage or null; we
        // copy the two fields at once, before any other call can reuse it.
        let entry = unsafe { libc::getpwnam(cname.as_ptr()) };
        if !entry.is_null() {
            // SAFETY: checked non-null above.
            let (uid, gid) = unsafe { ((*entry).pw_uid, (*entry).pw_gid) };
            return Some(RunAs { uid, gid });
        }
    }
    None
}

fn as_user(command: &mut Command, user: Option<RunAs>) {
    if let Some(RunAs { uid, gid }) = user {
        // SAFETY: only async-signal-safe syscalls between fork and exec.
        unsafe {
            command.pre_exec(move || {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
}

fn chown(path: &Path, user: Option<RunAs>) -> Result<()> {
    if let Some(RunAs { uid, gid }) = user {
        std::os::unix::fs::chown(path, Some(uid), Some(gid)).map_err(io(format!(
            "handing {} to the database user",
            path.display()
        )))?;
    }
    Ok(())
}

/// The folder of `initdb`, `postgres` and `psql`: `PETSTORE_POSTGRES_BIN`,
/// else the newest `/usr/lib/postgresql/<major>/bin` (Debian's layout).
pub fn bin_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("PETSTORE_POSTGRES_BIN") {
        return Ok(dir.into());
    }
    let root = Path::new("/usr/lib/postgresql");
    let newest = std::fs::read_dir(root)
        .ok()
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let major: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("postgres").exists().then_some((major, bin))
        })
        .max();
    newest.map(|(_, bin)| bin).ok_or_else(|| Error::Command {
        command: "finding PostgreSQL".into(),
        status: "not installed".into(),
        stderr: "no /usr/lib/postgresql/<version>/bin/postgres; install Debian's `postgresql` package or set PETSTORE_POSTGRES_BIN".into(),
    })
}

pub const USER: &str = "petstore";

pub struct Postgres {
    process: Process,
    pub port: u16,
    /// The password of [`USER`], alone in a file, as a mounted Secret would be.
    pub password_file: PathBuf,
    password: String,
    bin: PathBuf,
    dir: PathBuf,
    _temp: Option<tempfile::TempDir>,
}

/// Settings for [`Postgres::start_with`].
#[derive(Clone, Copy, Debug)]
pub struct PostgresOptions {
    /// Off for tests (speed); on for benchmarks, so commits cost what they
    /// would in production.
    pub fsync: bool,
}

impl Postgres {
    /// A server for tests (no fsync), removed on drop.
    pub fn start() -> Result<Self> {
        Self::start_with(PostgresOptions { fsync: false })
    }

    pub fn start_with(options: PostgresOptions) -> Result<Self> {
        let temp = tempfile::Builder::new()
            .prefix("petstore-postgres-")
            .tempdir()
            .map_err(io("creating the database directory"))?;
        let mut server = Self::start_in(temp.path(), options)?;
        server._temp = Some(temp);
        Ok(server)
    }

    fn start_in(dir: &Path, options: PostgresOptions) -> Result<Self> {
        let bin = bin_dir()?;
        let user = run_as();
        chown(dir, user)?;
        let password: String = std::iter::repeat_with(fastrand::alphanumeric)
            .take(24)
            .collect();
        let password_file = dir.join("password");
        std::fs::write(&password_file, format!("{password}\n"))
            .map_err(io("writing the password file"))?;
        chown(&password_file, user)?;
        let data = dir.join("data");

        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .current_dir(dir)
            .arg("-D")
            .arg(&data)
            .args(["-U", USER, "--auth=scram-sha-256", "-E", "UTF8"])
            .args(["--locale=C", "--no-sync"])
            .arg(format!("--pwfile={}", password_file.display()));
        as_user(&mut initdb, user);
        run(&mut initdb)?;

        let port = free_port()?;
        let log = dir.join("postgres.log");
        std::fs::File::create(&log).map_err(io("creating the database log"))?;
        chown(&log, user)?;
        let mut command = Command::new(bin.join("postgres"));
        command
            .current_dir(dir)
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "unix_socket_directories="])
            .args(["-c", "max_connections=300"])
            .args([
                "-c",
                if options.fsync {
                    "fsync=on"
                } else {
                    "fsync=off"
                },
            ])
            .args(["-c", "log_min_messages=warning"]);
        as_user(&mut command, user);
        let process = Process::spawn("postgres", command, &log)?;
        let server = Self {
            process,
            port,
            password_file,
            password,
            bin,
            dir: dir.to_owned(),
            _temp: None,
        };
        wait_for(
            Duration::from_secs(60),
            "PostgreSQL to accept connections",
            || server.psql("postgres", "SELECT 1").ok(),
        )?;
        Ok(server)
    }

    /// `postgres://petstore@127.0.0.1:<port>/<database>`, without the
    /// password (that is in [`Postgres::password_file`]).
    pub fn url(&self, database: &str) -> String {
        format!("postgres://{USER}@127.0.0.1:{}/{database}", self.port)
    }

    /// Runs SQL with psql as the owner and returns its unaligned output.
    pub fn psql(&self, database: &str, sql: &str) -> Result<String> {
        run(Command::new(self.bin.join("psql"))
            .env("PGPASSWORD", &self.password)
            .env("PGCONNECT_TIMEOUT", "5")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", USER])
            .args([
                "-d",
                database,
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
            ])
            .args(["-c", sql]))
    }

    /// Creates an empty database and returns its URL.
    pub fn create_database(&self, name: &str) -> Result<String> {
        self.psql("postgres", &format!("CREATE DATABASE \"{name}\""))?;
        Ok(self.url(name))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn process(&self) -> &Process {
        &self.process
    }

    /// Fast shutdown (SIGINT: disconnect clients, checkpoint, exit).
    fn stop(&mut self) {
        if let Some(pid) = self.process.pid().and_then(|p| i32::try_from(p).ok()) {
            // SAFETY: a signal to our own, not yet reaped, child.
            unsafe {
                libc::kill(pid, libc::SIGINT);
            }
            for _ in 0..100 {
                if !self.process.is_running() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        self.process.kill();
    }
}

/// At exit, for the shared server, whose handle is never dropped.
fn stop_pid(pid: i32) {
    // SAFETY: signals and waitpid on our own child.
    unsafe {
        libc::kill(pid, libc::SIGINT);
        for _ in 0..100 {
            let mut status = 0;
            if libc::waitpid(pid, &mut status, libc::WNOHANG) != 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        libc::kill(pid, libc::SIGKILL);
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Connection details of the server [`shared`] started.
#[derive(Clone, Debug)]
pub struct SharedPostgres {
    pub port: u16,
    pub password_file: PathBuf,
    password: String,
    bin: PathBuf,
}

impl SharedPostgres {
    pub fn url(&self, database: &str) -> String {
        format!("postgres://{USER}@127.0.0.1:{}/{database}", self.port)
    }

    /// Creates an empty database with a unique name and returns its URL.
    pub fn new_database(&self, prefix: &str) -> Result<String> {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("{prefix}_{n}");
        run(Command::new(self.bin.join("psql"))
            .env("PGPASSWORD", &self.password)
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", USER])
            .args(["-d", "postgres", "-X", "-q", "-v", "ON_ERROR_STOP=1"])
            .args(["-c", &format!("CREATE DATABASE \"{name}\"")]))?;
        Ok(self.url(&name))
    }
}

static SHARED_PID: OnceLock<(i32, PathBuf)> = OnceLock::new();

extern "C" fn stop_shared() {
    if let Some((pid, dir)) = SHARED_PID.get() {
        stop_pid(*pid);
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// One server for a whole test binary, started on first use (many tests
/// each take their own database in it), stopped and removed when the test
/// binary exits.
pub fn shared() -> Result<&'static SharedPostgres> {
    static SHARED: OnceLock<std::result::Result<SharedPostgres, String>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            // The server is a child of a thread that never ends: children are
            // started with PR_SET_PDEATHSIG, which fires when the *thread*
            // that started them exits, and test threads come and go.
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::Builder::new()
                .name("shared-postgres".into())
                .spawn(move || {
                    let started = tempfile::Builder::new()
                        .prefix("petstore-postgres-")
                        .tempdir()
                        .map_err(io("creating the database directory"))
                        .and_then(|temp| {
                            let dir = temp.keep();
                            Postgres::start_in(&dir, PostgresOptions { fsync: false })
                        });
                    match started {
                        Ok(server) => {
                            let info = SharedPostgres {
                                port: server.port,
                                password_file: server.password_file.clone(),
                                password: server.password.clone(),
                                bin: server.bin.clone(),
                            };
                            if let Some(pid) =
                                server.process.pid().and_then(|p| i32::try_from(p).ok())
                            {
                                let _ = SHARED_PID.set((pid, server.dir.clone()));
                                // SAFETY: registers a plain function to run at exit.
                                unsafe {
                                    libc::atexit(stop_shared);
                                }
                            }
                            let _ = tx.send(Ok(info));
                            // Keep the server (and this thread) for the life
                            // of the process; `stop_shared` ends it.
                            let _server = server;
                            loop {
                                std::thread::park();
                            }
                        }
                        Err(err) => {
                            let _ = tx.send(Err(err.to_string()));
                        }
                    }
                })
                .map_err(|e| e.to_string())?;
            rx.recv().map_err(|e| e.to_string())?
        })
        .as_ref()
        .map_err(|message| Error::Command {
            command: "starting PostgreSQL".into(),
            status: "error".into(),
            stderr: message.clone(),
        })
}
