//! etcd + kube-apiserver + kube-controller-manager (namespace controller
//! only) on 127.0.0.1, with TLS, RBAC and service-account token signing.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::certs::Pki;
use crate::{Error, Process, Result, Tools, free_port, io, run, wait_for};

pub struct ControlPlane {
    // Field order is drop order: stop the controller manager and API server
    // before etcd, then remove the directory.
    controller_manager: Process,
    apiserver: Process,
    etcd: Process,
    pki: Pki,
    pub url: String,
    /// Admin kubeconfig (client certificate in system:masters).
    pub kubeconfig: PathBuf,
    dir: tempfile::TempDir,
}

fn etcd_healthy(port: u16) -> bool {
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response.contains("\"health\":\"true\"")
}

impl ControlPlane {
    pub fn start() -> Result<Self> {
        let tools = Tools::get()?;
        let dir = tempfile::Builder::new()
            .prefix("testenv-")
            .tempdir()
            .map_err(io("creating the control-plane directory"))?;
        let root = dir.path();
        let pki = Pki::create(root)?;

        let etcd_port = free_port()?;
        let peer_port = free_port()?;
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let mut etcd = Command::new(tools.bin("etcd"));
        etcd.arg(format!("--data-dir={}", root.join("etcd").display()))
            .arg(format!("--listen-client-urls={etcd_url}"))
            .arg(format!("--advertise-client-urls={etcd_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=default={peer_url}"))
            .arg("--unsafe-no-fsync=true");
        let etcd = Process::spawn("etcd", etcd, &root.join("etcd.log"))?;
        wait_for(Duration::from_secs(30), "etcd /health", || {
            etcd_healthy(etcd_port).then_some(())
        })?;

        let api_port = free_port()?;
        let url = format!("https://127.0.0.1:{api_port}");
        let mut apiserver = Command::new(tools.bin("kube-apiserver"));
        apiserver
            .arg(format!("--etcd-servers={etcd_url}"))
            .arg(format!(
                "--cert-dir={}",
                root.join("apiserver-certs").display()
            ))
            .arg(format!("--tls-cert-file={}", pki.serving_cert.display()))
            .arg(format!(
                "--tls-private-key-file={}",
                pki.serving_key.display()
            ))
            .arg(format!("--client-ca-file={}", pki.ca_cert.display()))
            .arg(format!("--secure-port={api_port}"))
            .arg("--bind-address=127.0.0.1")
            .arg("--advertise-address=127.0.0.1")
            .arg("--service-cluster-ip-range=10.0.0.0/24")
            .arg("--authorization-mode=RBAC")
            .arg(format!("--service-account-issuer={url}/"))
            .arg(format!(
                "--service-account-key-file={}",
                pki.sa_public.display()
            ))
            .arg(format!(
                "--service-account-signing-key-file={}",
                pki.sa_private.display()
            ))
            .arg("--disable-admission-plugins=ServiceAccount")
            .arg("--allow-privileged=true");
        let apiserver = Process::spawn("kube-apiserver", apiserver, &root.join("apiserver.log"))?;

        let kubeconfig = root.join("admin.kubeconfig");
        write_kubeconfig(
            &kubeconfig,
            &url,
            &pki.ca_cert,
            &format!(
                "client-certificate: {}\n    client-key: {}",
                pki.admin_cert.display(),
                pki.admin_key.display()
            ),
        )?;
        let kubectl = tools.kubectl();
        wait_for(Duration::from_secs(90), "kube-apiserver /readyz", || {
            run(Command::new(&kubectl)
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .args(["get", "--raw", "/readyz"]))
            .ok()
            .filter(|body| body.trim() == "ok")
        })?;

        let mut controller_manager = Command::new(tools.bin("kube-controller-manager"));
        controller_manager
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg("--controllers=namespace")
            .arg("--leader-elect=false")
            .arg("--secure-port=0");
        let controller_manager = Process::spawn(
            "kube-controller-manager",
            controller_manager,
            &root.join("controller-manager.log"),
        )?;

        let plane = Self {
            controller_manager,
            apiserver,
            etcd,
            pki,
            url,
            kubeconfig,
            dir,
        };
        // The default namespace is created by the API server shortly after
        // it turns ready.
        wait_for(Duration::from_secs(30), "namespace default", || {
            plane.kubectl(&["get", "namespace", "default"]).ok()
        })?;
        Ok(plane)
    }

    /// The test CA, which can also issue certificates for the pet store.
    pub fn pki(&self) -> &Pki {
        &self.pki
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn apiserver_pid(&self) -> Option<u32> {
        self.apiserver.pid()
    }

    pub fn etcd_pid(&self) -> Option<u32> {
        self.etcd.pid()
    }

    /// `kubectl --kubeconfig=<admin> args...`, returning stdout.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        self.kubectl_as(&self.kubeconfig, args)
    }

    pub fn kubectl_as(&self, kubeconfig: &Path, args: &[&str]) -> Result<String> {
        run(Command::new(Tools::get()?.kubectl())
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(args))
    }

    /// `kubectl apply -f -` with `yaml` on stdin. Returns stdout, or the
    /// API server's refusal as an error.
    pub fn apply(&self, yaml: &str) -> Result<String> {
        self.kubectl_stdin(&["apply", "-f", "-"], yaml)
    }

    pub fn kubectl_stdin(&self, args: &[&str], input: &str) -> Result<String> {
        let mut child = Command::new(Tools::get()?.kubectl())
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io("starting kubectl"))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(input.as_bytes())
                .map_err(io("writing to kubectl"))?;
        }
        let out = child
            .wait_with_output()
            .map_err(io("waiting for kubectl"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(Error::Command {
                command: format!("kubectl {}", args.join(" ")),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            })
        }
    }

    /// A kubeconfig that authenticates as a ServiceAccount with a token
    /// minted by `kubectl create token`, so RBAC applies exactly as in a pod.
    pub fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> Result<PathBuf> {
        let token = self.kubectl(&["create", "token", name, "-n", namespace, "--duration=2h"])?;
        let path = self.dir().join(format!("{namespace}-{name}.kubeconfig"));
        write_kubeconfig(
            &path,
            &self.url,
            &self.pki.ca_cert,
            &format!("token: {}", token.trim()),
        )?;
        Ok(path)
    }

    /// The tails of every control-plane log, for diagnosing a failure.
    pub fn log_tails(&self, lines: usize) -> String {
        [&self.etcd, &self.apiserver, &self.controller_manager]
            .iter()
            .map(|p| format!("---- {} ----\n{}", p.name(), p.log_tail(lines)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn write_kubeconfig(path: &Path, server: &str, ca: &Path, user: &str) -> Result<()> {
    let text = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: testenv
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: testenv-user
  user:
    {user}
contexts:
- name: testenv
  context:
    cluster: testenv
    user: testenv-user
    namespace: default
current-context: testenv
",
        ca = ca.display()
    );
    std::fs::write(path, text).map_err(io(format!("writing {}", path.display())))
}
