//! Runs the real `petstore-server` binary: durability across `kill -9`,
//! graceful SIGTERM, health and reflection.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use petstore_proto::PetStoreClient;
use petstore_proto::petstore as pb;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

mod support;

use support::{keyed, searched};

struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the binary on an ephemeral port and learns the port from its JSON
/// "listening" log line, so parallel tests never race for a port.
async fn spawn(data_file: &Path) -> (Server, Channel) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_petstore-server"))
        .args(["--listen", "127.0.0.1:0", "--log-format", "json"])
        // Tests bind loopback only, never the default 0.0.0.0:9090.
        .args(["--metrics-listen", "127.0.0.1:0"])
        .args(["--storage", "durable", "--data-file"])
        .arg(data_file)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn petstore-server");
    let stdout = child.stdout.take().expect("stdout");
    let (found, addr) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Ok(entry) = serde_json::from_str::<serde_json::Value>(&line)
                && let Some(addr) = entry["fields"]["addr"].as_str()
            {
                let _ = found.send(addr.to_owned());
            }
        }
    });
    let addr = addr
        .recv_timeout(Duration::from_secs(20))
        .expect("server reports its address");
    let server = Server { child, addr };
    let channel = support::connect(&server.addr).await;
    (server, channel)
}

async fn count(channel: &Channel) -> usize {
    let mut stream = PetStoreClient::new(channel.clone())
        .search_pets(pb::SearchPetsReq::default())
        .await
        .expect("search")
        .into_inner();
    let mut n = 0;
    while stream.message().await.expect("stream").is_some() {
        n += 1;
    }
    n
}

#[tokio::test]
async fn acknowledged_writes_survive_kill_9_and_keys_still_deduplicate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("pets.redb");

    let (mut server, channel) = spawn(&data).await;
    let mut client = PetStoreClient::new(channel.clone());
    let mut ids = Vec::new();
    for n in 0..50 {
        let resp = client
            .add_pets(pb::AddPetsReq {
                pets: vec![keyed(&format!("pet-{n}"), &format!("uid-{n}"))],
            })
            .await
            .expect("add");
        ids.extend(resp.into_inner().ids);
    }
    // SIGKILL: no chance to flush anything that was not already committed.
    server.child.kill().expect("kill -9");
    server.child.wait().expect("reap");
    drop(server);

    let (_server, channel) = spawn(&data).await;
    assert_eq!(count(&channel).await, 50, "every acknowledged pet survives");
    // The name index was committed with the pets it indexes.
    let by_name = searched(
        &mut PetStoreClient::new(channel.clone()),
        pb::SearchPetsReq {
            names: vec!["pet-7".into(), "pet-49".into()],
            ..Default::default()
        },
    )
    .await
    .expect("search by name");
    let mut found: Vec<_> = by_name.into_iter().map(|pet| pet.id).collect();
    found.sort();
    let mut expected = vec![ids[7].clone(), ids[49].clone()];
    expected.sort();
    assert_eq!(found, expected, "the name index survived kill -9");
    let again = PetStoreClient::new(channel.clone())
        .add_pets(pb::AddPetsReq {
            pets: vec![keyed("pet-7", "uid-7")],
        })
        .await
        .expect("add again")
        .into_inner()
        .ids;
    assert_eq!(again, [ids[7].clone()], "the key survived the restart");
    assert_eq!(count(&channel).await, 50);
}

#[tokio::test]
async fn health_reports_serving_and_sigterm_exits_cleanly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut server, channel) = spawn(&dir.path().join("pets.redb")).await;
    let mut health = HealthClient::new(channel.clone());
    for service in ["", "petstore.PetStore"] {
        let status = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("health check")
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "service {service:?}");
    }

    let pid = server.child.id().to_string();
    let status = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("send SIGTERM");
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(exit) = server.child.try_wait().expect("wait") {
            assert!(exit.success(), "graceful shutdown exits 0, got {exit}");
            break;
        }
        assert!(Instant::now() < deadline, "server ignored SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn reflection_lists_the_services() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let dir = tempfile::tempdir().expect("tempdir");
    let (_server, channel) = spawn(&dir.path().join("pets.redb")).await;
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .expect("reflection")
        .into_inner();
    let response = responses
        .message()
        .await
        .expect("stream")
        .expect("one response");
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("unexpected reflection response: {response:?}");
    };
    let names: Vec<_> = list.service.into_iter().map(|s| s.name).collect();
    for expected in ["petstore.PetStore", "grpc.health.v1.Health"] {
        assert!(names.iter().any(|n| n == expected), "{names:?}");
    }
}
