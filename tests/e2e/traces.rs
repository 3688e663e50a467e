//! One Pet's story told by its traces and its logs: the operator and the pet
//! store both export OTLP to a real receiver (an OpenTelemetry Collector
//! writing OTLP JSON to a file), and every reconcile that wrote to the store
//! is one trace, from the operator's root span down to the store's storage
//! span. Each of those writes is one line of the operator's change log,
//! carrying the trace ID of that very trace. Then the store's sampler is
//! switched at run time with `ChangeSampler`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fixtures::env::{OPERATOR_ACCOUNT, OPERATOR_NAMESPACE, start_installed};
use fixtures::http::series_value;
use fixtures::trace_receiver::{Trace, TraceReceiver, TracedPetStore};
use fixtures::{ControlPlane, Kubectl, Operator, OperatorOptions, wait_for};
use serde_json::Value;

use crate::typed;

const TIMEOUT: Duration = Duration::from_secs(60);
const OPERATOR_SERVICE: &str = "petstore-operator";
const STORE_SERVICE: &str = "petstore-server";

const PET: &str = "
apiVersion: petstore.example.com/v1
kind: Pet
metadata:
  name: traced
  namespace: default
spec:
  name: Thor
  type: dog
  birthday: \"2021-04-01\"
";

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|since| u64::try_from(since.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or_default()
}

/// Where a complete store write was found: the trace and when the
/// operator's `store.<Method>` span started.
struct WriteTrace {
    trace_id: String,
    start_time_us: u64,
}

/// The reconciles in `traces` whose trace holds the whole chain for
/// `method`: the operator's root `reconciling object`, a `store.<method>`
/// span under it, the store's `petstore.PetStore/<method>` span whose parent
/// is that `store.<method>` span, and a `storage.*` span under the latter.
fn complete_writes(traces: &[Trace], method: &str) -> Vec<WriteTrace> {
    let client_name = format!("store.{method}");
    let server_name = format!("petstore.PetStore/{method}");
    let mut found = Vec::new();
    for trace in traces {
        let roots: Vec<_> = trace
            .roots()
            .filter(|root| root.name == "reconciling object" && root.service == OPERATOR_SERVICE)
            .collect();
        for client in trace
            .spans_named(&client_name)
            .filter(|span| span.service == OPERATOR_SERVICE)
        {
            let under_root = roots.iter().any(|root| trace.descends_from(client, root));
            let server_with_storage = trace.children(client).any(|server| {
                server.name == server_name
                    && server.service == STORE_SERVICE
                    && trace.children(server).any(|storage| {
                        storage.name.starts_with("storage.") && storage.service == STORE_SERVICE
                    })
            });
            if under_root && server_with_storage {
                found.push(WriteTrace {
                    trace_id: trace.trace_id.clone(),
                    start_time_us: client.start_time_us,
                });
            }
        }
    }
    found
}

/// Traces the store started itself: a root `petstore.PetStore/<method>`
/// span, i.e. a call that came without trace context.
fn store_rooted(traces: &[Trace], method: &str) -> usize {
    let name = format!("petstore.PetStore/{method}");
    traces
        .iter()
        .filter(|trace| {
            trace
                .roots()
                .any(|root| root.name == name && root.service == STORE_SERVICE)
        })
        .count()
}

fn summary(traces: &[Trace]) -> String {
    traces
        .iter()
        .map(|trace| {
            let spans: Vec<String> = trace
                .spans
                .iter()
                .map(|s| {
                    format!(
                        "{}:{} {} <- {}",
                        s.service,
                        s.name,
                        s.span_id,
                        s.parent_span_id.as_deref().unwrap_or("-")
                    )
                })
                .collect();
            format!("trace {}:\n  {}", trace.trace_id, spans.join("\n  "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn store_pet(store: &TracedPetStore, id: &str) -> Option<Value> {
    store
        .grpcurl("petstore.PetStore/SearchPets", "{}")
        .ok()?
        .into_iter()
        .find(|pet| pet["id"] == id)
}

/// One line of the operator's change log (target
/// `petstore_operator::changes`), from its text log.
#[derive(Debug)]
struct ChangeLine {
    action: String,
    /// From the enclosing reconcile span's `trace_id` field.
    trace_id: Option<String>,
    line: String,
}

/// The value of the field `name` in a text log line (`name=value`, after a
/// space or a span's `{`), quotes stripped.
fn log_field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("{name}=");
    let (at, _) = line
        .match_indices(&key)
        .find(|(at, _)| line[..*at].ends_with([' ', '{']))?;
    let rest = &line[at + key.len()..];
    let end = rest
        .find(|c: char| c.is_whitespace() || c == '}' || c == ':')
        .unwrap_or(rest.len());
    Some(rest[..end].trim_matches('"'))
}

/// Every change log line in the operator's log.
fn change_log(log: &str) -> Vec<ChangeLine> {
    log.lines()
        .filter(|line| line.contains(" petstore_operator::changes: "))
        .map(|line| ChangeLine {
            action: log_field(line, "action").unwrap_or_default().to_owned(),
            trace_id: log_field(line, "trace_id").map(str::to_owned),
            line: line.to_owned(),
        })
        .collect()
}

/// The store's count of answered (`OK`) calls of `method`.
fn store_calls(metrics: &str, method: &str) -> f64 {
    series_value(
        metrics,
        &format!(r#"petstore_server_rpc_duration_seconds_count{{method="{method}",code="OK"}}"#),
    )
    .unwrap_or(0.0)
}

#[test]
fn each_store_write_is_one_trace_across_operator_and_store() -> fixtures::Result<()> {
    let cp = start_installed(ControlPlane::builder())?;
    let kubeconfig = cp.service_account_kubeconfig(OPERATOR_NAMESPACE, OPERATOR_ACCOUNT)?;
    let receiver = TraceReceiver::start(cp.dir())?;
    // `never` is the default: the store traces only calls whose caller
    // sampled them.
    let mut store = TracedPetStore::start(cp.dir(), &receiver, "never")?;
    let options = OperatorOptions {
        kubeconfig,
        store_addr: store.addr.clone(),
        leader_election: true,
        lease_namespace: OPERATOR_NAMESPACE.into(),
        identity: "operator-traced".into(),
        // Short, so the drift below is found within a second or two.
        poll_interval: "1s",
        backoff_max: "2s",
        petstore_timeout: "2s",
        fault: None,
        log_filter: "info,petstore_operator=debug",
        extra_args: fixtures::env::webhook_args()?,
    };
    let mut operator = Operator::start_with_env(
        &options,
        &cp.dir().join("operator-traced.log"),
        &receiver.exporter_env(OPERATOR_SERVICE),
    )?;

    // Create, rename, drift behind the operator's back, delete.
    cp.apply(PET)?;
    let ready = |what: &str| {
        typed::wait_pet(&cp, "default", "traced", TIMEOUT, what, |pet| {
            typed::is_ready(pet).then(|| typed::id(pet).map(str::to_owned))?
        })
    };
    let id = ready("the Pet Ready")?;
    cp.rename_pet("traced", "Thorbert")?;
    wait_for(TIMEOUT, "the rename in the store", || {
        store_pet(&store, &id).filter(|pet| pet["name"] == "Thorbert")
    })?;
    ready("the renamed Pet Ready")?;
    let drift_made_us = now_us();
    store.grpcurl(
        "petstore.PetStore/UpdatePets",
        &format!(
            r#"{{"pets":[{{"id":"{id}","name":"Changed behind its back","type":"PTBird","birthday":{{"year":2000,"month":1,"day":1}}}}]}}"#
        ),
    )?;
    wait_for(TIMEOUT, "the drift put back", || {
        store_pet(&store, &id).filter(|pet| pet["name"] == "Thorbert" && pet["type"] == "PTCanine")
    })?;
    cp.kubectl(&["delete", "pet", "traced", "--wait=true", "--timeout=60s"])?;
    assert!(store_pet(&store, &id).is_none(), "the record is deleted");

    // Every write reconcile is one trace across both processes. Spans
    // arrive within a second or so of ending; wait for the last write's.
    let traces = wait_for(TIMEOUT, "the delete's trace", || {
        let traces = receiver.traces(OPERATOR_SERVICE).ok()?;
        (!complete_writes(&traces, "DeletePets").is_empty()).then_some(traces)
    })
    .inspect_err(|_| {
        eprintln!(
            "{}",
            summary(&receiver.traces(OPERATOR_SERVICE).unwrap_or_default())
        )
    })?;
    let context = summary(&traces);
    let creates = complete_writes(&traces, "AddPets");
    assert_eq!(creates.len(), 1, "one create:\n{context}");
    let updates = complete_writes(&traces, "UpdatePets");
    let renames: Vec<_> = updates
        .iter()
        .filter(|write| write.start_time_us < drift_made_us)
        .collect();
    let repairs: Vec<_> = updates
        .iter()
        .filter(|write| write.start_time_us >= drift_made_us)
        .collect();
    assert_eq!(renames.len(), 1, "one rename:\n{context}");
    assert_eq!(repairs.len(), 1, "one drift repair:\n{context}");
    let deletes = complete_writes(&traces, "DeletePets");
    assert_eq!(deletes.len(), 1, "one delete:\n{context}");
    // Four reconciles, four traces.
    let mut trace_ids: Vec<&str> = [&creates[0], renames[0], repairs[0], &deletes[0]]
        .iter()
        .map(|write| write.trace_id.as_str())
        .collect();
    trace_ids.sort_unstable();
    trace_ids.dedup();
    assert_eq!(trace_ids.len(), 4, "four distinct traces:\n{context}");
    // The receiver gives the same trace by its ID.
    let by_id = receiver
        .trace(&creates[0].trace_id)?
        .expect("the create's trace by ID");
    assert_eq!(complete_writes(&[by_id], "AddPets").len(), 1);

    // The change log: one line per write, in order, each logged inside its
    // reconcile and so carrying the ID of the trace the receiver holds for
    // that very write (README: log lines carry the trace_id).
    let read_log = |operator: &mut Operator| {
        std::fs::read_to_string(operator.process().log_path())
            .map_err(fixtures::io("reading the operator's log"))
    };
    let lines = change_log(&read_log(&mut operator)?);
    let actions: Vec<&str> = lines.iter().map(|line| line.action.as_str()).collect();
    assert_eq!(
        actions,
        ["create", "update", "update", "delete"],
        "one change log line per write:\n{lines:#?}"
    );
    let write_traces = [
        creates[0].trace_id.as_str(),
        &renames[0].trace_id,
        &repairs[0].trace_id,
        &deletes[0].trace_id,
    ];
    for (line, trace_id) in lines.iter().zip(write_traces) {
        assert_eq!(
            line.trace_id.as_deref(),
            Some(trace_id),
            "the change log line carries its write's trace ID: {}",
            line.line
        );
    }

    // The sampler at run time. Under `never`, calls without trace context
    // (every grpcurl above, the out-of-band UpdatePets among them) left no
    // trace of their own in the store.
    let sampler_ratio = |store: &TracedPetStore| -> fixtures::Result<Option<f64>> {
        Ok(series_value(
            &store.metrics()?,
            "petstore_server_trace_sampler_ratio",
        ))
    };
    assert_eq!(
        sampler_ratio(&store)?,
        Some(0.0),
        "the sampler gauge reads never"
    );
    store.grpcurl("petstore.PetStore/SearchPets", "{}")?;
    store.grpcurl(
        "petstore.PetStore/ChangeSampler",
        r#"{"sampler":{"type":"STAlways"}}"#,
    )?;
    assert_eq!(
        sampler_ratio(&store)?,
        Some(1.0),
        "the sampler gauge reads always"
    );
    store.grpcurl("petstore.PetStore/SearchPets", "{}")?;
    // The store exports its spans in the order they end, so once the second
    // SearchPets is in, a trace of the first (or of any earlier grpcurl
    // call) would be too.
    let store_traces = wait_for(TIMEOUT, "the SearchPets trace under always", || {
        let traces = receiver.traces(STORE_SERVICE).ok()?;
        (store_rooted(&traces, "SearchPets") > 0).then_some(traces)
    })?;
    let context = summary(&store_traces);
    assert_eq!(
        store_rooted(&store_traces, "SearchPets"),
        1,
        "only the call made under always:\n{context}"
    );
    assert_eq!(
        store_rooted(&store_traces, "UpdatePets"),
        0,
        "no trace of the out-of-band update made under never:\n{context}"
    );

    // The change log against the store's own count of the writes it took,
    // now that any late line would have been written: a write the operator
    // did not log, or logged twice, shows here.
    let metrics = store.metrics()?;
    let lines = change_log(&read_log(&mut operator)?);
    let logged = |actions: &[&str]| {
        lines
            .iter()
            .filter(|line| actions.contains(&line.action.as_str()))
            .count() as f64
    };
    let context = format!("{metrics}\n{lines:#?}");
    assert_eq!(store_calls(&metrics, "AddPets"), 1.0, "{context}");
    assert_eq!(
        logged(&["create", "recreate"]),
        store_calls(&metrics, "AddPets"),
        "{context}"
    );
    // Less the one UpdatePets this test made behind the operator's back.
    assert_eq!(store_calls(&metrics, "UpdatePets"), 3.0, "{context}");
    assert_eq!(
        logged(&["update", "claim", "release"]),
        store_calls(&metrics, "UpdatePets") - 1.0,
        "{context}"
    );
    assert_eq!(store_calls(&metrics, "DeletePets"), 1.0, "{context}");
    assert_eq!(
        logged(&["delete"]),
        store_calls(&metrics, "DeletePets"),
        "{context}"
    );
    assert_eq!(lines.len(), 4, "no other change log lines:\n{context}");

    assert!(operator.process().is_running(), "the operator still runs");
    assert!(store.process().is_running(), "the store still runs");
    Ok(())
}
