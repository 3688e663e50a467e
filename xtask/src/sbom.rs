//! `cargo xtask sbom`: a CycloneDX 1.5 JSON SBOM of one released artifact
//! ([`Artifact`]): the chart (both binaries), the operator's image, the pet
//! store's image or the `kubectl-petstore` plugin. It lists every package
//! the artifact's binaries are built from, with its locked version and purl,
//! read from `cargo metadata`.
//!
//! `cargo metadata` resolves the whole workspace at once, so its graph also
//! holds what only the tests and tools use, and features that only they
//! turn on (rcgen's x509-parser, say). What a release build of the two
//! packages compiles is found here the way cargo finds it: from the two
//! roots' default features, along normal dependencies (no build or dev
//! dependencies) that apply to the target platform, turning on optional
//! dependencies only where an enabled feature asks for them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde::Deserialize;
use serde_json::{Value, json};

/// The packages whose binaries the chart's images hold.
pub const ROOTS: &[&str] = &["petstore-operator", "petstore-server"];

/// What is released, each signed with an SBOM of its own: the packages its
/// binaries come from, and the name the SBOM gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Artifact {
    /// The SBOM's subject (`metadata.component`).
    pub name: &'static str,
    /// Its `bom-ref`, before `@<version>`: not a package's purl, since
    /// bom-refs are unique in a BOM and the packages are components too.
    pub reference: &'static str,
    pub description: &'static str,
    /// The workspace packages whose binaries it holds.
    pub packages: &'static [&'static str],
}

/// The Helm chart: the images of both binaries.
pub const CHART: Artifact = Artifact {
    name: "petstore-operator",
    reference: "petstore-operator-chart",
    description: "The Helm chart's binaries: the operator (petstore-operator, kubectl-petstore) and the pet store (petstore-server)",
    packages: ROOTS,
};
/// The operator's image.
pub const OPERATOR_IMAGE: Artifact = Artifact {
    name: "petstore-operator-image",
    reference: "petstore-operator-image",
    description: "The operator's image: the petstore-operator binary",
    packages: &["petstore-operator"],
};
/// The pet store's image.
pub const STORE_IMAGE: Artifact = Artifact {
    name: "petstore-server-image",
    reference: "petstore-server-image",
    description: "The pet store's image: the petstore-server binary",
    packages: &["petstore-server"],
};
/// The kubectl plugin's archives: `kubectl-petstore`, a binary of the
/// operator's package, so the same packages as the operator's image.
pub const PLUGIN: Artifact = Artifact {
    name: "kubectl-petstore",
    reference: "kubectl-petstore-plugin",
    description: "The kubectl plugin: the kubectl-petstore binary",
    packages: &["petstore-operator"],
};
/// Every artifact, by the name `cargo xtask sbom --for` takes.
pub const ARTIFACTS: &[(&str, Artifact)] = &[
    ("chart", CHART),
    ("operator-image", OPERATOR_IMAGE),
    ("store-image", STORE_IMAGE),
    ("plugin", PLUGIN),
];

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("running {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} failed: {stderr}")]
    Command { what: String, stderr: String },
    #[error("reading cargo metadata: {0}")]
    Json(#[from] serde_json::Error),
    #[error("no package {0} in the workspace")]
    NoRoot(String),
    #[error("cannot read the target cfg {0:?}")]
    Cfg(String),
}

/// What `cargo metadata` says, of what this needs.
#[derive(Deserialize)]
struct Metadata {
    packages: Vec<Package>,
    workspace_members: Vec<String>,
    resolve: Resolve,
}

#[derive(Deserialize)]
struct Package {
    id: String,
    name: String,
    version: String,
    license: Option<String>,
    description: Option<String>,
    features: BTreeMap<String, Vec<String>>,
    dependencies: Vec<Dependency>,
}

#[derive(Deserialize)]
struct Dependency {
    name: String,
    rename: Option<String>,
    kind: Option<String>,
    optional: bool,
    uses_default_features: bool,
    features: Vec<String>,
    target: Option<String>,
}

impl Dependency {
    /// The name features and the resolve graph know it by.
    fn key(&self) -> &str {
        self.rename.as_deref().unwrap_or(&self.name)
    }
}

#[derive(Deserialize)]
struct Resolve {
    nodes: Vec<Node>,
}

#[derive(Deserialize)]
struct Node {
    id: String,
    deps: Vec<NodeDep>,
}

#[derive(Deserialize)]
struct NodeDep {
    /// The crate name in code: a rename's, else the library's.
    name: String,
    pkg: String,
}

fn output(mut command: Command, what: &str) -> Result<String, Error> {
    let out = command.output().map_err(|source| Error::Io {
        what: what.into(),
        source,
    })?;
    if !out.status.success() {
        return Err(Error::Command {
            what: what.into(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn rustc() -> Command {
    Command::new(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()))
}

/// The host's target triple (`rustc -vV`).
pub fn host_target() -> Result<String, Error> {
    let mut command = rustc();
    command.arg("-vV");
    let out = output(command, "rustc -vV")?;
    out.lines()
        .find_map(|line| line.strip_prefix("host: "))
        .map(str::to_owned)
        .ok_or_else(|| Error::Cfg("no host line in rustc -vV".into()))
}

/// The SBOM of `artifact` from the workspace at `root`, for `target` (a
/// triple; the host's when `None`).
pub fn generate(root: &Path, artifact: Artifact, target: Option<&str>) -> Result<Value, Error> {
    let target = match target {
        Some(target) => target.to_owned(),
        None => host_target()?,
    };
    let mut command = rustc();
    command.args(["--print", "cfg", "--target", &target]);
    let cfg = Cfg::parse(&output(command, "rustc --print cfg")?).with_triple(&target);
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    command
        .current_dir(root)
        .args(["metadata", "--locked", "--format-version", "1"])
        .args(["--filter-platform", &target]);
    let metadata: Metadata = serde_json::from_str(&output(command, "cargo metadata")?)?;
    bom(&metadata, &cfg, &target, artifact)
}

/// The set of packages (by id) a build of `roots` compiles, with the
/// normal dependency edges between them.
fn graph(
    metadata: &Metadata,
    cfg: &Cfg,
    roots: &[&str],
) -> Result<BTreeMap<String, BTreeSet<String>>, Error> {
    let packages: BTreeMap<&str, &Package> = metadata
        .packages
        .iter()
        .map(|p| (p.id.as_str(), p))
        .collect();
    let nodes: BTreeMap<&str, &Node> = metadata
        .resolve
        .nodes
        .iter()
        .map(|n| (n.id.as_str(), n))
        .collect();
    // Package id -> its enabled features.
    let mut enabled: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for name in roots {
        let id = metadata
            .workspace_members
            .iter()
            .find(|id| packages.get(id.as_str()).is_some_and(|p| p.name == *name))
            .ok_or_else(|| Error::NoRoot((*name).into()))?;
        enabled.insert(id.clone(), BTreeSet::from(["default".to_owned()]));
    }
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    // Features only ever turn more on: go round until nothing changes.
    loop {
        let mut next = enabled.clone();
        for (id, features) in &enabled {
            let (Some(package), Some(node)) = (packages.get(id.as_str()), nodes.get(id.as_str()))
            else {
                continue;
            };
            let features = expand(package, features);
            let deps: Vec<&Dependency> = package
                .dependencies
                .iter()
                .filter(|d| d.kind.is_none())
                .filter(|d| d.target.as_deref().is_none_or(|t| cfg.matches(t)))
                .collect();
            // Optional dependencies turned on, and features asked of each.
            let mut on: BTreeSet<&str> = BTreeSet::new();
            let mut asked: Vec<(&str, &str)> = Vec::new();
            for feature in &features {
                if let Some(dep) = feature.strip_prefix("dep:") {
                    on.insert(dep);
                } else if let Some((dep, feature)) = feature.split_once('/') {
                    // `dep?/f` asks f of dep only if something else turns
                    // dep on; `dep/f` turns it on too.
                    match dep.strip_suffix('?') {
                        Some(dep) => asked.push((dep, feature)),
                        None => {
                            on.insert(dep);
                            asked.push((dep, feature));
                        }
                    }
                } else if !package.features.contains_key(feature.as_str()) {
                    // An optional dependency's implicit feature.
                    on.insert(feature.as_str());
                }
            }
            let active: Vec<&Dependency> = deps
                .into_iter()
                .filter(|d| !d.optional || on.contains(d.key()))
                .collect();
            for dep in &active {
                // The graph names a dependency by its crate name in code:
                // a rename's, else its library's (md-5's is md5), so match
                // the package's name unless it was renamed.
                let Some(resolved) = node.deps.iter().find(|n| match &dep.rename {
                    Some(rename) => n.name == rename.replace('-', "_"),
                    None => packages
                        .get(n.pkg.as_str())
                        .is_some_and(|p| p.name == dep.name),
                }) else {
                    continue;
                };
                let entry = next.entry(resolved.pkg.clone()).or_default();
                if dep.uses_default_features {
                    entry.insert("default".into());
                }
                entry.extend(dep.features.iter().cloned());
                for (name, feature) in &asked {
                    if *name == dep.key() {
                        entry.insert((*feature).to_owned());
                    }
                }
                edges
                    .entry(id.clone())
                    .or_default()
                    .insert(resolved.pkg.clone());
            }
        }
        if next == enabled {
            break;
        }
        enabled = next;
    }
    let mut graph: BTreeMap<String, BTreeSet<String>> = enabled
        .into_keys()
        .map(|id| (id, BTreeSet::new()))
        .collect();
    for (from, to) in edges {
        graph.insert(from, to);
    }
    Ok(graph)
}

/// `features` and every feature they turn on in `package`, transitively;
/// `default` only where the package has one.
fn expand(package: &Package, features: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut todo: Vec<String> = features.iter().cloned().collect();
    while let Some(feature) = todo.pop() {
        if feature == "default" && !package.features.contains_key("default") {
            continue;
        }
        if !out.insert(feature.clone()) {
            continue;
        }
        if let Some(more) = package.features.get(&feature) {
            todo.extend(more.iter().cloned());
        }
    }
    out
}

/// `pkg:cargo/NAME@VERSION`, the version percent-encoded where purl
/// requires it (a `+` of build metadata).
pub fn purl(name: &str, version: &str) -> String {
    let mut encoded = String::new();
    for c in version.chars() {
        if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '~') {
            encoded.push(c);
        } else {
            let mut buf = [0; 4];
            for byte in c.encode_utf8(&mut buf).bytes() {
                encoded.push_str(&format!("%{byte:02X}"));
            }
        }
    }
    format!("pkg:cargo/{name}@{encoded}")
}

fn bom(metadata: &Metadata, cfg: &Cfg, target: &str, artifact: Artifact) -> Result<Value, Error> {
    let graph = graph(metadata, cfg, artifact.packages)?;
    let packages: BTreeMap<&str, &Package> = metadata
        .packages
        .iter()
        .map(|p| (p.id.as_str(), p))
        .collect();
    let reference = |id: &str| packages.get(id).map(|p| purl(&p.name, &p.version));
    let mut components = BTreeMap::new();
    let mut dependencies = BTreeMap::new();
    let mut roots = Vec::new();
    for (id, deps) in &graph {
        let Some(package) = packages.get(id.as_str()) else {
            continue;
        };
        let purl = purl(&package.name, &package.version);
        let is_root = metadata.workspace_members.contains(id)
            && artifact.packages.contains(&package.name.as_str());
        let mut component = json!({
            "type": if is_root { "application" } else { "library" },
            "bom-ref": purl,
            "name": package.name,
            "version": package.version,
            "purl": purl,
        });
        if let Some(license) = &package.license {
            component["licenses"] = json!([{ "expression": license }]);
        }
        if let Some(description) = &package.description {
            component["description"] = json!(description.trim());
        }
        if is_root {
            roots.push(purl.clone());
        }
        let mut depends: Vec<String> = deps.iter().filter_map(|d| reference(d)).collect();
        depends.sort();
        depends.dedup();
        dependencies.insert(purl.clone(), json!({ "ref": purl, "dependsOn": depends }));
        components.insert(purl, component);
    }
    roots.sort();
    let version = env!("CARGO_PKG_VERSION");
    let subject = format!("{}@{version}", artifact.reference);
    dependencies.insert(
        subject.clone(),
        json!({ "ref": subject, "dependsOn": roots }),
    );
    let components: Vec<Value> = components.into_values().collect();
    // Reproducible: no timestamp, and a serial number derived from the
    // content, so the same lock file and target give the same bytes.
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        serde_json::to_string(&components)?.as_bytes(),
    );
    Ok(json!({
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": format!("urn:uuid:{}", uuid_from(digest.as_ref())),
        "version": 1,
        "metadata": {
            "tools": { "components": [{
                "type": "application",
                "name": "cargo xtask sbom",
                "version": version,
            }]},
            "component": {
                "type": "application",
                "bom-ref": subject,
                "name": artifact.name,
                "version": version,
                "description": artifact.description,
            },
            "properties": [{ "name": "cargo:target", "value": target }],
        },
        "components": components,
        "dependencies": dependencies.into_values().collect::<Vec<_>>(),
    }))
}

/// An RFC 4122 name-based UUID (version 5's layout) from a digest's first
/// 16 bytes.
fn uuid_from(digest: &[u8]) -> String {
    let mut b = [0u8; 16];
    b.copy_from_slice(&digest[..16]);
    b[6] = (b[6] & 0x0f) | 0x50;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// A target's cfg values (`rustc --print cfg`), to tell which
/// `[target.'cfg(...)'.dependencies]` apply.
pub struct Cfg {
    /// `unix`, `debug_assertions`, ...
    names: BTreeSet<String>,
    /// (`target_os`, `linux`), ...
    pairs: BTreeSet<(String, String)>,
    triple: Option<String>,
}

impl Cfg {
    pub fn parse(printed: &str) -> Self {
        let mut names = BTreeSet::new();
        let mut pairs = BTreeSet::new();
        for line in printed.lines().map(str::trim).filter(|l| !l.is_empty()) {
            match line.split_once('=') {
                Some((key, value)) => {
                    pairs.insert((key.to_owned(), value.trim_matches('"').to_owned()));
                }
                None => {
                    names.insert(line.to_owned());
                }
            }
        }
        Self {
            names,
            pairs,
            triple: None,
        }
    }

    /// Whether a dependency's `target` (a triple or `cfg(...)`) applies.
    /// An expression this cannot read applies: an SBOM had better list too
    /// much than too little.
    pub fn matches(&self, target: &str) -> bool {
        match target
            .strip_prefix("cfg(")
            .and_then(|t| t.strip_suffix(')'))
        {
            Some(expr) => {
                let tokens = tokenize(expr);
                let mut at = 0;
                self.eval(&tokens, &mut at).unwrap_or(true)
            }
            None => self.triple.as_deref().is_none_or(|triple| triple == target),
        }
    }

    fn eval(&self, tokens: &[String], at: &mut usize) -> Option<bool> {
        let head = tokens.get(*at)?.clone();
        *at += 1;
        match head.as_str() {
            "all" | "any" | "not" => {
                if tokens.get(*at)? != "(" {
                    return None;
                }
                *at += 1;
                let mut values = Vec::new();
                while tokens.get(*at)? != ")" {
                    values.push(self.eval(tokens, at)?);
                    if tokens.get(*at)? == "," {
                        *at += 1;
                    }
                }
                *at += 1;
                Some(match head.as_str() {
                    "all" => values.iter().all(|v| *v),
                    "any" => values.iter().any(|v| *v),
                    _ => {
                        let [value] = values.as_slice() else {
                            return None;
                        };
                        !value
                    }
                })
            }
            name => {
                if tokens.get(*at).map(String::as_str) == Some("=") {
                    let value = tokens.get(*at + 1)?.trim_matches('"').to_owned();
                    *at += 2;
                    Some(self.pairs.contains(&(name.to_owned(), value)))
                } else {
                    Some(self.names.contains(name))
                }
            }
        }
    }

    /// Also tells dependencies for a target named by its triple.
    pub fn with_triple(mut self, triple: &str) -> Self {
        self.triple = Some(triple.to_owned());
        self
    }
}

fn tokenize(expr: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut chars = expr.chars().peekable();
    while let Some(&c) = chars.peek() {
        match c {
            ' ' | '\t' => {
                chars.next();
            }
            '(' | ')' | ',' | '=' => {
                tokens.push(c.to_string());
                chars.next();
            }
            '"' => {
                let mut s = String::from('"');
                chars.next();
                for c in chars.by_ref() {
                    s.push(c);
                    if c == '"' {
                        break;
                    }
                }
                tokens.push(s);
            }
            _ => {
                let mut s = String::new();
                while let Some(&c) = chars.peek() {
                    if c.is_alphanumeric() || c == '_' || c == '-' || c == '.' {
                        s.push(c);
                        chars.next();
                    } else {
                        break;
                    }
                }
                if s.is_empty() {
                    chars.next();
                } else {
                    tokens.push(s);
                }
            }
        }
    }
    tokens
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (name, version) of every package in Cargo.lock.
    fn locked(root: &Path) -> BTreeSet<(String, String)> {
        let lock = std::fs::read_to_string(root.join("Cargo.lock")).unwrap();
        let mut out = BTreeSet::new();
        let mut name = None;
        for line in lock.lines() {
            if let Some(n) = line.strip_prefix("name = ") {
                name = Some(n.trim_matches('"').to_owned());
            } else if let Some(v) = line.strip_prefix("version = ")
                && let Some(n) = name.take()
            {
                out.insert((n, v.trim_matches('"').to_owned()));
            }
        }
        out
    }

    /// What cargo itself builds for `packages`: `cargo tree`'s normal
    /// dependencies for the host, as (name, version).
    fn cargo_tree(root: &Path, packages: &[&str]) -> BTreeSet<(String, String)> {
        let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        command.current_dir(root).args([
            "tree", "--locked", "-e", "normal", "--prefix", "none", "-f", "{p}",
        ]);
        for package in packages {
            command.args(["-p", package]);
        }
        let out = output(command, "cargo tree").unwrap();
        out.lines()
            .filter_map(|line| {
                let mut words = line.split_whitespace();
                let name = words.next()?;
                let version = words.next()?.strip_prefix('v')?;
                Some((name.to_owned(), version.to_owned()))
            })
            .collect()
    }

    fn root() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    #[test]
    fn the_sbom_lists_exactly_what_the_two_binaries_build_at_their_locked_versions() {
        let root = root();
        let bom = generate(&root, CHART, None).unwrap();
        // Valid JSON with CycloneDX's required and expected fields.
        let text = serde_json::to_string_pretty(&bom).unwrap();
        let bom: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(bom["bomFormat"], "CycloneDX");
        assert_eq!(bom["specVersion"], "1.5");
        assert_eq!(bom["version"], 1);
        let serial = bom["serialNumber"].as_str().unwrap();
        assert!(
            serial.starts_with("urn:uuid:") && serial.len() == 45,
            "{serial}"
        );
        assert_eq!(bom["metadata"]["component"]["name"], "petstore-operator");

        let components = bom["components"].as_array().unwrap();
        let mut listed = BTreeSet::new();
        let mut refs = BTreeSet::new();
        for c in components {
            let (name, version) = (c["name"].as_str().unwrap(), c["version"].as_str().unwrap());
            assert_eq!(c["purl"], purl(name, version), "{c}");
            assert_eq!(c["purl"], format!("pkg:cargo/{name}@{version}"), "{c}");
            assert_eq!(c["bom-ref"], c["purl"], "{c}");
            assert!(
                matches!(c["type"].as_str(), Some("library" | "application")),
                "{c}"
            );
            assert!(
                listed.insert((name.to_owned(), version.to_owned())),
                "twice: {c}"
            );
            refs.insert(c["bom-ref"].as_str().unwrap().to_owned());
        }
        // Every dependency edge names listed components.
        for d in bom["dependencies"].as_array().unwrap() {
            for to in d["dependsOn"].as_array().unwrap() {
                assert!(refs.contains(to.as_str().unwrap()), "{d}");
            }
        }

        // Every package listed is locked at that version.
        let locked = locked(&root);
        let unlocked: Vec<_> = listed.difference(&locked).collect();
        assert!(unlocked.is_empty(), "not in Cargo.lock: {unlocked:?}");
        // Every package the operator binary builds is listed, and the two
        // binaries' graph is exactly what the SBOM lists.
        let operator = cargo_tree(&root, &["petstore-operator"]);
        assert!(operator.len() > 100, "{operator:?}");
        let missing: Vec<_> = operator.difference(&listed).collect();
        assert!(
            missing.is_empty(),
            "the operator builds these, unlisted: {missing:?}"
        );
        let both = cargo_tree(&root, ROOTS);
        let extra: Vec<_> = listed.difference(&both).collect();
        let missing: Vec<_> = both.difference(&listed).collect();
        assert!(
            extra.is_empty() && missing.is_empty(),
            "listed but not built: {extra:?}; built but not listed: {missing:?}"
        );
        // Locked but not built into either binary: the operator's mock
        // API server for tests (tower-test), the protos' code generators
        // (build dependencies) and a test-only crate.
        for name in ["tower-test", "tonic-prost-build", "prost-build", "tempfile"] {
            assert!(
                locked.iter().any(|(n, _)| n == name),
                "{name} is no longer in Cargo.lock: pick another"
            );
            assert!(!listed.iter().any(|(n, _)| n == name), "{name} is listed");
        }
        for root in ROOTS {
            let c = components.iter().find(|c| c["name"] == *root).unwrap();
            assert_eq!(c["type"], "application");
        }
    }

    /// The (name, version) pairs an SBOM lists.
    fn listed(bom: &Value) -> BTreeSet<(String, String)> {
        bom["components"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                let field = |f: &str| c[f].as_str().unwrap().to_owned();
                (field("name"), field("version"))
            })
            .collect()
    }

    #[test]
    fn each_image_and_the_plugin_list_exactly_what_their_package_builds() {
        let root = root();
        for (_, artifact) in ARTIFACTS {
            let bom = generate(&root, *artifact, None).unwrap();
            let component = &bom["metadata"]["component"];
            assert_eq!(component["name"], artifact.name);
            let subject = component["bom-ref"].as_str().unwrap();
            assert!(subject.starts_with(artifact.reference), "{subject}");
            let listed = listed(&bom);
            let built = cargo_tree(&root, artifact.packages);
            assert_eq!(listed, built, "{}", artifact.name);
            // The artifact's own packages are its applications; no other
            // workspace package is in it.
            for c in bom["components"].as_array().unwrap() {
                let name = c["name"].as_str().unwrap();
                let root_package = artifact.packages.contains(&name);
                assert_eq!(c["type"] == "application", root_package, "{c}");
            }
            let dependencies = bom["dependencies"].as_array().unwrap();
            let subject_edges = dependencies.iter().find(|d| d["ref"] == subject).unwrap();
            assert_eq!(
                subject_edges["dependsOn"].as_array().unwrap().len(),
                artifact.packages.len(),
                "{subject_edges}"
            );
        }
        // The store's image holds no Kubernetes client; the operator's does.
        let store = listed(&generate(&root, STORE_IMAGE, None).unwrap());
        let operator = listed(&generate(&root, OPERATOR_IMAGE, None).unwrap());
        assert!(!store.iter().any(|(name, _)| name == "kube-client"));
        assert!(operator.iter().any(|(name, _)| name == "kube-client"));
    }

    #[test]
    fn the_same_lock_file_gives_the_same_sbom() {
        let root = root();
        assert_eq!(
            generate(&root, CHART, None).unwrap(),
            generate(&root, CHART, None).unwrap()
        );
    }

    #[test]
    fn cfg_expressions_are_judged_for_the_target() {
        let cfg = Cfg::parse("unix\ntarget_os=\"linux\"\ntarget_arch=\"x86_64\"\n")
            .with_triple("x86_64-unknown-linux-gnu");
        assert!(cfg.matches("cfg(unix)"));
        assert!(!cfg.matches("cfg(windows)"));
        assert!(cfg.matches("cfg(target_os = \"linux\")"));
        assert!(!cfg.matches("cfg(target_os = \"wasi\")"));
        assert!(cfg.matches("cfg(any(windows, all(unix, not(target_os = \"macos\"))))"));
        assert!(!cfg.matches("cfg(all(tokio_unstable, target_os = \"linux\"))"));
        assert!(cfg.matches("x86_64-unknown-linux-gnu"));
        assert!(!cfg.matches("aarch64-apple-darwin"));
    }

    #[test]
    fn purls_encode_build_metadata() {
        assert_eq!(purl("serde", "1.0.0"), "pkg:cargo/serde@1.0.0");
        assert_eq!(purl("x", "0.1.0+wasi-0.2"), "pkg:cargo/x@0.1.0%2Bwasi-0.2");
    }
}
