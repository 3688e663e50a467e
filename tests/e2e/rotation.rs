//! Certificates rotated under a running store and operator, with mutual TLS
//! and Pets changing all along: the store's serving certificate, the
//! operator's client certificate and both CAs move to new ones without a
//! restart and without a failed store call.
//!
//! The store reads its files from a directory laid out as a Kubernetes
//! Secret volume (updated by swapping `..data`); the operator from plain
//! files replaced by `mv`, its certificate once before its key.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use fixtures::certs::{Pki, SecretVolume};
use fixtures::env::is_ready;
use fixtures::rotation::{self, TlsFiles, alive, bundle, der, presented, replace};
use fixtures::{Env, Result, Storage};

const PETS: usize = 50;
/// The issue's bound: the new certificate in use within this long of the
/// file change, measured from the change.
const IN_USE: Duration = Duration::from_secs(5);
/// For things without a bound of their own (Pets turning Ready).
const SETTLE: Duration = Duration::from_secs(120);

fn pet_yaml(index: usize) -> String {
    format!(
        "---\napiVersion: petstore.example.com/v1\nkind: Pet\nmetadata:\n  name: rot-{index}\n  namespace: default\nspec:\n  name: Rot {index}\n  type: {}\n  birthday: \"2020-01-{:02}\"\n",
        if index.is_multiple_of(2) {
            "dog"
        } else {
            "cat"
        },
        index % 28 + 1
    )
}

/// How long after `since` `check` first held; an error after [`IN_USE`]
/// twice over (the assertion on [`IN_USE`] is the caller's, with the
/// figure).
fn took(what: &str, since: Instant, check: impl FnMut() -> bool) -> Result<Duration> {
    rotation::took(what, since, IN_USE * 2, check)
}

fn store_calls(operator: &fixtures::Operator) -> Result<(f64, Vec<String>)> {
    Ok(rotation::store_calls(&operator.metrics()?))
}

#[test]
fn certificates_and_cas_rotate_live_while_pets_change() -> Result<()> {
    let pki_dir = tempfile::tempdir().map_err(fixtures::io("a temporary directory"))?;
    let pki = pki_dir.path();
    let old = Pki::create(&pki.join("old"), "rotation-old", &[])?;
    let new = Pki::create(&pki.join("new"), "rotation-new", &[])?;
    let store_1 = old.issue_server("store-1")?;
    let store_2 = old.issue_server("store-2")?;
    let store_3 = new.issue_server("store-3")?;
    let operator_1 = old.issue_client("operator-1")?;
    let operator_2 = new.issue_client("operator-2")?;
    let both = bundle(pki, &[&old.ca_cert, &new.ca_cert])?;

    let files = TlsFiles::create(pki, &old.ca_cert, &store_1, &operator_1)?;
    // The operator's certificate passes the fixtures' health check at start.
    let store_tls = files.store_tls(&operator_1);
    let mut env = Env::start_with_store_tls(Storage::Durable, |_| Ok(Some(store_tls)))?;
    // The operator's flags name its own files.
    env.tls = Some(files.operator_tls());
    let TlsFiles {
        mut volume,
        operator_ca: op_ca,
        operator_cert: op_cert,
        operator_key: op_key,
    } = files;
    let mut operator = env.start_operator("rotation")?;
    let store_pid = env.store.process().pid().expect("the store's pid");
    let operator_pid = operator.process().pid().expect("the operator's pid");

    let yaml: String = (0..PETS).map(pet_yaml).collect();
    env.cp.apply(&yaml)?;
    let all_ready = || -> bool {
        env.cp
            .get("/apis/petstore.example.com/v1/namespaces/default/pets")
            .ok()
            .and_then(|list| {
                let pets = list["items"].as_array()?.clone();
                Some(pets.len() == PETS && pets.iter().all(is_ready))
            })
            .unwrap_or(false)
    };
    fixtures::wait_for(SETTLE, "every Pet Ready", || all_ready().then_some(()))?;

    let store_addr = env.store.addr.clone();
    let store_metrics = env.store.metrics_addr.clone();
    let operator_metrics = operator.metrics_addr.clone();
    let store_reloads = |outcome| rotation::store_reloads(&store_metrics, outcome);
    let operator_reloads = |outcome| rotation::operator_reloads(&operator_metrics, outcome);
    // A connection made with the operator's files as they are now: one
    // more than before they changed.
    let operator_connections = || rotation::operator_connections(&operator_metrics, "ok");
    let mut figures = Vec::new();

    let stop = AtomicBool::new(false);
    let changes = AtomicUsize::new(0);
    let refused_changes = AtomicUsize::new(0);
    std::thread::scope(|scope| -> Result<()> {
        // Churn: every Pet renamed in turn, for as long as the rotations go.
        scope.spawn(|| {
            let mut round = 0;
            while !stop.load(Ordering::Relaxed) {
                round += 1;
                for index in 0..PETS {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let spec = format!(r#"{{"name":"Rot {index} r{round}"}}"#);
                    match env.patch_spec("default", &format!("rot-{index}"), &spec) {
                        Ok(_) => changes.fetch_add(1, Ordering::Relaxed),
                        Err(_) => refused_changes.fetch_add(1, Ordering::Relaxed),
                    };
                }
            }
        });
        let result = (|| -> Result<()> {
            let operator_old = (operator_1.0.as_path(), operator_1.1.as_path());
            // The store's Secret volume given the certificate `pair`: how
            // long until a handshake trusting `trusted` is presented it.
            let store_serves = |volume: &mut SecretVolume,
                                what: &str,
                                pair: &(PathBuf, PathBuf),
                                trusted: &[&Path]|
             -> Result<Duration> {
                let changed = Instant::now();
                volume.update(&[("tls.crt", &pair.0), ("tls.key", &pair.1)])?;
                took(what, changed, || {
                    presented(&store_addr, trusted, operator_old) == Some(der(&pair.0))
                })
            };
            // The operator's CA file replaced by the bundle of `cas`: how
            // long until a connection is made with it.
            let operator_trusts = |what: &str, cas: &[&Path]| -> Result<Duration> {
                let (before, connections) = (operator_reloads("ok"), operator_connections());
                let changed = Instant::now();
                replace(&op_ca, cas)?;
                took(what, changed, || {
                    operator_reloads("ok") > before && operator_connections() > connections
                })
            };
            // The store's Secret volume given the client CA `ca`: how long
            // until the store has reloaded it.
            let store_takes =
                |volume: &mut SecretVolume, what: &str, ca: &Path| -> Result<Duration> {
                    let before = store_reloads("ok");
                    let changed = Instant::now();
                    volume.update(&[("ca.crt", ca)])?;
                    took(what, changed, || store_reloads("ok") > before)
                };

            // Let the churn get going before the first rotation.
            std::thread::sleep(Duration::from_secs(2));

            // 1. The store's certificate, renewed by the same CA.
            let latency = store_serves(
                &mut volume,
                "the store's renewed certificate",
                &store_2,
                &[&old.ca_cert],
            )?;
            figures.push(("store certificate renewed, same CA", latency));

            // 2. The operator trusts the old and the new CA: in use once
            // a connection is made with it.
            let latency = operator_trusts("the operator's CA bundle in use", &[&both])?;
            figures.push(("operator trusts old+new CA", latency));

            // 3. The store takes client certificates of both CAs.
            let latency = store_takes(&mut volume, "the store's client CA bundle", &both)?;
            figures.push(("store takes old+new client CA", latency));

            // 4. The store moves to a certificate of the new CA.
            let latency = store_serves(
                &mut volume,
                "the store's new-CA certificate",
                &store_3,
                &[&old.ca_cert, &new.ca_cert],
            )?;
            figures.push(("store certificate from the new CA", latency));

            // 5. The operator trusts the new CA only: the connection it
            // makes with it checks the store's new certificate.
            let latency = operator_trusts("the operator's new CA in use", &[&new.ca_cert])?;
            figures.push(("operator trusts the new CA only", latency));

            // 6. The operator's certificate, from the new CA: the
            // certificate first, its key a moment later (a reload between
            // them finds them unmatched and keeps the old pair).
            let before = operator_reloads("ok");
            replace(&op_cert, &[&operator_2.0])?;
            std::thread::sleep(Duration::from_millis(300));
            let connections = operator_connections();
            let changed = Instant::now();
            replace(&op_key, &[&operator_2.1])?;
            let latency = took("the operator's new certificate in use", changed, || {
                operator_reloads("ok") > before && operator_connections() > connections
            })?;
            figures.push(("operator certificate from the new CA", latency));

            // 7. IN_USE after that change, the store takes the new CA's
            // clients only, and closes the connections made with the old
            // certificate: from here on the operator's calls succeed only
            // over a connection that presents its new one (a connection
            // counted above but made with the old certificate would be
            // closed, and refused when made again).
            let deadline = changed + IN_USE;
            std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
            let (ok_before, _) = store_calls(&operator)?;
            let latency = store_takes(&mut volume, "the store's new client CA", &new.ca_cert)?;
            figures.push(("store takes the new client CA only", latency));
            let operator_new = (operator_2.0.as_path(), operator_2.1.as_path());
            assert_eq!(
                presented(&store_addr, &[new.ca_cert.as_path()], operator_new),
                Some(der(&store_3.0))
            );
            // The churn's calls go on after the switch.
            fixtures::wait_for(SETTLE, "20 store calls after the switch", || {
                store_calls(&operator)
                    .ok()
                    .filter(|(ok, _)| *ok >= ok_before + 20.0)
            })?;
            Ok(())
        })();
        stop.store(true, Ordering::Relaxed);
        result
    })?;

    fixtures::wait_for(SETTLE, "every Pet Ready after the churn", || {
        all_ready().then_some(())
    })?;
    let (ok, failed) = store_calls(&operator)?;
    let closed = env
        .store
        .process()
        .log_contains("closed connections whose client certificate");
    eprintln!(
        "rotation: {} Pet changes ({} refused by the API server), {ok} store calls OK, failed: {failed:?}; \
         store reloads ok {} failed {}, operator reloads ok {} failed {}; old connections closed by the store: {closed}",
        changes.load(Ordering::Relaxed),
        refused_changes.load(Ordering::Relaxed),
        store_reloads("ok"),
        store_reloads("failed"),
        operator_reloads("ok"),
        operator_reloads("failed"),
    );
    for (what, latency) in &figures {
        eprintln!("rotation: {what}: {latency:?} after the file change");
    }
    assert!(failed.is_empty(), "failed store calls: {failed:#?}");
    // kubectl takes its time on a loaded machine: a few changes a second
    // is churn enough, as long as there were some throughout.
    assert!(
        changes.load(Ordering::Relaxed) >= 10,
        "the churn made too few changes"
    );
    for (what, latency) in &figures {
        assert!(*latency <= IN_USE, "{what}: {latency:?}");
    }
    assert!(store_reloads("ok") >= 4.0, "the store's reloads");
    assert!(operator_reloads("ok") >= 3.0, "the operator's reloads");
    assert_eq!(env.store.process().pid(), Some(store_pid));
    assert!(alive(store_pid), "the store exited");
    assert_eq!(operator.process().pid(), Some(operator_pid));
    assert!(operator.process().is_running(), "the operator exited");
    Ok(())
}
