//! The chart from an OCI registry, as platform teams install it
//! (docs/install.md, "From an OCI registry"): `helm package` and `helm push`
//! to a real registry on 127.0.0.1, `helm show chart` and `helm pull` give
//! the same chart back, `helm install oci://...` installs it.

use std::path::{Path, PathBuf};
use std::process::Output;

use fixtures::helm::{Helm, chart_dir};
use fixtures::registry::Registry;
use fixtures::{ControlPlane, io};
use serde_json::Value;

/// The chart's name (Chart.yaml) and version (the workspace's).
const CHART: &str = "petstore-operator";
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The media type of a Helm chart's archive in an OCI manifest.
const CHART_LAYER: &str = "application/vnd.cncf.helm.chart.content.v1.tar+gzip";

fn sha256_of(path: &Path) -> fixtures::Result<String> {
    let bytes = std::fs::read(path).map_err(io(format!("reading {}", path.display())))?;
    Ok(format!("sha256:{}", xtask::krew::sha256_hex(&bytes)))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `helm package <chart> -d <out>`: the archive's path.
fn package(helm: &Helm, chart: &Path, out: &Path) -> fixtures::Result<PathBuf> {
    let printed = helm.run(&[
        "package",
        &chart.to_string_lossy(),
        "--destination",
        &out.to_string_lossy(),
    ])?;
    let archive = out.join(format!("{CHART}-{VERSION}.tgz"));
    assert!(
        printed.contains(&*archive.to_string_lossy()) && archive.exists(),
        "{printed}"
    );
    Ok(archive)
}

/// `helm push <archive> oci://<registry>/charts --plain-http`: the
/// manifest digest it prints.
fn push(helm: &Helm, archive: &Path, registry: &Registry) -> fixtures::Result<String> {
    let out = helm.output(&[
        "push",
        &archive.to_string_lossy(),
        &format!("oci://{}/charts", registry.addr),
        "--plain-http",
    ])?;
    let printed = text(&out);
    assert!(out.status.success(), "helm push: {printed}");
    assert!(
        printed.contains(&format!(
            "Pushed: {}/charts/{CHART}:{VERSION}",
            registry.addr
        )),
        "{printed}"
    );
    Ok(digest_line(&printed))
}

/// The `Digest: sha256:...` line helm prints after a push or a pull.
fn digest_line(printed: &str) -> String {
    printed
        .lines()
        .find_map(|line| line.strip_prefix("Digest: "))
        .unwrap_or_else(|| panic!("no Digest: line in\n{printed}"))
        .trim()
        .to_owned()
}

/// The chart's reference for `helm`: `oci://<registry>/charts/<chart>`.
fn chart_ref(registry: &Registry) -> String {
    format!("oci://{}/charts/{CHART}", registry.addr)
}

#[test]
fn helm_pushes_the_chart_to_an_oci_registry_pulls_it_back_and_installs_it() -> fixtures::Result<()>
{
    let registry = Registry::start()?;
    let work = tempfile::tempdir().map_err(io("making a folder"))?;
    let helm = Helm::new()?;
    let archive = package(&helm, &chart_dir(), work.path())?;
    let pushed = push(&helm, &archive, &registry)?;
    assert!(
        pushed.starts_with("sha256:") && pushed.len() == 71,
        "{pushed}"
    );

    // What the registry holds under the tag: the manifest push printed, with
    // the archive, byte for byte, as its chart layer.
    let repository = format!("charts/{CHART}");
    assert_eq!(registry.tags(&repository)?, [VERSION]);
    let (manifest, digest) = registry.manifest(&repository, VERSION)?;
    assert_eq!(digest, pushed, "{manifest}");
    let layers = manifest["layers"].as_array().expect("layers");
    let [layer] = layers.as_slice() else {
        panic!("one layer: {manifest}");
    };
    assert_eq!(layer["mediaType"], CHART_LAYER, "{manifest}");
    assert_eq!(layer["digest"], sha256_of(&archive)?.as_str(), "{manifest}");

    // `helm show chart` reads Chart.yaml from the registry.
    let shown = helm.run(&[
        "show",
        "chart",
        &chart_ref(&registry),
        "--version",
        VERSION,
        "--plain-http",
    ])?;
    let shown: Value = serde_norway::from_str(&shown).expect("helm show chart prints YAML");
    let local: Value = serde_norway::from_str(
        &std::fs::read_to_string(chart_dir().join("Chart.yaml"))
            .map_err(io("reading Chart.yaml"))?,
    )
    .expect("Chart.yaml is YAML");
    for field in ["name", "version", "appVersion", "description", "type"] {
        assert_eq!(shown[field], local[field], "{field}");
    }

    // `helm pull` gets the same manifest and the same archive.
    let pulled_dir = work.path().join("pulled");
    std::fs::create_dir(&pulled_dir).map_err(io("making a folder"))?;
    let out = helm.output(&[
        "pull",
        &chart_ref(&registry),
        "--version",
        VERSION,
        "--plain-http",
        "--destination",
        &pulled_dir.to_string_lossy(),
    ])?;
    assert!(out.status.success(), "helm pull: {}", text(&out));
    assert_eq!(digest_line(&text(&out)), pushed);
    let pulled = pulled_dir.join(format!("{CHART}-{VERSION}.tgz"));
    assert_eq!(sha256_of(&pulled)?, sha256_of(&archive)?);

    // Installed from the registry onto a fresh API server: the CRDs and the
    // operator's objects, as the admin sees them.
    let cp = ControlPlane::start()?;
    let helm = Helm::with_kubeconfig(&cp.kubeconfig)?;
    let out = helm.run(&[
        "install",
        "petstore",
        &chart_ref(&registry),
        "--version",
        VERSION,
        "--plain-http",
        "--namespace",
        "default",
    ])?;
    assert!(out.contains("STATUS: deployed"), "{out}");
    for name in [
        "pets.petstore.example.com",
        "petstores.petstore.example.com",
        "clusterpetstores.petstore.example.com",
    ] {
        cp.kubectl(&["get", "crd", name])?;
    }
    for object in [
        &["namespace", "petstore-system"][..],
        &["deployment", "petstore-operator", "-n", "petstore-system"][..],
        &[
            "serviceaccount",
            "petstore-operator",
            "-n",
            "petstore-system",
        ][..],
        &["clusterrole", "petstore-operator"][..],
        &["deployment", "petstore", "-n", "petstore"][..],
    ] {
        cp.kubectl(&[&["get"], object].concat())?;
    }
    let release = helm.run(&["list", "--namespace", "default", "--output", "json"])?;
    let release: Value = serde_json::from_str(&release).expect("helm list prints JSON");
    assert_eq!(
        release[0]["chart"],
        format!("{CHART}-{VERSION}"),
        "{release}"
    );
    Ok(())
}
