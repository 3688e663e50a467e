//! The store's change feed (WatchPets) against the real binary, written to
//! and read with grpcurl: a durable store across `kill -9`, and two
//! PostgreSQL replicas whose watchers see one sequence.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use fixtures::petstore::{added_id, grpcurl};
use fixtures::postgres::Postgres;
use fixtures::{Error, Process, Result, Tools, cargo_bin, free_port, wait_for};
use serde_json::Value;

const PATIENCE: Duration = Duration::from_secs(30);

/// A store process on a free loopback port, with the flags the feed tests
/// need; `restart` starts it again on the same address and data file.
struct Store {
    process: Process,
    addr: String,
    args: Vec<String>,
    envs: Vec<(String, PathBuf)>,
    log: PathBuf,
}

impl Store {
    fn start(dir: &Path, name: &str, args: &[&str], envs: &[(&str, &Path)]) -> Result<Self> {
        let addr = format!("127.0.0.1:{}", free_port()?);
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let envs: Vec<(String, PathBuf)> = envs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_path_buf()))
            .collect();
        let log = dir.join(format!("{name}.log"));
        let store = Self {
            process: spawn(&addr, &args, &envs, &log)?,
            addr,
            args,
            envs,
            log,
        };
        store.wait_serving()?;
        Ok(store)
    }

    fn wait_serving(&self) -> Result<()> {
        wait_for(PATIENCE, "the store to serve", || {
            grpcurl(&self.addr, "grpc.health.v1.Health/Check", "{}")
                .ok()
                .filter(|out| out.first().is_some_and(|v| v["status"] == "SERVING"))
        })
        .map(drop)
    }

    /// `kill -9`, then the same binary, flags and data again.
    fn kill_9_and_restart(&mut self) -> Result<()> {
        self.process.kill();
        self.process = spawn(&self.addr, &self.args, &self.envs, &self.log)?;
        self.wait_serving()
    }

    fn call(&self, method: &str, data: &str) -> Result<Vec<Value>> {
        grpcurl(&self.addr, &format!("petstore.PetStore/{method}"), data)
    }

    fn add(&self, name: &str) -> Result<String> {
        let out = self.call(
            "AddPets",
            &format!(
                r#"{{"pets":[{{"name":"{name}","type":"PTCanine","birthday":{{"year":2021,"month":4,"day":1}}}}]}}"#
            ),
        )?;
        Ok(added_id(&out).unwrap_or_default().to_owned())
    }

    /// A grpcurl `WatchPets` stream after `after`, reading into a file.
    fn watch(&self, after: i64, out: &Path) -> Result<Watch> {
        let file = std::fs::File::create(out).map_err(fixtures::io("creating a watch log"))?;
        let child = Command::new(Tools::get()?.bin("grpcurl"))
            .args([
                "-plaintext",
                "-d",
                &format!(r#"{{"after_revision": {after}}}"#),
            ])
            .args([&self.addr, "petstore.PetStore/WatchPets"])
            .stdout(file)
            .stderr(Stdio::null())
            .spawn()
            .map_err(fixtures::io("starting grpcurl WatchPets"))?;
        Ok(Watch {
            child,
            out: out.to_owned(),
        })
    }
}

fn spawn(addr: &str, args: &[String], envs: &[(String, PathBuf)], log: &Path) -> Result<Process> {
    let mut command = Command::new(cargo_bin("petstore-server")?);
    command
        .args(["--listen", addr, "--metrics-listen", "127.0.0.1:0"])
        .args(["--watch-progress-interval", "200ms"])
        .args(args);
    for (key, value) in envs {
        command.env(key, value);
    }
    Process::spawn("petstore-server", command, log)
}

/// A running grpcurl WatchPets; killed when dropped.
struct Watch {
    child: std::process::Child,
    out: PathBuf,
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Watch {
    /// Every complete message printed so far.
    fn messages(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        serde_json::Deserializer::from_str(&text)
            .into_iter::<Value>()
            .map_while(std::result::Result::ok)
            .collect()
    }

    /// Waits for `count` changes, then returns them.
    fn changes(&self, count: usize) -> Result<Vec<Value>> {
        wait_for(PATIENCE, &format!("{count} changes from grpcurl"), || {
            let changes = all_changes(&self.messages());
            (changes.len() >= count).then_some(changes)
        })
    }
}

fn all_changes(messages: &[Value]) -> Vec<Value> {
    messages
        .iter()
        .flat_map(|m| m["changes"].as_array().cloned().unwrap_or_default())
        .collect()
}

/// protojson writes int64 as a string and leaves out zero.
fn int64(value: &Value) -> i64 {
    match value {
        Value::String(text) => text.parse().unwrap_or(-1),
        Value::Number(number) => number.as_i64().unwrap_or(-1),
        _ => 0,
    }
}

fn revisions(changes: &[Value]) -> Vec<i64> {
    changes.iter().map(|c| int64(&c["revision"])).collect()
}

fn kinds(changes: &[Value]) -> Vec<&str> {
    changes
        .iter()
        .map(|c| c["kind"].as_str().unwrap_or("?"))
        .collect()
}

/// grpcurl's WatchPets run to the end of its stream (or `max_time`
/// seconds): the messages it printed and its stderr.
fn watch_once(addr: &str, after: i64, max_time: &str) -> Result<(Vec<Value>, String)> {
    let out = Command::new(Tools::get()?.bin("grpcurl"))
        .args(["-plaintext", "-max-time", max_time])
        .args(["-d", &format!(r#"{{"after_revision": {after}}}"#)])
        .args([addr, "petstore.PetStore/WatchPets"])
        .output()
        .map_err(fixtures::io("running grpcurl WatchPets"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let messages = serde_json::Deserializer::from_str(&text)
        .into_iter::<Value>()
        .map_while(std::result::Result::ok)
        .collect();
    Ok((messages, String::from_utf8_lossy(&out.stderr).into_owned()))
}

fn check(ok: bool, what: impl Into<String>) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::Command {
            command: "change feed check".into(),
            status: "failed".into(),
            stderr: what.into(),
        })
    }
}

#[test]
fn durable_feed_resumes_across_kill_9_and_compacts() -> Result<()> {
    let dir = tempfile::tempdir().map_err(fixtures::io("making a temporary directory"))?;
    let data = dir.path().join("pets.redb");
    let data = data.to_string_lossy();
    let mut store = Store::start(
        dir.path(),
        "durable",
        &[
            "--storage",
            "durable",
            "--data-file",
            &data,
            "--watch-history",
            "5",
        ],
        &[],
    )?;
    let thor = store.add("Thor")?;
    let tron = store.add("Tron")?;
    store.call(
        "UpdatePets",
        &format!(
            r#"{{"pets":[{{"id":"{thor}","name":"Thor II","type":"PTCanine","birthday":{{"year":2021,"month":4,"day":1}}}}]}}"#
        ),
    )?;
    // From now: one progress message at the current revision.
    let (first, _) = watch_once(&store.addr, 0, "1")?;
    let seen = first.first().map(|m| int64(&m["revision"]));
    check(
        seen == Some(3),
        format!("progress at revision 3: {first:?}"),
    )?;

    store.kill_9_and_restart()?;
    store.call(
        "SetIdempotencyKeys",
        &format!(r#"{{"changes":[{{"id":"{thor}","newKey":"uid-thor"}}]}}"#),
    )?;
    store.call("DeletePets", &format!(r#"{{"ids":["{tron}"]}}"#))?;

    // Resumed after revision 1, on the restarted store: exactly 2..=5.
    let watch = store.watch(1, &dir.path().join("resumed.json"))?;
    let changes = watch.changes(4)?;
    check(
        revisions(&changes) == [2, 3, 4, 5],
        format!("revisions 2 to 5: {changes:?}"),
    )?;
    check(
        kinds(&changes) == ["CREATED", "UPDATED", "KEY_CHANGED", "DELETED"],
        format!("kinds: {changes:?}"),
    )?;
    check(
        changes[1]["pet"]["name"] == "Thor II"
            && changes[2]["pet"]["idempotencyKey"] == "uid-thor"
            && changes[3]["id"] == tron.as_str()
            && changes[3]["pet"]["name"] == "Tron",
        format!("records: {changes:?}"),
    )?;
    // Live: a change made now arrives on the open stream.
    store.add("Live")?;
    let changes = watch.changes(5)?;
    check(
        revisions(&changes) == [2, 3, 4, 5, 6],
        format!("the live change: {changes:?}"),
    )?;
    drop(watch);

    // History keeps 5 changes, now 2..=6: one more write drops revision 2,
    // so a client that saw only revision 1 must re-read.
    store.add("Compactor")?;
    let (messages, stderr) = watch_once(&store.addr, 1, "5")?;
    check(
        messages.is_empty()
            && stderr.contains("OutOfRange")
            && stderr.contains("after_revision 1 is compacted: history starts after revision 2"),
        format!("compacted: {messages:?} {stderr}"),
    )?;
    let (_, stderr) = watch_once(&store.addr, 99, "5")?;
    check(
        stderr.contains("InvalidArgument") && stderr.contains("after_revision"),
        format!("ahead: {stderr}"),
    )?;
    Ok(())
}

#[test]
fn postgres_replicas_stream_one_sequence_to_grpcurl() -> Result<()> {
    let database = Postgres::start()?;
    let url = database.create_database("feed")?;
    let dir = tempfile::tempdir().map_err(fixtures::io("making a temporary directory"))?;
    let envs: [(&str, &Path); 1] = [("PETSTORE_POSTGRES_PASSWORD_FILE", &database.password_file)];
    let args = ["--storage", "postgres", "--postgres-url", url.as_str()];
    let a = Store::start(dir.path(), "store-a", &args, &envs)?;
    let b = Store::start(dir.path(), "store-b", &args, &envs)?;

    let watch_a = a.watch(0, &dir.path().join("a.json"))?;
    let watch_b = b.watch(0, &dir.path().join("b.json"))?;
    for watch in [&watch_a, &watch_b] {
        wait_for(PATIENCE, "the first progress message", || {
            (!watch.messages().is_empty()).then_some(())
        })?;
    }
    let mut ids = Vec::new();
    for n in 0..10 {
        let through = if n % 2 == 0 { &a } else { &b };
        ids.push(through.add(&format!("pet-{n}"))?);
    }
    b.call(
        "UpdatePets",
        &format!(
            r#"{{"pets":[{{"id":"{}","name":"Renamed","type":"PTFeline","birthday":{{"year":2020,"month":1,"day":2}}}}]}}"#,
            ids[0]
        ),
    )?;
    a.call("DeletePets", &format!(r#"{{"ids":["{}"]}}"#, ids[1]))?;

    let from_a = watch_a.changes(12)?;
    let from_b = watch_b.changes(12)?;
    check(
        from_a == from_b,
        format!("one sequence:\n{from_a:?}\n{from_b:?}"),
    )?;
    check(
        revisions(&from_a) == (1..=12).collect::<Vec<_>>(),
        format!("revisions 1 to 12: {from_a:?}"),
    )?;
    check(
        kinds(&from_a)[10..] == ["UPDATED", "DELETED"],
        format!("kinds: {from_a:?}"),
    )?;
    // Resumed on the other replica from a revision seen on this one.
    let (messages, _) = watch_once(&b.addr, 10, "2")?;
    let resumed = all_changes(&messages);
    check(resumed == from_a[10..], format!("resumed: {resumed:?}"))?;
    Ok(())
}
