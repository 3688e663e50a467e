//! Test PKI made with the openssl CLI: one CA that signs the API server's
//! serving certificate and the client certificates, and an RSA key pair for
//! signing service-account tokens.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Result, run};

pub struct Pki {
    pub ca_cert: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub admin_cert: PathBuf,
    pub admin_key: PathBuf,
    pub sa_public: PathBuf,
    pub sa_private: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) -> Result<String> {
    run(Command::new("openssl").current_dir(dir).args(args))
}

fn signed(dir: &Path, name: &str, subject: &str, extensions: &str) -> Result<()> {
    let key = format!("{name}.key");
    let csr = format!("{name}.csr");
    let crt = format!("{name}.crt");
    let ext = format!("{name}.ext");
    std::fs::write(dir.join(&ext), extensions).map_err(crate::io("writing extensions"))?;
    openssl(dir, &["genrsa", "-out", &key, "2048"])?;
    openssl(
        dir,
        &["req", "-new", "-key", &key, "-subj", subject, "-out", &csr],
    )?;
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-sha256",
            "-extfile",
            &ext,
            "-out",
            &crt,
        ],
    )?;
    Ok(())
}

impl Pki {
    /// A server certificate for 127.0.0.1 and localhost, signed by the CA.
    pub fn issue_server(&self, name: &str) -> Result<(PathBuf, PathBuf)> {
        self.issue(
            name,
            "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
    }

    /// A client certificate, signed by the CA.
    pub fn issue_client(&self, name: &str) -> Result<(PathBuf, PathBuf)> {
        self.issue(name, "extendedKeyUsage=clientAuth\n")
    }

    fn issue(&self, name: &str, usage: &str) -> Result<(PathBuf, PathBuf)> {
        let dir = self.dir();
        let extensions = format!(
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n{usage}"
        );
        signed(dir, name, &format!("/CN={name}"), &extensions)?;
        Ok((
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        ))
    }

    fn dir(&self) -> &Path {
        self.ca_cert.parent().unwrap_or(Path::new("."))
    }

    /// The envtest control plane's PKI, serving on 127.0.0.1.
    pub fn create(dir: &Path) -> Result<Self> {
        Self::create_with(
            dir,
            "/CN=testenv-ca",
            "IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc",
            "/O=system:masters/CN=admin",
        )
    }

    /// A CA (subject `ca_subject`), an API server certificate valid for
    /// `serving_sans` (an openssl subjectAltName list), an admin client
    /// certificate with `admin_subject`, and the service-account key pair.
    pub fn create_with(
        dir: &Path,
        ca_subject: &str,
        serving_sans: &str,
        admin_subject: &str,
    ) -> Result<Self> {
        openssl(dir, &["genrsa", "-out", "ca.key", "2048"])?;
        openssl(
            dir,
            &[
                "req", "-x509", "-new", "-key", "ca.key", "-subj", ca_subject, "-days", "2",
                "-sha256", "-out", "ca.crt",
            ],
        )?;
        signed(
            dir,
            "serving",
            "/CN=kube-apiserver",
            &format!(
                "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n\
                 extendedKeyUsage=serverAuth\nsubjectAltName={serving_sans}\n"
            ),
        )?;
        signed(
            dir,
            "admin",
            admin_subject,
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n\
             extendedKeyUsage=clientAuth\n",
        )?;
        openssl(dir, &["genrsa", "-out", "sa.key", "2048"])?;
        openssl(dir, &["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"])?;
        Ok(Self {
            ca_cert: dir.join("ca.crt"),
            serving_cert: dir.join("serving.crt"),
            serving_key: dir.join("serving.key"),
            admin_cert: dir.join("admin.crt"),
            admin_key: dir.join("admin.key"),
            sa_public: dir.join("sa.pub"),
            sa_private: dir.join("sa.key"),
        })
    }
}
