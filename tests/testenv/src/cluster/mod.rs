//! A real one-node Kubernetes cluster, built and cached like the control
//! plane, that stands in for the kind cluster of the README's Tilt quick
//! start:
//!
//! - control plane: etcd, kube-apiserver, kube-controller-manager with all
//!   controllers, kube-scheduler;
//! - node: kubelet, kube-proxy, a containerd of its own with CRI and runc,
//!   the CNI bridge, CoreDNS, and local-path-provisioner as the default
//!   StorageClass `standard`;
//! - a registry on `localhost:5005` with the `kube-public/local-registry-hosting`
//!   ConfigMap, as ctlptl makes it;
//! - a kubeconfig whose context is `kind-petstore`.
//!
//! Every one of these processes runs inside a network namespace made here,
//! whose default route is a blackhole. The host reaches the API server and
//! the registry only through forwarders on 127.0.0.1. When no Docker engine
//! answers, Debian's `docker.io` is installed and `dockerd` started; the
//! harness stops only what it started, by PID. Dropping a [`Cluster`] (also
//! during a panic) tears everything down: processes, container tasks and
//! shims, mounts, cgroups, the namespace and with it every iptables rule
//! made inside it.
//!
//! Needs root (namespaces, mounts, containerd).

mod addons;
mod forward;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub use forward::Forwarder;

use crate::{Error, Process, Result, Tools, free_port, io, repo_root, run, wait_for};

/// The node's address inside its namespace, and the ranges kind uses.
pub const NODE_IP: &str = "10.250.0.2";
pub const NODE_NAME: &str = "petstore-control-plane";
const POD_CIDR: &str = "10.244.0.0/24";
const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The kube context name ctlptl's `kind-petstore` cluster yields.
pub const CONTEXT: &str = "kind-petstore";
/// The registry port of config/ctlptl.yaml.
pub const REGISTRY_PORT: u16 = 5005;
const DOCKER_SOCK: &str = "/var/run/docker.sock";

pub struct Cluster {
    /// Admin kubeconfig, context `kind-petstore`, server on 127.0.0.1.
    pub kubeconfig: PathBuf,
    /// `https://127.0.0.1:<port>`, the forwarder to the API server.
    pub api_url: String,
    /// Where build.sh put tilt, the node binaries and the registry.
    pub bin_dir: PathBuf,
    netns: String,
    cgroup_root: String,
    containerd_sock: PathBuf,
    forwarders: Vec<Forwarder>,
    /// Node processes, stopped in reverse order of start.
    processes: Vec<Process>,
    /// dockerd, only if this harness started it.
    dockerd: Option<Process>,
    /// Entries of /run/netns before the cluster started: anything new with a
    /// `cni-` name was made by this cluster's containerd.
    netns_before: BTreeSet<String>,
    torn_down: bool,
    dir: tempfile::TempDir,
}

fn sh(program: &str, args: &[&str]) -> Result<String> {
    run(Command::new(program).args(args))
}

fn write(path: &Path, text: &str) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io(format!("creating {}", parent.display())))?;
    }
    std::fs::write(path, text).map_err(io(format!("writing {}", path.display())))
}

fn script(name: &str, args: &[&str]) -> Result<String> {
    let path = repo_root().join("hack/cluster").join(name);
    let out = run(Command::new("bash").arg(&path).args(args))?;
    Ok(out.trim().to_owned())
}

fn docker_answers() -> bool {
    Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .output()
        .map(|out| out.status.success())
        .unwrap_or(false)
}

fn list_netns() -> BTreeSet<String> {
    std::fs::read_dir("/run/netns")
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Mount points at or below `root`, deepest first.
fn mounts_under(root: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<PathBuf> = text
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        // mountinfo escapes spaces and such as octal; paths here have none.
        .map(PathBuf::from)
        .filter(|p| p.starts_with(root))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    points
}

fn umount(path: &Path) {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return;
    };
    // SAFETY: plain syscall with a valid C string.
    unsafe {
        libc::umount2(c.as_ptr(), libc::MNT_DETACH);
    }
}

fn cgroup_hierarchies() -> Vec<PathBuf> {
    std::fs::read_dir("/sys/fs/cgroup")
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.join("cgroup.procs").exists())
                .collect()
        })
        .unwrap_or_default()
}

/// Every PID in the cgroup tree at `dir`.
fn cgroup_pids(dir: &Path, out: &mut BTreeSet<i32>) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                cgroup_pids(&entry.path(), out);
            }
        }
    }
}

/// Removes a cgroup tree, deepest first (only empty cgroups can go).
fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                remove_cgroup_tree(&entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// PIDs of processes whose command line contains `needle`.
fn pids_with_cmdline(needle: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|raw| {
                    String::from_utf8_lossy(&raw)
                        .replace('\0', " ")
                        .contains(needle)
                })
                .unwrap_or(false)
        })
        .collect()
}

fn kill9(pid: i32) {
    // SAFETY: plain syscall.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
}

impl Cluster {
    pub fn start() -> Result<Self> {
        // SAFETY: plain syscall.
        if unsafe { libc::geteuid() } != 0 {
            return Err(Error::Command {
                command: "Cluster::start".into(),
                status: "not root".into(),
                stderr: "the one-node cluster needs root (network namespaces, mounts, containerd)"
                    .into(),
            });
        }
        let started = Instant::now();
        let step =
            |what: &str| eprintln!("[cluster {:>5.1}s] {what}", started.elapsed().as_secs_f64());

        let tools = Tools::get()?;
        // Debian packages the node needs; docker.io only when no engine answers.
        let engine_up = docker_answers();
        script(
            "host-packages.sh",
            if engine_up { &[] } else { &["--engine"] },
        )?;
        step("building or finding the node binaries, Tilt and the registry");
        let bin_dir = PathBuf::from(script("build.sh", &[])?);

        let dir = tempfile::Builder::new()
            .prefix("petstore-cluster-")
            .tempdir()
            .map_err(io("creating the cluster directory"))?;
        let root = dir.path().to_owned();
        let id = std::process::id();
        let netns = format!("petstore-{id}");
        let mut cluster = Self {
            kubeconfig: root.join("kubeconfig"),
            api_url: String::new(),
            bin_dir: bin_dir.clone(),
            netns: netns.clone(),
            cgroup_root: format!("petstore-{id}"),
            containerd_sock: root.join("containerd/containerd.sock"),
            forwarders: Vec::new(),
            processes: Vec::new(),
            dockerd: None,
            netns_before: list_netns(),
            torn_down: false,
            dir,
        };

        if !engine_up {
            step("no Docker engine answers: starting dockerd");
            let mut command = Command::new("dockerd");
            command.arg(format!("--host=unix://{DOCKER_SOCK}"));
            let dockerd = Process::spawn("dockerd", command, &root.join("dockerd.log"))?;
            cluster.dockerd = Some(dockerd);
            wait_for(Duration::from_secs(60), "dockerd", || {
                docker_answers().then_some(())
            })?;
        }
        step("base images (stand-ins where they cannot be pulled) and node images");
        let images = PathBuf::from(script("images.sh", &[&bin_dir.to_string_lossy()])?);

        step("network namespace");
        cluster.make_netns()?;
        let ns_path = format!("/run/netns/{netns}");
        let in_ns = |program: PathBuf| {
            let mut command = Command::new("nsenter");
            command.arg(format!("--net={ns_path}")).arg(program);
            command
        };

        step("PKI");
        let pki = root.join("pki");
        std::fs::create_dir_all(&pki).map_err(io("creating the pki directory"))?;
        make_pki(&pki)?;
        let p = |name: &str| pki.join(name).to_string_lossy().into_owned();

        step("etcd");
        let mut etcd = in_ns(tools.bin("etcd"));
        etcd.arg(format!("--data-dir={}", root.join("etcd").display()))
            .args([
                "--listen-client-urls=http://127.0.0.1:2379",
                "--advertise-client-urls=http://127.0.0.1:2379",
                "--listen-peer-urls=http://127.0.0.1:2380",
                "--initial-advertise-peer-urls=http://127.0.0.1:2380",
                "--initial-cluster=default=http://127.0.0.1:2380",
                "--unsafe-no-fsync=true",
            ]);
        cluster.spawn("etcd", etcd)?;

        step("kube-apiserver");
        let mut apiserver = in_ns(tools.bin("kube-apiserver"));
        apiserver
            .args([
                "--etcd-servers=http://127.0.0.1:2379",
                "--bind-address=0.0.0.0",
                "--secure-port=6443",
            ])
            .arg(format!("--advertise-address={NODE_IP}"))
            .arg(format!("--cert-dir={}", root.join("apiserver").display()))
            .arg(format!("--tls-cert-file={}", p("serving.crt")))
            .arg(format!("--tls-private-key-file={}", p("serving.key")))
            .arg(format!("--client-ca-file={}", p("ca.crt")))
            .arg(format!("--kubelet-client-certificate={}", p("admin.crt")))
            .arg(format!("--kubelet-client-key={}", p("admin.key")))
            // The node's name is not in any DNS; logs and port-forward go
            // to its address.
            .arg("--kubelet-preferred-address-types=InternalIP,Hostname")
            .arg(format!("--service-cluster-ip-range={SERVICE_CIDR}"))
            .arg("--authorization-mode=Node,RBAC")
            .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
            .arg(format!("--service-account-key-file={}", p("sa.pub")))
            .arg(format!(
                "--service-account-signing-key-file={}",
                p("sa.key")
            ))
            .arg("--allow-privileged=true");
        cluster.spawn("kube-apiserver", apiserver)?;

        let api_port = free_port()?;
        let forwarder = Forwarder::start(
            SocketAddr::from(([127, 0, 0, 1], api_port)),
            Path::new(&ns_path),
            SocketAddr::from(([127, 0, 0, 1], 6443)),
        )?;
        cluster.forwarders.push(forwarder);
        cluster.api_url = format!("https://127.0.0.1:{api_port}");
        write_kubeconfig(&cluster.kubeconfig, &cluster.api_url, &pki)?;
        // Node components reach the API server inside the namespace.
        let node_kubeconfig = root.join("node.kubeconfig");
        write_kubeconfig(&node_kubeconfig, &format!("https://{NODE_IP}:6443"), &pki)?;
        let nk = node_kubeconfig.to_string_lossy().into_owned();
        wait_for(Duration::from_secs(90), "kube-apiserver /readyz", || {
            cluster
                .kubectl(&["get", "--raw", "/readyz"])
                .ok()
                .filter(|body| body.trim() == "ok")
        })?;

        step("kube-controller-manager and kube-scheduler");
        let mut kcm = in_ns(tools.bin("kube-controller-manager"));
        kcm.arg(format!("--kubeconfig={nk}"))
            .args(["--controllers=*", "--leader-elect=false", "--secure-port=0"])
            .arg(format!(
                "--service-account-private-key-file={}",
                p("sa.key")
            ))
            .arg(format!("--root-ca-file={}", p("ca.crt")))
            .arg(format!("--cluster-signing-cert-file={}", p("ca.crt")))
            .arg(format!("--cluster-signing-key-file={}", p("ca.key")))
            .arg(format!("--service-cluster-ip-range={SERVICE_CIDR}"))
            .arg("--use-service-account-credentials=false")
            .arg("--cluster-name=kind-petstore");
        cluster.spawn("kube-controller-manager", kcm)?;
        let mut scheduler = in_ns(bin_dir.join("kube-scheduler"));
        scheduler
            .arg(format!("--kubeconfig={nk}"))
            .arg(format!("--authentication-kubeconfig={nk}"))
            .arg(format!("--authorization-kubeconfig={nk}"))
            .args(["--leader-elect=false", "--bind-address=127.0.0.1"]);
        cluster.spawn("kube-scheduler", scheduler)?;

        step("containerd");
        cluster.start_containerd(&root)?;
        let ctr_sock = cluster.containerd_sock.to_string_lossy().into_owned();
        for entry in std::fs::read_dir(&images).map_err(io("reading the node images"))? {
            let tar = entry.map_err(io("reading the node images"))?.path();
            if tar.extension().is_some_and(|e| e == "tar") {
                sh(
                    "ctr",
                    &[
                        "--address",
                        &ctr_sock,
                        "-n",
                        "k8s.io",
                        "images",
                        "import",
                        &tar.to_string_lossy(),
                    ],
                )?;
            }
        }

        step("registry on localhost:5005");
        let registry_dir = root.join("registry");
        write(
            &registry_dir.join("config.yml"),
            &format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{REGISTRY_PORT}\n",
                registry_dir.join("data").display()
            ),
        )?;
        let mut registry = in_ns(bin_dir.join("registry"));
        registry
            .arg("serve")
            .arg(registry_dir.join("config.yml"))
            .env("OTEL_TRACES_EXPORTER", "none");
        cluster.spawn("registry", registry)?;
        let forwarder = Forwarder::start(
            SocketAddr::from(([127, 0, 0, 1], REGISTRY_PORT)),
            Path::new(&ns_path),
            SocketAddr::from(([127, 0, 0, 1], REGISTRY_PORT)),
        )?;
        cluster.forwarders.push(forwarder);

        step("kubelet and kube-proxy");
        cluster.start_node(&root, &bin_dir, &pki, &nk)?;
        wait_for(Duration::from_secs(120), "node Ready", || {
            cluster
                .kubectl(&[
                    "get",
                    "node",
                    NODE_NAME,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                ])
                .ok()
                .filter(|s| s.trim() == "True")
        })?;

        step("CoreDNS, local-path-provisioner, registry ConfigMap");
        let versions = std::fs::read_to_string(repo_root().join("hack/cluster/versions.env"))
            .map_err(io("reading hack/cluster/versions.env"))?;
        let version = |key: &str| {
            versions
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .unwrap_or_default()
                .to_owned()
        };
        let coredns = addons::COREDNS.replace("COREDNS_VERSION", &version("COREDNS_VERSION"));
        let local_path = addons::LOCAL_PATH
            .replace("LPP_VERSION", &version("LOCAL_PATH_PROVISIONER_VERSION"))
            .replace("LOCAL_PATH_DIR", &root.join("local-path").to_string_lossy());
        cluster.apply(&coredns)?;
        cluster.apply(&local_path)?;
        cluster.apply(addons::REGISTRY_HOSTING)?;
        for (namespace, deployment) in [
            ("kube-system", "coredns"),
            ("local-path-storage", "local-path-provisioner"),
        ] {
            cluster.kubectl(&[
                "rollout",
                "status",
                "-n",
                namespace,
                &format!("deployment/{deployment}"),
                "--timeout=180s",
            ])?;
        }
        step("cluster ready");
        Ok(cluster)
    }

    fn spawn(&mut self, name: &str, command: Command) -> Result<()> {
        let log = self.dir.path().join(format!("{name}.log"));
        self.processes.push(Process::spawn(name, command, &log)?);
        Ok(())
    }

    fn ns_path(&self) -> String {
        format!("/run/netns/{}", self.netns)
    }

    /// `ip` inside the namespace.
    fn ip_in_ns(&self, args: &[&str]) -> Result<String> {
        let mut full = vec!["-n", &self.netns];
        full.extend_from_slice(args);
        sh("ip", &full)
    }

    fn make_netns(&self) -> Result<()> {
        sh("ip", &["netns", "add", &self.netns])?;
        self.ip_in_ns(&["link", "set", "lo", "up"])?;
        self.ip_in_ns(&["link", "add", "node0", "type", "bridge"])?;
        self.ip_in_ns(&["addr", "add", &format!("{NODE_IP}/24"), "dev", "node0"])?;
        self.ip_in_ns(&["link", "set", "node0", "up"])?;
        // Nothing leaves: every address not on the node or its pods is dropped.
        self.ip_in_ns(&["route", "add", "blackhole", "default"])?;
        let ns = format!("--net={}", self.ns_path());
        sh("nsenter", &[&ns, "sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
        Ok(())
    }

    fn start_containerd(&mut self, root: &Path) -> Result<()> {
        let base = root.join("containerd");
        let certs = base.join("certs.d");
        // Pulls of localhost:5005/... go to the registry over plain HTTP.
        write(
            &certs.join(format!("localhost:{REGISTRY_PORT}/hosts.toml")),
            &format!(
                "server = \"http://localhost:{REGISTRY_PORT}\"\n\n[host.\"http://127.0.0.1:{REGISTRY_PORT}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
            ),
        )?;
        write(
            &root.join("cni/net.d/10-petstore.conflist"),
            &format!(
                r#"{{"cniVersion": "0.4.0", "name": "petstore", "plugins": [
  {{"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
    "ipam": {{"type": "host-local", "ranges": [[{{"subnet": "{POD_CIDR}"}}]],
              "routes": [{{"dst": "0.0.0.0/0"}}], "dataDir": "{ipam}"}}}},
  {{"type": "portmap", "capabilities": {{"portMappings": true}}}}
]}}
"#,
                ipam = root.join("cni/ipam").display()
            ),
        )?;
        let config = base.join("config.toml");
        // restrict_oom_score_adj: root here lacks CAP_SYS_RESOURCE, so runc
        // could not lower the sandbox's oom_score_adj and every sandbox would
        // fail. cgroupfs: the machine has a cgroup v1 hierarchy and no systemd.
        write(
            &config,
            &format!(
                r#"version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{certs}"
"#,
                root = base.join("root").display(),
                state = base.join("state").display(),
                sock = self.containerd_sock.display(),
                cni = root.join("cni/net.d").display(),
                certs = certs.display(),
            ),
        )?;
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net={}", self.ns_path()))
            .arg("containerd")
            .arg("--config")
            .arg(&config);
        self.spawn("containerd", command)?;
        let sock = self.containerd_sock.to_string_lossy().into_owned();
        wait_for(Duration::from_secs(30), "containerd", || {
            sh("ctr", &["--address", &sock, "version"]).ok()
        })?;
        Ok(())
    }

    fn start_node(&mut self, root: &Path, bin_dir: &Path, pki: &Path, nk: &str) -> Result<()> {
        // A nameserver that does not answer: no lookup leaves the node.
        write(&root.join("resolv.conf"), "nameserver 127.0.0.53\n")?;
        for hierarchy in cgroup_hierarchies() {
            let _ = std::fs::create_dir_all(hierarchy.join(&self.cgroup_root));
        }
        let kubelet_config = root.join("kubelet.yaml");
        write(
            &kubelet_config,
            &format!(
                r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup_root}
containerRuntimeEndpoint: unix://{sock}
failSwapOn: false
address: {NODE_IP}
readOnlyPort: 0
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: AlwaysAllow}}
clusterDNS: [10.96.0.10]
clusterDomain: cluster.local
resolvConf: {resolv}
serializeImagePulls: false
imageGCHighThresholdPercent: 100
evictionHard: {{memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}}
"#,
                cgroup_root = self.cgroup_root,
                sock = self.containerd_sock.display(),
                ca = pki.join("ca.crt").display(),
                resolv = root.join("resolv.conf").display(),
            ),
        )?;
        let mut kubelet = Command::new("nsenter");
        kubelet
            .arg(format!("--net={}", self.ns_path()))
            .arg(bin_dir.join("kubelet"))
            .arg(format!("--config={}", kubelet_config.display()))
            .arg(format!("--kubeconfig={nk}"))
            .arg(format!("--root-dir={}", root.join("kubelet").display()))
            .arg(format!("--hostname-override={NODE_NAME}"))
            .arg(format!("--node-ip={NODE_IP}"));
        self.spawn("kubelet", kubelet)?;

        // kube-proxy exits when its config file is rewritten: written once.
        let proxy_config = root.join("kube-proxy.yaml");
        write(
            &proxy_config,
            &format!(
                r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {{kubeconfig: {nk}}}
mode: iptables
hostnameOverride: {NODE_NAME}
clusterCIDR: {POD_CIDR}
conntrack: {{maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}}
iptables: {{masqueradeAll: true}}
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
"#
            ),
        )?;
        let mut proxy = Command::new("nsenter");
        proxy
            .arg(format!("--net={}", self.ns_path()))
            .arg(bin_dir.join("kube-proxy"))
            .arg(format!("--config={}", proxy_config.display()));
        self.spawn("kube-proxy", proxy)?;
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The environment for tools run against the cluster: its kubeconfig,
    /// the cluster's binaries first on PATH, no analytics and no version
    /// lookups.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new(program);
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![self.bin_dir.clone()];
        if let Ok(tools) = Tools::get() {
            dirs.push(tools.dir.clone());
        }
        dirs.extend(std::env::split_paths(&path));
        if let Ok(joined) = std::env::join_paths(dirs) {
            command.env("PATH", joined);
        }
        command
            .env("KUBECONFIG", &self.kubeconfig)
            .env("TILT_DISABLE_ANALYTICS", "1")
            .env("DO_NOT_TRACK", "1")
            // Tilt asks its cloud for a suggested version; point it at a
            // closed local port so the test sends nothing off the machine.
            .env("TILT_CLOUD_ADDRESS", "localhost:1");
        command
    }

    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        let kubectl = Tools::get()?.kubectl();
        run(self.command(kubectl).args(args))
    }

    /// `kubectl apply -f -`, returning stdout and stderr (warnings).
    pub fn apply(&self, yaml: &str) -> Result<String> {
        let path = self.dir().join(format!("apply-{}.yaml", fastrand::u64(..)));
        write(&path, yaml)?;
        let out = self.kubectl(&["apply", "-f", &path.to_string_lossy()]);
        let _ = std::fs::remove_file(&path);
        out
    }

    /// The tails of the node's logs, for diagnosing a failure.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for process in &self.processes {
            let _ = writeln!(
                out,
                "---- {} ----\n{}",
                process.name(),
                process.log_tail(lines)
            );
        }
        out
    }

    /// Tears everything down and reports whatever is still left (empty when
    /// clean): processes, mounts, cgroups, the namespace, pod namespaces,
    /// and Kubernetes iptables rules on the host.
    pub fn shutdown(mut self) -> Vec<String> {
        self.teardown();
        self.leftovers()
    }

    fn teardown(&mut self) {
        if self.torn_down {
            return;
        }
        self.torn_down = true;
        self.forwarders.clear();
        // kubelet and kube-proxy first, so nothing restarts containers.
        for name in ["kubelet", "kube-proxy"] {
            if let Some(process) = self.processes.iter_mut().find(|p| p.name() == name) {
                process.kill();
            }
        }
        // Every container task (sandboxes included) of this containerd.
        let sock = self.containerd_sock.to_string_lossy().into_owned();
        let ctr = |args: &[&str]| {
            let namespaced = ["--address", sock.as_str(), "-n", "k8s.io"];
            sh("ctr", &[&namespaced[..], args].concat())
        };
        if let Ok(tasks) = ctr(&["tasks", "ls", "-q"]) {
            let tasks: Vec<&str> = tasks.lines().filter(|t| !t.trim().is_empty()).collect();
            for task in &tasks {
                let _ = ctr(&["tasks", "kill", "-s", "SIGKILL", task]);
            }
            std::thread::sleep(Duration::from_millis(500));
            for task in &tasks {
                let _ = ctr(&["tasks", "delete", "-f", task]);
            }
        }
        // Whatever is still in the pods' cgroups.
        for _ in 0..3 {
            let mut pids = BTreeSet::new();
            for hierarchy in cgroup_hierarchies() {
                cgroup_pids(&hierarchy.join(&self.cgroup_root), &mut pids);
            }
            if pids.is_empty() {
                break;
            }
            pids.into_iter().for_each(kill9);
            std::thread::sleep(Duration::from_millis(300));
        }
        // The rest of the node and control plane, newest first.
        while let Some(mut process) = self.processes.pop() {
            process.terminate(Duration::from_secs(5));
        }
        // Shims of this containerd outlive it (they are daemonized).
        for pid in pids_with_cmdline(&sock) {
            kill9(pid);
        }
        for hierarchy in cgroup_hierarchies() {
            remove_cgroup_tree(&hierarchy.join(&self.cgroup_root));
        }
        for point in mounts_under(self.dir.path()) {
            umount(&point);
        }
        for name in list_netns().difference(&self.netns_before) {
            if name.starts_with("cni-") {
                let path = Path::new("/run/netns").join(name);
                umount(&path);
                let _ = std::fs::remove_file(&path);
            }
        }
        // Deleting the namespace removes its interfaces and every iptables
        // rule kube-proxy, the CNI plugins and kubelet made in it.
        let _ = sh("ip", &["netns", "delete", &self.netns]);
        if let Some(mut dockerd) = self.dockerd.take() {
            dockerd.terminate(Duration::from_secs(20));
        }
    }

    fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        let dir = self.dir.path().to_string_lossy().into_owned();
        for pid in pids_with_cmdline(&dir) {
            left.push(format!(
                "process {pid} still runs with {dir} in its command line"
            ));
        }
        for point in mounts_under(self.dir.path()) {
            left.push(format!("mount {} is still there", point.display()));
        }
        let now = list_netns();
        if now.contains(&self.netns) {
            left.push(format!("network namespace {} still exists", self.netns));
        }
        for name in now.difference(&self.netns_before) {
            left.push(format!("network namespace {name} was made and not removed"));
        }
        for hierarchy in cgroup_hierarchies() {
            let path = hierarchy.join(&self.cgroup_root);
            if path.exists() {
                left.push(format!("cgroup {} still exists", path.display()));
            }
        }
        // The namespace's rules went with it; none may have reached the host.
        for table in ["nat", "filter"] {
            if let Ok(rules) = sh("iptables-save", &["-t", table]) {
                for line in rules.lines() {
                    if line.contains("KUBE-") || line.contains(POD_CIDR) {
                        left.push(format!("host iptables ({table}): {line}"));
                    }
                }
            }
        }
        left
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() && !self.torn_down {
            eprintln!("{}", self.log_tails(30));
        }
        self.teardown();
        // TempDir removes the directory next.
    }
}

/// The cluster's CA, the API server's serving certificate (valid for the
/// forwarder on 127.0.0.1, the node and the `kubernetes` Service), an admin
/// client certificate and the service-account signing keys.
fn make_pki(dir: &Path) -> Result<()> {
    crate::certs::Pki::create_with(
        dir,
        "/CN=kind-petstore-ca",
        &format!(
            "IP:127.0.0.1,IP:{NODE_IP},IP:10.96.0.1,DNS:localhost,DNS:kubernetes,\
             DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
        ),
        "/O=system:masters/CN=kubernetes-admin",
    )
    .map(drop)
}

fn write_kubeconfig(path: &Path, server: &str, pki: &Path) -> Result<()> {
    write(
        path,
        &format!(
            "apiVersion: v1
kind: Config
clusters:
- name: {CONTEXT}
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: {CONTEXT}
  user:
    client-certificate: {crt}
    client-key: {key}
contexts:
- name: {CONTEXT}
  context:
    cluster: {CONTEXT}
    user: {CONTEXT}
current-context: {CONTEXT}
",
            ca = pki.join("ca.crt").display(),
            crt = pki.join("admin.crt").display(),
            key = pki.join("admin.key").display(),
        ),
    )
}
