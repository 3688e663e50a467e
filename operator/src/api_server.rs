//! A strict mock API server for unit tests, like controller-rs's
//! `ApiServerVerifier`: it answers only the calls a test scripted, in order;
//! any other call, or a scripted call that never came, fails the test.

use std::collections::VecDeque;
use std::pin::pin;
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

/// A call the mock received.
#[derive(Clone, Debug)]
pub struct Call {
    pub method: Method,
    pub path: String,
    pub query: String,
    pub body: Value,
}

/// One scripted call: what must come, and the answer.
struct Expected {
    method: Method,
    path: String,
    code: u16,
    reply: Value,
}

#[derive(Clone, Default)]
pub struct ApiServerVerifier {
    script: Arc<Mutex<VecDeque<Expected>>>,
    calls: Arc<Mutex<Vec<Call>>>,
    unexpected: Arc<Mutex<Vec<String>>>,
    /// Events are written by a background queue, so their order against
    /// other calls is not fixed: when set, they are accepted unscripted and
    /// checked afterwards from `calls`.
    events_unscripted: bool,
}

impl ApiServerVerifier {
    /// A mock that also accepts Event writes without a script.
    pub fn with_events() -> Self {
        Self {
            events_unscripted: true,
            ..Self::default()
        }
    }

    pub fn start(&self) -> Client {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let api = self.clone();
        tokio::spawn(async move {
            let mut handle = pin!(handle);
            while let Some((request, send)) = handle.next_request().await {
                let method = request.method().clone();
                let path = request.uri().path().to_owned();
                let query = request.uri().query().unwrap_or_default().to_owned();
                let bytes = request
                    .into_body()
                    .collect_bytes()
                    .await
                    .expect("request body");
                let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                api.calls.lock().expect("calls").push(Call {
                    method: method.clone(),
                    path: path.clone(),
                    query,
                    body: body.clone(),
                });
                let (code, reply) = if api.events_unscripted && path.contains("/events") {
                    (201, body)
                } else {
                    api.answer(&method, &path)
                };
                let response = Response::builder()
                    .status(code)
                    .body(Body::from(serde_json::to_vec(&reply).expect("json")))
                    .expect("response");
                send.send_response(response);
            }
        });
        Client::new(service, "default")
    }

    /// The scripted answer if this call is the next one scripted; otherwise
    /// the call is noted as unexpected and answered with a 500.
    fn answer(&self, method: &Method, path: &str) -> (u16, Value) {
        let next = self.script.lock().expect("script").pop_front();
        match next {
            Some(e) if e.method == method && e.path == path => (e.code, e.reply),
            other => {
                let wanted = other.map_or("nothing".into(), |e| format!("{} {}", e.method, e.path));
                self.unexpected
                    .lock()
                    .expect("unexpected")
                    .push(format!("{method} {path} (expected {wanted})"));
                (500, failure(500))
            }
        }
    }

    pub fn expect(&self, method: Method, path: &str, code: u16, reply: Value) {
        self.script.lock().expect("script").push_back(Expected {
            method,
            path: path.to_owned(),
            code,
            reply,
        });
    }

    /// The calls received that pass `filter`, in order.
    pub fn calls(&self, filter: impl Fn(&Call) -> bool) -> Vec<Call> {
        self.calls
            .lock()
            .expect("calls")
            .iter()
            .filter(|c| filter(c))
            .cloned()
            .collect()
    }

    /// Every scripted call came, and nothing else.
    pub fn verify(&self) {
        let unexpected = self.unexpected.lock().expect("unexpected").clone();
        assert!(
            unexpected.is_empty(),
            "unscripted API calls: {unexpected:?}"
        );
        let left: Vec<String> = self
            .script
            .lock()
            .expect("script")
            .iter()
            .map(|e| format!("{} {}", e.method, e.path))
            .collect();
        assert!(left.is_empty(), "scripted API calls never made: {left:?}");
    }
}

/// A `Status` failure as the API server returns it.
pub fn failure(code: u16) -> Value {
    let reason = match code {
        404 => "NotFound",
        409 => "Conflict",
        _ => "InternalError",
    };
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
           "message": "scripted failure", "reason": reason, "code": code})
}
