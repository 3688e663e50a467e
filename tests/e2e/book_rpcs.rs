//! The book's five RPCs against the real store binary, driven by two Go
//! clients as the book's users would: grpcurl and ghz (grpc-go). Each call's
//! effect is checked: pets added, renamed, deleted and found; the sampler
//! changed, as the store's /metrics sampler gauge shows.

use std::process::Command;
use std::time::Duration;

use fixtures::petstore::grpcurl;
use fixtures::{Error, Process, Result, Tools, cargo_bin, free_port, wait_for};
use serde_json::Value;

struct Store {
    _process: Process,
    addr: String,
    metrics_addr: String,
    _dir: tempfile::TempDir,
}

/// A memory store on free loopback ports, with its metrics on one of them.
fn start_store() -> Result<Store> {
    let dir = tempfile::tempdir().map_err(fixtures::io("making a temporary directory"))?;
    let addr = format!("127.0.0.1:{}", free_port()?);
    let metrics_addr = format!("127.0.0.1:{}", free_port()?);
    let mut command = Command::new(cargo_bin("petstore-server")?);
    command
        .args(["--listen", &addr, "--storage", "memory"])
        .args(["--metrics-listen", &metrics_addr]);
    let process = Process::spawn("petstore-server", command, &dir.path().join("store.log"))?;
    wait_for(Duration::from_secs(30), "the store to serve", || {
        grpcurl(&addr, "grpc.health.v1.Health/Check", "{}").ok()
    })?;
    Ok(Store {
        _process: process,
        addr,
        metrics_addr,
        _dir: dir,
    })
}

impl Store {
    fn grpcurl(&self, method: &str, data: &str) -> Result<Vec<Value>> {
        grpcurl(&self.addr, &format!("petstore.PetStore/{method}"), data)
    }

    /// `ghz` making `calls` calls of `method` with `data`, one at a time;
    /// fails unless every one answered OK.
    fn ghz(&self, method: &str, data: &str, calls: u32) -> Result<()> {
        let call = format!("petstore.PetStore/{method}");
        let out = fixtures::run(
            Command::new(Tools::get()?.bin("ghz"))
                .args(["--insecure", "--call", &call, "-d", data])
                .args(["-n", &calls.to_string(), "-c", "1"])
                .args(["-O", "json", &self.addr]),
        )?;
        let report: Value = serde_json::from_str(&out).map_err(|e| Error::Command {
            command: format!("ghz {call}"),
            status: "unparsable output".into(),
            stderr: format!("{e}: {out}"),
        })?;
        let ok = report["statusCodeDistribution"]["OK"].as_u64();
        if ok != Some(u64::from(calls)) {
            return Err(Error::Command {
                command: format!("ghz {call}"),
                status: format!("{ok:?} of {calls} calls OK"),
                stderr: out,
            });
        }
        Ok(())
    }

    fn metrics(&self) -> Result<String> {
        fixtures::http::scrape(&self.metrics_addr)
    }

    /// The value of the series written exactly `series` on /metrics.
    fn metric(&self, series: &str) -> Result<Option<f64>> {
        Ok(fixtures::http::series_value(&self.metrics()?, series))
    }

    fn sampler_ratio(&self) -> Result<Option<f64>> {
        self.metric("petstore_server_trace_sampler_ratio")
    }

    fn pets_named(&self, name: &str) -> Result<Vec<Value>> {
        self.grpcurl("SearchPets", &format!(r#"{{"names":["{name}"]}}"#))
    }
}

fn pet_json(name: &str) -> String {
    format!(
        r#"{{"name":"{name}","type":"PTFeline","birthday":{{"year":2020,"month":2,"day":29}}}}"#
    )
}

/// An UpdatePets body that sets the pet `id` to these fields.
fn update_body(id: &str, name: &str, type_: &str, (year, month, day): (u32, u32, u32)) -> String {
    format!(
        r#"{{"pets":[{{"id":"{id}","name":"{name}","type":"{type_}","birthday":{{"year":{year},"month":{month},"day":{day}}}}}]}}"#
    )
}

fn id_of(pet: &Value) -> String {
    pet["id"].as_str().unwrap_or_default().to_owned()
}

#[test]
fn grpcurl_drives_the_five_book_rpcs() -> Result<()> {
    let store = start_store()?;
    assert_eq!(store.sampler_ratio()?, Some(0.0), "the default is never");

    let added = store.grpcurl(
        "AddPets",
        &format!(r#"{{"pets":[{},{}]}}"#, pet_json("Curl"), pet_json("Curl")),
    )?;
    let ids = added[0]["ids"].as_array().cloned().unwrap_or_default();
    assert_eq!(ids.len(), 2, "{added:?}");
    let found = store.pets_named("Curl")?;
    assert_eq!(found.len(), 2, "{found:?}");

    let first = ids[0].as_str().unwrap_or_default();
    store.grpcurl(
        "UpdatePets",
        &update_body(first, "Curled", "PTBird", (2019, 1, 2)),
    )?;
    let renamed = store.pets_named("Curled")?;
    assert_eq!(renamed.len(), 1, "{renamed:?}");
    assert_eq!(renamed[0]["type"], "PTBird");

    store.grpcurl("DeletePets", &format!(r#"{{"ids":["{first}"]}}"#))?;
    assert!(store.pets_named("Curled")?.is_empty());
    assert_eq!(store.pets_named("Curl")?.len(), 1);

    store.grpcurl("ChangeSampler", r#"{"sampler":{"type":"STAlways"}}"#)?;
    assert_eq!(store.sampler_ratio()?, Some(1.0));
    store.grpcurl(
        "ChangeSampler",
        r#"{"sampler":{"type":"STFloat","floatValue":0.25}}"#,
    )?;
    assert_eq!(store.sampler_ratio()?, Some(0.25));

    // A ratio out of range: refused, naming the field, and nothing changes.
    let refused = store
        .grpcurl(
            "ChangeSampler",
            r#"{"sampler":{"type":"STFloat","floatValue":1.5}}"#,
        )
        .expect_err("a ratio of 1.5 was accepted");
    let message = refused.to_string();
    assert!(message.contains("InvalidArgument"), "{message}");
    assert!(message.contains("sampler.float_value"), "{message}");
    assert_eq!(store.sampler_ratio()?, Some(0.25));
    assert_eq!(
        store.metric(
            r#"petstore_server_rpc_duration_seconds_count{method="ChangeSampler",code="InvalidArgument"}"#
        )?,
        Some(1.0)
    );
    Ok(())
}

#[test]
fn ghz_drives_the_five_book_rpcs() -> Result<()> {
    let store = start_store()?;

    store.ghz(
        "AddPets",
        &format!(r#"{{"pets":[{}]}}"#, pet_json("Ghz")),
        5,
    )?;
    let added = store.pets_named("Ghz")?;
    assert_eq!(added.len(), 5, "{added:?}");

    let target = id_of(&added[0]);
    store.ghz(
        "UpdatePets",
        &update_body(&target, "Ghzed", "PTReptile", (2018, 3, 4)),
        3,
    )?;
    let renamed = store.pets_named("Ghzed")?;
    assert_eq!(renamed.len(), 1, "{renamed:?}");
    assert_eq!(id_of(&renamed[0]), target);

    store.ghz("SearchPets", r#"{"names":["Ghz"]}"#, 3)?;
    store.ghz("DeletePets", &format!(r#"{{"ids":["{target}"]}}"#), 2)?;
    assert!(store.pets_named("Ghzed")?.is_empty());
    assert_eq!(store.pets_named("Ghz")?.len(), 4);

    store.ghz(
        "ChangeSampler",
        r#"{"sampler":{"type":"STFloat","float_value":0.5}}"#,
        2,
    )?;
    assert_eq!(store.sampler_ratio()?, Some(0.5));
    store.ghz("ChangeSampler", r#"{"sampler":{"type":"STNever"}}"#, 1)?;
    assert_eq!(store.sampler_ratio()?, Some(0.0));

    // The store counted ghz's calls by method and code.
    for (method, calls) in [
        ("AddPets", 5.0),
        ("UpdatePets", 3.0),
        ("DeletePets", 2.0),
        ("ChangeSampler", 3.0),
    ] {
        let series =
            format!(r#"petstore_server_rpc_duration_seconds_count{{method="{method}",code="OK"}}"#);
        assert_eq!(store.metric(&series)?, Some(calls), "{series}");
    }
    Ok(())
}
