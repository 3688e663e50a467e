//! The README's Tilt quick start, for real: a one-node cluster with real
//! pods (tests/fixtures/src/cluster), the unmodified Tiltfile under `tilt ci`
//! and `tilt up`, and the quick start's steps 3-6 through Tilt's
//! port-forwards with kubectl and grpcurl. Then what only real pods show:
//! restricted Pod Security, probes, the PVC, in-cluster RBAC, leader
//! hand-over, an uninstall of the operator's bundle that keeps every record
//! and an install again that finds them, a rebuild after an edit, the
//! chart installed from the cluster's OCI registry, and a clean teardown.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fixtures::cluster::{Cluster, REGISTRY_PORT};
use fixtures::cosign::{Cosign, assert_refused, assert_verified, statements};
use fixtures::env::is_ready;
use fixtures::helm::{CHART, CHART_VERSION, Helm, chart_dir};
use fixtures::petstore::{grpcurl, grpcurl_with, write_rpcs_answered};
use fixtures::{Kubectl, Process, Tools, free_port, repo_root, wait_for};
use serde_json::Value;
use xtask::sbom;

/// Tilt's port-forward to the store, as in the quick start.
const STORE: &str = "localhost:6742";

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn elapsed(start: Instant) -> String {
    format!("{:>6.1}s", start.elapsed().as_secs_f64())
}

/// Runs a command; returns (success, stdout, stderr).
fn output(command: &mut Command) -> std::io::Result<(bool, String, String)> {
    let out = command.stdin(Stdio::null()).output()?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// `tilt ci` in `dir`: returns its combined output, or fails with it.
fn tilt_ci(cluster: &Cluster, dir: &Path) -> Result<String, String> {
    let port = free_port().map_err(|e| e.to_string())?;
    let (ok, out, err) = output(
        cluster
            .command(cluster.bin_dir.join("tilt"))
            .current_dir(dir)
            .args(["ci", "--timeout=25m", "--port", &port.to_string()]),
    )
    .map_err(|e| format!("running tilt ci: {e}"))?;
    let all = format!("{out}{err}");
    if ok {
        Ok(all)
    } else {
        Err(format!("tilt ci failed:\n{all}"))
    }
}

/// The store's client certificate, CA and key, as the README's quick start
/// takes them from the Secret the operator made, for grpcurl's flags.
struct StoreClient<'a> {
    _dir: tempfile::TempDir,
    flags: Vec<std::ffi::OsString>,
    cluster: &'a Cluster,
}

impl<'a> StoreClient<'a> {
    /// The README's loop: each of `ca.crt`, `tls.crt` and `tls.key` out of
    /// `petstore-store-client` in the store's namespace with kubectl.
    fn from_secret(cluster: &'a Cluster) -> Result<Self, Box<dyn std::error::Error>> {
        let dir = tempfile::Builder::new().prefix("store-client-").tempdir()?;
        let mut flags = Vec::new();
        for (flag, file) in [
            ("-cacert", "ca.crt"),
            ("-cert", "tls.crt"),
            ("-key", "tls.key"),
        ] {
            let pem = cluster.kubectl(&[
                "get",
                "secret",
                "petstore-store-client",
                "-n",
                "petstore",
                "-o",
                &format!("go-template={{{{index .data \"{file}\" | base64decode}}}}"),
            ])?;
            let path = dir.path().join(file);
            std::fs::write(&path, pem)?;
            flags.extend([flag.into(), path.into_os_string()]);
        }
        Ok(Self {
            _dir: dir,
            flags,
            cluster,
        })
    }

    fn grpcurl(&self, method: &str, body: &str) -> fixtures::Result<Vec<Value>> {
        let flags: Vec<&std::ffi::OsStr> = self.flags.iter().map(|f| f.as_os_str()).collect();
        grpcurl_with(&flags, STORE, method, body)
    }

    /// As the README's `search` asks: with the certificate, and a token of
    /// `namespace`'s petstore-tenant minted for the call.
    fn search_as(
        &self,
        cluster: &Cluster,
        namespace: &str,
        body: &str,
    ) -> fixtures::Result<Vec<(String, String)>> {
        let token = cluster.tenant_token(namespace, "petstore")?;
        let header = format!("authorization: Bearer {token}");
        let flags: Vec<&std::ffi::OsStr> = self
            .flags
            .iter()
            .map(|f| f.as_os_str())
            .chain(["-H".as_ref(), header.as_ref()])
            .collect();
        let pets = grpcurl_with(&flags, STORE, "petstore.PetStore/SearchPets", body)?;
        Ok(pets
            .iter()
            .map(|pet| {
                (
                    pet["name"].as_str().unwrap_or_default().to_owned(),
                    pet["id"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect())
    }

    /// README step 4's `search`, in namespace default, through Tilt's
    /// port-forward: (name, id) of every pet it returned.
    fn search(&self, body: &str) -> fixtures::Result<Vec<(String, String)>> {
        self.search_as(self.cluster, "default", body)
    }
}

/// The Pet's store ID once it is Ready for its current generation.
fn ready_id(cluster: &Cluster, name: &str) -> Option<String> {
    let pet = cluster.kubectl_json(&["get", "pet", name]).ok()?;
    is_ready(&pet).then(|| pet["status"]["id"].as_str().map(str::to_owned))?
}

/// Waits until the Pet is Ready with a store ID, and returns the ID.
fn wait_ready_id(cluster: &Cluster, name: &str) -> fixtures::Result<String> {
    wait_for(
        Duration::from_secs(120),
        &format!("{name} Ready with a store ID"),
        || ready_id(cluster, name),
    )
}

/// Until the operator's namespace is gone, its pods with it.
fn wait_operator_namespace_gone(cluster: &Cluster) -> fixtures::Result<()> {
    wait_for(
        Duration::from_secs(180),
        "the operator's namespace to go",
        || {
            cluster
                .kubectl(&["get", "namespace", "petstore-system"])
                .is_err()
                .then_some(())
        },
    )
}

/// Pods of a workload, as JSON items.
fn pods(cluster: &Cluster, namespace: &str, app: &str) -> Vec<Value> {
    let selector = format!("app.kubernetes.io/name={app}");
    cluster
        .kubectl_json(&["get", "pods", "-n", namespace, "-l", &selector])
        .ok()
        .and_then(|list| list["items"].as_array().cloned())
        .unwrap_or_default()
}

/// Asserts that `found`, as [`search`] returns it, holds every (name, id).
fn assert_found(found: &[(String, String)], expected: &[(&str, &str)]) {
    for (name, id) in expected {
        let pet = ((*name).to_owned(), (*id).to_owned());
        assert!(found.contains(&pet), "{pet:?} not in {found:?}");
    }
}

/// The image a Deployment's pods run.
fn image(cluster: &Cluster, namespace: &str, deployment: &str) -> fixtures::Result<String> {
    cluster.deployment(
        namespace,
        deployment,
        "jsonpath={.spec.template.spec.containers[0].image}",
    )
}

fn pod_ready(pod: &Value) -> bool {
    pod["metadata"]["deletionTimestamp"].is_null()
        && pod["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

fn restarts(pod: &Value) -> i64 {
    pod["status"]["containerStatuses"]
        .as_array()
        .map(|cs| cs.iter().filter_map(|c| c["restartCount"].as_i64()).sum())
        .unwrap_or(0)
}

fn lease_holder(cluster: &Cluster) -> Option<String> {
    cluster
        .kubectl(&[
            "get",
            "lease",
            "-n",
            "petstore-system",
            "petstore-operator",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ])
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// No restarts in either workload, and no failed liveness probe (a
/// readiness probe may fail while a container starts; Ready pods show that it
/// passes now).
fn assert_pods_healthy(cluster: &Cluster) -> Result<(), Box<dyn std::error::Error>> {
    for (namespace, app) in [
        ("petstore", "petstore"),
        ("petstore-system", "petstore-operator"),
    ] {
        let all = pods(cluster, namespace, app);
        assert!(!all.is_empty(), "no {app} pods");
        for pod in &all {
            assert!(pod_ready(pod), "{} is not Ready", pod["metadata"]["name"]);
            assert_eq!(restarts(pod), 0, "{} restarted", pod["metadata"]["name"]);
        }
        let events = cluster.kubectl_json(&[
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            "reason=Unhealthy",
        ])?;
        for event in events["items"].as_array().into_iter().flatten() {
            let message = event["message"].as_str().unwrap_or_default();
            assert!(
                !message.starts_with("Liveness"),
                "a liveness probe failed in {namespace}: {message}"
            );
        }
    }
    Ok(())
}

/// The logs of every operator pod hold no Forbidden.
fn assert_no_forbidden(cluster: &Cluster) -> Result<(), Box<dyn std::error::Error>> {
    let logs = cluster.kubectl(&[
        "logs",
        "-n",
        "petstore-system",
        "-l",
        "app.kubernetes.io/name=petstore-operator",
        "--tail=-1",
        "--prefix",
    ])?;
    assert!(!logs.trim().is_empty(), "no operator logs");
    assert!(
        !logs.to_lowercase().contains("forbidden"),
        "the operator was Forbidden:\n{logs}"
    );
    Ok(())
}

/// The pet store's binary from the image the Dockerfile builds in `dir`
/// with the Tiltfile's profile, built by the docker CLI (as the test
/// command's images lane builds), as text for a search.
fn store_binary_built_in(dir: &Path) -> Result<String, Box<dyn std::error::Error>> {
    // BuildKit through buildx, or Debian's CLI, which speaks it by itself.
    let cli = match output(Command::new("docker").args(["buildx", "version"])) {
        Ok((true, _, _)) => "docker",
        _ => "/usr/bin/docker",
    };
    let (ok, image, err) = output(
        Command::new(cli)
            .current_dir(dir)
            .env("DOCKER_BUILDKIT", "1")
            .args(["build", "-q", "--build-arg", "CARGO_PROFILE=dev-image"])
            .args(["--target", "petstore-server", "."]),
    )?;
    if !ok {
        return Err(format!("docker build in {}: {err}", dir.display()).into());
    }
    let (ok, container, err) = output(Command::new("docker").args(["create", image.trim()]))?;
    if !ok {
        return Err(format!("docker create: {err}").into());
    }
    let container = container.trim();
    let copied = dir.join("petstore-server.bin");
    let (ok, _, err) = output(Command::new("docker").args([
        "cp",
        &format!("{container}:/usr/local/bin/petstore-server"),
        &copied.to_string_lossy(),
    ]))?;
    let _ = output(Command::new("docker").args(["rm", container]));
    if !ok {
        return Err(format!("docker cp: {err}").into());
    }
    Ok(String::from_utf8_lossy(&std::fs::read(&copied)?).into_owned())
}

/// A copy of the repository's tracked and untracked (not ignored) files, for
/// an edit that must never touch the clone itself.
fn copy_repo(to: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let root = repo_root();
    let (ok, files, err) = output(Command::new("git").current_dir(&root).args([
        "ls-files",
        "-z",
        "--cached",
        "--others",
        "--exclude-standard",
    ]))?;
    if !ok {
        return Err(format!("git ls-files: {err}").into());
    }
    for file in files.split('\0').filter(|f| !f.is_empty()) {
        let from = root.join(file);
        if !from.is_file() {
            continue; // deleted in the work tree
        }
        let dest = to.join(file);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::copy(&from, &dest)?;
    }
    Ok(())
}

/// `tilt up` in the background, stopped (by PID) on drop.
struct TiltUp(Child, PathBuf);

impl Drop for TiltUp {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.0.id()) {
            // SAFETY: plain syscall on our own child.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl TiltUp {
    /// `tilt up` in `repo`, logging to `log_name` in the cluster's directory;
    /// returns once its port-forwards reach the store and the operator.
    fn start(
        cluster: &Cluster,
        repo: &Path,
        log_name: &str,
        store: &StoreClient<'_>,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let log_path = cluster.dir().join(log_name);
        let log = std::fs::File::create(&log_path)?;
        let tilt_up = TiltUp(
            cluster
                .command(cluster.bin_dir.join("tilt"))
                .current_dir(repo)
                .args(["up", "--stream", "--port", &free_port()?.to_string()])
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()?,
            log_path,
        );
        wait_for(
            Duration::from_secs(600),
            "Tilt's port-forward to the store",
            || {
                store
                    .grpcurl("grpc.health.v1.Health/Check", "{}")
                    .ok()
                    .filter(|out| out.first().is_some_and(|v| v["status"] == "SERVING"))
            },
        )
        .map_err(|e| format!("{e}\n{}", tilt_up.log()))?;
        wait_for(
            Duration::from_secs(600),
            "the operator's /readyz on localhost:8080",
            || fixtures::http::get_ok("127.0.0.1:8080", "/readyz").ok(),
        )
        .map_err(|e| format!("{e}\n{}", tilt_up.log()))?;
        Ok(tilt_up)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.1).unwrap_or_default()
    }
}

#[test]
fn tilt_quick_start_on_a_one_node_cluster() -> TestResult {
    let start = Instant::now();
    let cluster = Cluster::start()?;
    eprintln!("[{}] cluster up", elapsed(start));
    let repo = repo_root().canonicalize()?;

    // 1. tilt ci on the unmodified Tiltfile: every resource healthy.
    let ci = tilt_ci(&cluster, &repo).map_err(|e| format!("{e}\n{}", cluster.log_tails(20)))?;
    assert!(
        ci.contains("SUCCESS. All workloads are healthy."),
        "tilt ci did not report healthy workloads:\n{ci}"
    );
    // Tilt shows the API server's warnings; restricted PSS must raise none.
    assert!(
        !ci.contains("PodSecurity") && !ci.contains("would violate"),
        "Pod Security warnings during tilt ci:\n{ci}"
    );
    // Tilt pushed to the registry on localhost:5005 and the node pulled
    // from it (the images are not in the node's containerd otherwise).
    for (namespace, deployment) in [
        ("petstore", "petstore"),
        ("petstore-system", "petstore-operator"),
    ] {
        let image = image(&cluster, namespace, deployment)?;
        assert!(
            image.starts_with("localhost:5005/"),
            "{deployment} runs {image}, not an image Tilt pushed to localhost:5005"
        );
        // The Tiltfile's build argument reached the build: the dev-image
        // profile, not the Dockerfile's default release.
        let (ok, profile, err) = output(Command::new("docker").args([
            "image",
            "inspect",
            "--format",
            "{{index .Config.Labels \"com.example.petstore.cargo-profile\"}}",
            &image,
        ]))?;
        assert!(ok, "docker image inspect {image}: {err}");
        assert_eq!(profile.trim(), "dev-image", "{image}'s cargo profile");
    }
    eprintln!("[{}] tilt ci: all resources healthy", elapsed(start));

    // tilt up for the port-forwards of steps 3-6 (tilt ci ends with them).
    let store = StoreClient::from_secret(&cluster)?;
    let tilt_up = TiltUp::start(&cluster, &repo, "tilt-up.log", &store)?;
    eprintln!("[{}] tilt up: port-forwards live", elapsed(start));

    // 2. The quick start, steps 3-6, as written.
    // Step 3 (and the book's folder form, checked without writing).
    let samples = repo.join("config/samples");
    cluster.kubectl(&[
        "apply",
        "-f",
        &samples.to_string_lossy(),
        "--dry-run=server",
    ])?;
    cluster.kubectl(&["apply", "-k", &samples.to_string_lossy()])?;
    let thor_id = wait_ready_id(&cluster, "pet-sample1")?;
    let tron_id = wait_ready_id(&cluster, "pet-sample2")?;
    let table = cluster.kubectl(&["get", "pets"])?;
    assert!(
        table.contains(&thor_id) && table.contains(&tron_id),
        "{table}"
    );
    // Step 4.
    let found = store.search("{}")?;
    assert_found(&found, &[("Thor", &thor_id), ("Tron", &tron_id)]);
    assert_eq!(found.len(), 2, "{found:?}");
    // Mutual TLS by default: the store refuses plaintext, and a client that
    // trusts its CA but has no certificate of its own.
    let plaintext = grpcurl(STORE, "petstore.PetStore/SearchPets", "{}");
    assert!(plaintext.is_err(), "plaintext answered: {plaintext:?}");
    let ca_only = grpcurl_with(
        &[store.flags[0].as_os_str(), store.flags[1].as_os_str()],
        STORE,
        "petstore.PetStore/SearchPets",
        "{}",
    );
    assert!(
        ca_only.is_err(),
        "a client without a certificate: {ca_only:?}"
    );
    // Tenancy by default: the certificate without a token is refused, and
    // another namespace's token sees none of default's records.
    let no_token = store.grpcurl("petstore.PetStore/SearchPets", "{}");
    assert!(no_token.is_err(), "a call without a token: {no_token:?}");
    cluster.kubectl(&["create", "namespace", "team-b"])?;
    cluster.create_tenant("team-b")?;
    let as_team_b = store.search_as(&cluster, "team-b", "{}")?;
    assert!(
        as_team_b.is_empty(),
        "team-b reads default's records: {as_team_b:?}"
    );
    // Step 5: the rename keeps the ID.
    cluster.rename_pet("pet-sample1", "Thorbert")?;
    wait_for(Duration::from_secs(120), "Thorbert in the store", || {
        let found = store.search(r#"{"names":["Thorbert"]}"#).ok()?;
        (found == vec![("Thorbert".to_owned(), thor_id.clone())]).then_some(())
    })?;
    assert_eq!(
        ready_id(&cluster, "pet-sample1").as_deref(),
        Some(thor_id.as_str())
    );
    eprintln!("[{}] quick start steps 3-5 passed", elapsed(start));

    // The conversion webhook in the pods, reached through the Service: a
    // v1alpha1 Pet (birthday with a time and offset) is stored as v1 and
    // reads back in v1alpha1 exactly as written.
    let crd = cluster.kubectl_json(&["get", "crd", "pets.petstore.example.com"])?;
    let client_config = &crd["spec"]["conversion"]["webhook"]["clientConfig"];
    assert_eq!(
        client_config["service"]["name"], "petstore-operator-metrics",
        "{client_config}"
    );
    assert!(client_config.get("url").is_none(), "{client_config}");
    cluster.apply(
        "apiVersion: petstore.example.com/v1alpha1\nkind: Pet\nmetadata:\n  name: pet-alpha\n  namespace: default\nspec:\n  name: Alpha\n  type: bird\n  birthday: \"2019-02-03T23:30:00-05:00\"\n",
    )?;
    let alpha_id = wait_ready_id(&cluster, "pet-alpha")?;
    let as_v1 = cluster.kubectl_json(&["get", "pets.v1.petstore.example.com", "pet-alpha"])?;
    assert_eq!(as_v1["spec"]["birthday"], "2019-02-03", "{as_v1}");
    let as_alpha =
        cluster.kubectl_json(&["get", "pets.v1alpha1.petstore.example.com", "pet-alpha"])?;
    assert_eq!(
        as_alpha["spec"]["birthday"], "2019-02-03T23:30:00-05:00",
        "{as_alpha}"
    );
    assert!(
        store
            .search(r#"{"names":["Alpha"]}"#)?
            .contains(&("Alpha".to_owned(), alpha_id)),
        "the v1alpha1 Pet's record"
    );
    cluster.kubectl(&["delete", "pet", "pet-alpha", "--timeout=120s"])?;
    eprintln!(
        "[{}] a v1alpha1 Pet converted by the operator's pods",
        elapsed(start)
    );

    // 3. Real pods.
    // Restricted Pod Security: both namespaces enforce it (so the running
    // pods were admitted under it), and re-admitting the live Deployments
    // with `warn` at restricted raises no warning.
    for namespace in ["petstore", "petstore-system"] {
        let level = cluster.kubectl(&[
            "get",
            "namespace",
            namespace,
            "-o",
            "jsonpath={.metadata.labels.pod-security\\.kubernetes\\.io/enforce}",
        ])?;
        assert_eq!(level.trim(), "restricted", "namespace {namespace}");
        cluster.kubectl(&[
            "label",
            "namespace",
            namespace,
            "--overwrite",
            "pod-security.kubernetes.io/warn=restricted",
        ])?;
    }
    for (namespace, deployment) in [
        ("petstore", "petstore"),
        ("petstore-system", "petstore-operator"),
    ] {
        let live = cluster.dir().join(format!("{deployment}-live.json"));
        std::fs::write(&live, cluster.deployment(namespace, deployment, "json")?)?;
        let kubectl = Tools::get()?.kubectl();
        let (ok, out, err) = output(cluster.command(&kubectl).args([
            "replace",
            "--dry-run=server",
            "-f",
            &live.to_string_lossy(),
        ]))?;
        assert!(ok, "dry-run replace of {deployment}: {err}");
        assert!(
            !err.contains("Warning") && !out.contains("Warning"),
            "{deployment} is not clean under restricted Pod Security: {err}"
        );
        // Probes: a pod turns Ready only when its readiness probe passes
        // (HTTP /readyz for both; the store's says what its gRPC health
        // service says, since a kubelet probe has no client certificate). Every
        // replica, not only the one `tilt ci` waited for: a second replica
        // can still be starting, or an earlier one terminating, when the
        // first turns Ready, so this waits for all of them.
        let app = deployment;
        wait_for(
            Duration::from_secs(120),
            &format!("every {deployment} pod Ready"),
            || {
                let pods = pods(&cluster, namespace, app);
                (!pods.is_empty() && pods.iter().all(pod_ready)).then_some(())
            },
        )
        .map_err(|e| {
            let status = cluster
                .kubectl(&["get", "pods", "-n", namespace, "-o", "wide"])
                .unwrap_or_default();
            format!("{e}\n{status}")
        })?;
    }

    // Nothing restarted, no liveness probe failed, and the operator runs
    // on its ServiceAccount without a single Forbidden.
    assert_pods_healthy(&cluster)?;
    let sa = cluster.deployment(
        "petstore-system",
        "petstore-operator",
        "jsonpath={.spec.template.spec.serviceAccountName}",
    )?;
    assert_eq!(sa.trim(), "petstore-operator");
    assert_no_forbidden(&cluster)?;

    // The store's PVC is bound (local-path, StorageClass `standard`) and the
    // records survive the store pod's deletion.
    let phase = cluster.kubectl(&[
        "get",
        "pvc",
        "-n",
        "petstore",
        "petstore-data",
        "-o",
        "jsonpath={.status.phase}/{.spec.storageClassName}",
    ])?;
    assert_eq!(phase.trim(), "Bound/standard");
    let old_store = pods(&cluster, "petstore", "petstore");
    let old_name = old_store
        .first()
        .and_then(|p| p["metadata"]["name"].as_str())
        .ok_or("no store pod")?
        .to_owned();
    cluster.kubectl(&["delete", "pod", "-n", "petstore", &old_name, "--wait=true"])?;
    wait_for(Duration::from_secs(180), "a new store pod, Ready", || {
        let now = pods(&cluster, "petstore", "petstore");
        now.iter()
            .any(|p| p["metadata"]["name"] != old_name.as_str() && pod_ready(p))
            .then_some(())
    })?;
    // Tilt re-establishes its port-forward to the new pod.
    let found = wait_for(
        Duration::from_secs(120),
        "records after the store pod's deletion",
        || {
            let found = store.search("{}").ok()?;
            (found.len() == 2).then_some(found)
        },
    )
    .map_err(|e| format!("{e}\n{}", tilt_up.log()))?;
    assert_found(&found, &[("Thorbert", &thor_id), ("Tron", &tron_id)]);
    eprintln!(
        "[{}] PVC bound; records survived the store pod's deletion",
        elapsed(start)
    );

    // Two operator replicas: deleting the leader's pod hands the Lease to
    // the other, and a Pet created right after still gets its record.
    wait_for(Duration::from_secs(180), "2 operator pods Ready", || {
        let ops = pods(&cluster, "petstore-system", "petstore-operator");
        (ops.iter().filter(|p| pod_ready(p)).count() == 2).then_some(())
    })?;
    let leader = wait_for(Duration::from_secs(60), "a Lease holder", || {
        lease_holder(&cluster)
    })?;
    let operators: Vec<String> = pods(&cluster, "petstore-system", "petstore-operator")
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    assert!(
        operators.contains(&leader),
        "Lease held by {leader}, not one of {operators:?}"
    );
    assert_no_forbidden(&cluster)?;
    cluster.kubectl(&[
        "delete",
        "pod",
        "-n",
        "petstore-system",
        &leader,
        "--wait=false",
    ])?;
    cluster.apply(
        "apiVersion: petstore.example.com/v1
kind: Pet
metadata: {name: after-handover, namespace: default}
spec: {name: Rex, type: dog, birthday: \"2022-02-02\"}
",
    )?;
    let new_leader = wait_for(Duration::from_secs(120), "the Lease handed over", || {
        // The standby, or the leader's replacement if it is quicker.
        lease_holder(&cluster).filter(|h| {
            h != &leader
                && pods(&cluster, "petstore-system", "petstore-operator")
                    .iter()
                    .any(|p| p["metadata"]["name"] == h.as_str())
        })
    })?;
    let rex_id = wait_ready_id(&cluster, "after-handover")?;
    let found = store.search(r#"{"names":["Rex"]}"#)?;
    assert_eq!(found, vec![("Rex".to_owned(), rex_id.clone())]);
    eprintln!(
        "[{}] Lease handed over from {leader} to {new_leader}; Rex recorded",
        elapsed(start)
    );

    // Every operator replica, on its own ServiceAccount, was never Forbidden
    // (the old leader's logs included, read before it went).
    assert_no_forbidden(&cluster)?;
    for pod in pods(&cluster, "petstore-system", "petstore-operator") {
        assert_eq!(restarts(&pod), 0, "{} restarted", pod["metadata"]["name"]);
    }

    // Uninstalling the operator, with it running in its pods, keeps every
    // record: kubectl deletes the CRDs first, which the guard refuses while
    // Pets exist, then the operator's namespace and the rest. The store is a
    // bundle of its own, so its pod, and Tilt's port-forward to it, stay.
    let records = [
        ("pet-sample1", "Thorbert", &thor_id),
        ("pet-sample2", "Tron", &tron_id),
        ("after-handover", "Rex", &rex_id),
    ];
    let all_found = |found: &[(String, String)]| {
        let expected: Vec<(&str, &str)> =
            records.iter().map(|(_, n, id)| (*n, id.as_str())).collect();
        assert_found(found, &expected);
        assert_eq!(found.len(), records.len(), "{found:?}");
    };
    let default = repo.join("config/default");
    let refused = cluster
        .kubectl(&["delete", "-k", &default.to_string_lossy(), "--wait=false"])
        .expect_err("the Pet CRD's deletion is refused")
        .to_string();
    // Refused by the guard itself, which answered: config/default deletes
    // the CRDs before the namespace the guard's pods run in.
    assert!(
        refused.contains("crd-guard.petstore.example.com")
            && refused.contains(&format!(
                "refusing to delete the Pet CRD pets.petstore.example.com: {} Pets exist",
                records.len()
            )),
        "{refused}"
    );
    wait_operator_namespace_gone(&cluster)?;
    let crd = cluster.kubectl_json(&["get", "crd", "pets.petstore.example.com"])?;
    assert!(crd["metadata"]["deletionTimestamp"].is_null(), "{crd}");
    let pets = cluster.kubectl_json(&["get", "pets", "-n", "default"])?;
    assert_eq!(pets["items"].as_array().map(Vec::len), Some(records.len()));
    all_found(&store.search("{}")?);
    eprintln!(
        "[{}] kubectl delete -k config/default: the operator gone, every Pet and record kept",
        elapsed(start)
    );

    // Installed again (tilt ci, then tilt up for the port-forwards): each
    // Pet is back on its own record. A rename after it reaches the same ID,
    // and nothing was created.
    drop(tilt_up);
    let ci = tilt_ci(&cluster, &repo)?;
    assert!(ci.contains("SUCCESS. All workloads are healthy."), "{ci}");
    let tilt_up = TiltUp::start(&cluster, &repo, "tilt-up-again.log", &store)?;
    cluster.rename_pet("pet-sample2", "Tronald")?;
    wait_for(Duration::from_secs(120), "Tronald in the store", || {
        let found = store.search(r#"{"names":["Tronald"]}"#).ok()?;
        (found == vec![("Tronald".to_owned(), tron_id.clone())]).then_some(())
    })
    .map_err(|e| format!("{e}\n{}", tilt_up.log()))?;
    for (pet, _, id) in records {
        assert_eq!(wait_ready_id(&cluster, pet)?, *id, "{pet}");
    }
    assert_eq!(
        store.search("{}")?.len(),
        records.len(),
        "no record was created"
    );
    assert_no_forbidden(&cluster)?;
    eprintln!(
        "[{}] installed again: every Pet on its own record",
        elapsed(start)
    );

    // Step 6: deleting the Pets empties the store.
    cluster.kubectl(&["delete", "pets", "--all", "-A", "--timeout=120s"])?;
    let left = store.search("{}")?;
    assert!(left.is_empty(), "the store still holds: {left:?}");
    eprintln!(
        "[{}] quick start step 6 passed; pods proven",
        elapsed(start)
    );
    drop(tilt_up);

    // 4. A one-line edit to the store's source and `tilt ci` again roll out
    // a new image. The edit is made in a copy of the repository.
    let copy = tempfile::Builder::new()
        .prefix("petstore-edit-")
        .tempdir()?;
    copy_repo(copy.path())?;
    let main_rs = copy.path().join("petstore-server/src/main.rs");
    let source = std::fs::read_to_string(&main_rs)?;
    // A line that reaches the binary (a comment might not change it), new
    // in every run, so that BuildKit has no layer for it and cargo builds.
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos();
    let edit_marker = |n: u32| format!("tilt-edit-{n}-{nonce}");
    let edit = |n: u32| {
        format!(
            "{source}\n#[used] static TILT_TEST_EDIT: &str = \"{}\";\n",
            edit_marker(n)
        )
    };
    std::fs::write(&main_rs, edit(1))?;
    let older = tempfile::Builder::new()
        .prefix("petstore-older-")
        .tempdir()?;
    copy_repo(older.path())?;
    std::fs::write(older.path().join("petstore-server/src/main.rs"), edit(2))?;
    let image_of_store = || image(&cluster, "petstore", "petstore");
    let before = image_of_store()?;
    let edit_start = Instant::now();
    let ci = tilt_ci(&cluster, copy.path())?;
    assert!(ci.contains("SUCCESS. All workloads are healthy."), "{ci}");
    let after = image_of_store()?;
    assert_ne!(before, after, "the edit did not change the store's image");
    let running = pods(&cluster, "petstore", "petstore");
    assert!(
        running.iter().any(|p| pod_ready(p)
            && p["spec"]["containers"][0]["image"].as_str() == Some(after.as_str())),
        "no Ready store pod runs {after}"
    );
    eprintln!(
        "[{}] edit rolled out {after} (was {before}) in {:.0}s",
        elapsed(start),
        edit_start.elapsed().as_secs_f64()
    );

    // Two checkouts built as `docker build` builds (it keeps the files'
    // mtimes), sharing the images' cargo cache: the edit's copy edited again
    // and built, then the older checkout, whose edit was written before it.
    // Each image must hold its own edit. When cargo judged the sources by
    // mtime, the older checkout got the newer build's binary.
    std::fs::write(&main_rs, edit(3))?;
    let newer_binary = store_binary_built_in(copy.path())?;
    assert!(
        newer_binary.contains(&edit_marker(3)),
        "the edit's image lacks it"
    );
    let older_binary = store_binary_built_in(older.path())?;
    assert!(
        older_binary.contains(&edit_marker(2)) && !older_binary.contains(&edit_marker(3)),
        "an older checkout's image holds a newer checkout's binary, not its own edit"
    );
    eprintln!(
        "[{}] two checkouts' builds each hold their own edit",
        elapsed(start)
    );

    // 5. The chart from the cluster's registry, as a platform team installs
    // it (docs/install.md): `helm install oci://...` with the images Tilt
    // built, and the store kept apart (petstore.enabled=false), so that
    // `helm uninstall` keeps every record. No Pet is left, so the CRD guard
    // lets config/default go with its CRDs.
    // Signed first: each image and the chart, with its SBOM; installed by
    // the operator image's verified digest. The store's image from before
    // the edit was never signed.
    helm_from_the_clusters_registry(&cluster, &repo, &before, start)?;

    // 6. No leftovers.
    let left = cluster.shutdown();
    assert!(left.is_empty(), "left after teardown:\n{}", left.join("\n"));
    eprintln!("[{}] torn down, nothing left", elapsed(start));
    Ok(())
}

/// `kubectl port-forward -n <namespace> <target> <local>:<remote>...` in
/// the background (stopped when dropped; its log in the cluster's
/// directory), once each local port takes connections.
fn port_forward(
    cluster: &Cluster,
    namespace: &str,
    target: &str,
    ports: &[(u16, u16)],
) -> fixtures::Result<Process> {
    let mut command = cluster.command(Tools::get()?.kubectl());
    command.args(["port-forward", "-n", namespace, target]);
    command.args(
        ports
            .iter()
            .map(|(local, remote)| format!("{local}:{remote}")),
    );
    let log = cluster
        .dir()
        .join(format!("port-forward-{}.log", target.replace('/', "-")));
    let forward = Process::spawn("kubectl port-forward", command, &log)?;
    for (local, _) in ports {
        wait_for(
            Duration::from_secs(60),
            &format!("the port-forward to {target} on {local}"),
            || std::net::TcpStream::connect(("127.0.0.1", *local)).ok(),
        )?;
    }
    Ok(forward)
}

/// A reference Tilt or the chart's push made (`localhost:5005/<repository>:<tag>`)
/// split into the registry's repository and tag.
fn repository_and_tag(image: &str) -> Result<(&str, &str), String> {
    image
        .strip_prefix(&format!("localhost:{REGISTRY_PORT}/"))
        .and_then(|path| path.rsplit_once(':'))
        .ok_or_else(|| format!("{image} is not a tagged image in the cluster's registry"))
}

/// Each artifact (an image or the chart, with the SBOM of what it holds)
/// signed by digest in the cluster's registry at `registry` with a release
/// key, its SBOM attested, and both verified as docs/install.md has a
/// platform team verify them: 100% pass. Another key's public half verifies
/// none of them, and `unsigned_image` (a digest nobody signed, in a signed
/// image's repository) verifies with neither. The digests, in order.
fn sign_the_release<const N: usize>(
    registry: &str,
    artifacts: [(&str, sbom::Artifact); N],
    unsigned_image: &str,
) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let cosign = Cosign::new()?;
    let (key, public) = cosign.generate_key_pair("release")?;
    let (_, other_public) = cosign.generate_key_pair("other")?;
    let mut digests = Vec::new();
    for (image, artifact) in artifacts {
        let (repository, tag) = repository_and_tag(image)?;
        let (_, digest) = fixtures::registry::manifest(registry, repository, tag)?;
        let by_digest = format!("{registry}/{repository}@{digest}");
        let sbom = sbom::generate(&repo_root(), artifact, None)?;
        cosign.sign(&key, &by_digest)?;
        cosign.attest_sbom(&key, &cosign.sbom_file(artifact.name, &sbom)?, &by_digest)?;

        let by_tag = format!("{registry}/{repository}:{tag}");
        let verified = cosign.verify(&public, &by_tag)?;
        assert_verified(&verified);
        let payloads: Value = serde_json::from_slice(&verified.stdout)?;
        assert_eq!(
            payloads[0]["critical"]["image"]["docker-manifest-digest"],
            digest.as_str(),
            "{image}: {payloads}"
        );
        let attested = cosign.verify_sbom(&public, &by_tag)?;
        assert_verified(&attested);
        let statements = statements(&attested.stdout);
        let [statement] = statements.as_slice() else {
            panic!("{image}: one attestation, not {statements:?}");
        };
        assert_eq!(statement["predicate"], sbom, "{image}'s attested SBOM");
        assert_eq!(
            statement["predicate"]["metadata"]["component"]["name"],
            artifact.name
        );
        assert_refused(
            &cosign.verify(&other_public, &by_digest)?,
            &format!("{image} with another key"),
            "no matching signatures",
        );
        assert_refused(
            &cosign.verify_sbom(&other_public, &by_digest)?,
            &format!("{image}'s SBOM with another key"),
            "no matching attestations",
        );
        digests.push(digest);
    }
    let (repository, tag) = repository_and_tag(unsigned_image)?;
    let (_, digest) = fixtures::registry::manifest(registry, repository, tag)?;
    assert!(!digests.contains(&digest), "{unsigned_image} was signed");
    let unsigned = format!("{registry}/{repository}@{digest}");
    assert_refused(
        &cosign.verify(&public, &unsigned)?,
        unsigned_image,
        "no signatures found",
    );
    assert_refused(
        &cosign.verify_sbom(&public, &unsigned)?,
        &format!("{unsigned_image}'s SBOM"),
        "no matching attestations",
    );
    Ok(digests)
}

/// The installed operator's bundle swapped for the chart, pushed to the
/// cluster's registry and installed from it: the samples Ready within 60 s
/// of `helm install`, a `helm upgrade` that rolls the operator's pods with
/// no store write, and `helm uninstall` keeping every Pet and record.
fn helm_from_the_clusters_registry(
    cluster: &Cluster,
    repo: &Path,
    unsigned_image: &str,
    start: Instant,
) -> TestResult {
    let operator_image = image(cluster, "petstore-system", "petstore-operator")?;
    let store_image = image(cluster, "petstore", "petstore")?;
    let (repository, tag) = operator_image
        .rsplit_once(':')
        .ok_or_else(|| format!("{operator_image} has no tag"))?;
    // No Pet is left, so the bundle's deletion takes its CRDs: first, while
    // the operator's pods still answer the CRD guard (config/default's
    // order), and then the rest.
    let default = repo.join("config/default");
    cluster.kubectl(&["delete", "-k", &default.to_string_lossy(), "--timeout=180s"])?;
    wait_operator_namespace_gone(cluster)?;
    let crds = cluster.kubectl(&["get", "crds", "-o", "name"])?;
    assert!(!crds.contains("petstore.example.com"), "{crds}");

    let helm = Helm::with_kubeconfig(&cluster.kubeconfig)?;
    let work = tempfile::Builder::new().prefix("chart-").tempdir()?;
    let archive = helm.package(&chart_dir(), work.path())?;
    let registry = format!("127.0.0.1:{REGISTRY_PORT}");
    helm.push(&archive, &registry, "charts")?;
    let chart_image = format!("localhost:{REGISTRY_PORT}/charts/{CHART}:{CHART_VERSION}");
    let signed = sign_the_release(
        &registry,
        [
            (&operator_image, sbom::OPERATOR_IMAGE),
            (&store_image, sbom::STORE_IMAGE),
            (&chart_image, sbom::CHART),
        ],
        unsigned_image,
    )?;
    let operator_digest = &signed[0];
    eprintln!(
        "[{}] the two images and the chart signed, with their SBOMs, and verified",
        elapsed(start)
    );

    // `helm install|upgrade petstore oci://...` of the version pushed, and
    // more flags.
    let chart = format!("oci://{registry}/charts/{CHART}");
    let release = |verb: &str, flags: &[&str]| {
        let head = [
            verb,
            "petstore",
            &chart,
            "--version",
            CHART_VERSION,
            "--plain-http",
            "--namespace",
            "default",
        ];
        helm.run(&[&head[..], flags].concat())
    };
    let installed = Instant::now();
    let out = release(
        "install",
        &[
            "--set",
            "petstore.enabled=false",
            "--set",
            &format!("image.repository={repository}"),
            "--set",
            &format!("image.tag={tag}"),
            "--set",
            &format!("image.digest={operator_digest}"),
        ],
    )?;
    assert!(out.contains("STATUS: deployed"), "{out}");
    let samples = repo.join("config/samples");
    cluster.kubectl(&["apply", "-k", &samples.to_string_lossy()])?;
    let thor_id = wait_ready_id(cluster, "pet-sample1")?;
    let tron_id = wait_ready_id(cluster, "pet-sample2")?;
    let took = installed.elapsed();
    assert!(
        took <= Duration::from_secs(60),
        "the samples were Ready {took:?} after helm install, not within 60 s"
    );
    assert_eq!(
        image(cluster, "petstore-system", "petstore-operator")?,
        format!("{operator_image}@{operator_digest}")
    );
    assert_no_forbidden(cluster)?;
    eprintln!(
        "[{}] helm install {chart}: the samples Ready in {:.0}s",
        elapsed(start),
        took.as_secs_f64()
    );

    // The records and the store's metrics, through a port-forward of its
    // Service.
    let metrics_port = free_port()?;
    let store_metrics = format!("127.0.0.1:{metrics_port}");
    let forward = port_forward(
        cluster,
        "petstore",
        "service/petstore-service",
        &[(6742, 6742), (metrics_port, 9090)],
    )?;
    let store = StoreClient::from_secret(cluster)?;
    let records = || {
        wait_for(Duration::from_secs(60), "the store's records", || {
            let mut found = store.search("{}").ok()?;
            found.sort();
            (found.len() == 2).then_some(found)
        })
    };
    let expected = vec![
        ("Thor".to_owned(), thor_id.clone()),
        ("Tron".to_owned(), tron_id.clone()),
    ];
    assert_eq!(records()?, expected);

    // helm upgrade that rolls the operator's pods (another log format): the
    // new leader reconciles both Pets, reads their records, and writes
    // nothing to the store. (0.1.0 had no chart: an upgrade from the
    // previous chart version is first possible from 0.2.0 on.)
    let writes = || {
        wait_for(Duration::from_secs(60), "the store's write count", || {
            write_rpcs_answered(&store_metrics).ok()
        })
    };
    let writes_before = writes()?;
    let old_pods: Vec<String> = pods(cluster, "petstore-system", "petstore-operator")
        .iter()
        .filter_map(|pod| pod["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    let out = release("upgrade", &["--reuse-values", "--set", "logFormat=text"])?;
    assert!(out.contains("STATUS: deployed"), "{out}");
    let leader = wait_for(
        Duration::from_secs(180),
        "the operator's pods replaced, Ready, and a new one leading",
        || {
            let now = pods(cluster, "petstore-system", "petstore-operator");
            let replaced = now.len() == 2
                && now.iter().all(|pod| {
                    pod_ready(pod)
                        && pod["metadata"]["name"]
                            .as_str()
                            .is_some_and(|name| !old_pods.iter().any(|old| old == name))
                });
            lease_holder(cluster).filter(|holder| replaced && !old_pods.contains(holder))
        },
    )?;
    let leader_port = free_port()?;
    let leader_metrics = format!("127.0.0.1:{leader_port}");
    let leader_forward = port_forward(
        cluster,
        "petstore-system",
        &format!("pod/{leader}"),
        &[(leader_port, 8080)],
    )?;
    wait_for(
        Duration::from_secs(120),
        "the new leader to finish reconciling both Pets",
        || {
            let scrape = fixtures::http::scrape(&leader_metrics).ok()?;
            let done = fixtures::http::sum_series(
                &scrape,
                "petstore_operator_reconcile_duration_seconds_count",
                "",
            );
            (done >= 2.0).then_some(())
        },
    )?;
    drop(leader_forward);
    assert_eq!(writes()?, writes_before, "helm upgrade wrote to the store");
    assert_eq!(
        ready_id(cluster, "pet-sample1").as_deref(),
        Some(thor_id.as_str())
    );
    assert_eq!(
        ready_id(cluster, "pet-sample2").as_deref(),
        Some(tron_id.as_str())
    );
    eprintln!(
        "[{}] helm upgrade: the operator's pods replaced, {leader} leading, 0 store writes, every ID kept",
        elapsed(start)
    );

    // helm uninstall: the operator and its guards go; the CRDs (kept by
    // resource policy), every Pet and every record stay.
    let out = helm.run(&["uninstall", "petstore", "--namespace", "default"])?;
    assert!(out.contains("uninstalled"), "{out}");
    wait_operator_namespace_gone(cluster)?;
    let pets = cluster.kubectl_json(&["get", "pets", "-n", "default"])?;
    assert_eq!(pets["items"].as_array().map(Vec::len), Some(2), "{pets}");
    assert_eq!(records()?, expected, "every record kept");
    drop(forward);
    eprintln!(
        "[{}] helm uninstall: every Pet and record kept",
        elapsed(start)
    );
    Ok(())
}
