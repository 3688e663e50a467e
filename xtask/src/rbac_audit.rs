//! RBAC equal to use: the Roles and ClusterRoles `config/` gives the
//! operator, compared with what its ServiceAccount asked of every API
//! server in the test command (their audit logs, kept by the fixtures).
//!
//! - **Unused**: a verb a rule grants (on each resource, and each name it
//!   is limited to) that no request used. A request the authorizer allowed
//!   counts whatever its answer: a `get` answered 404 still needed the verb.
//! - **Missing**: a request the authorizer refused, or one that no rule
//!   here allows and that Kubernetes does not grant every account anyway
//!   (discovery, its own access reviews).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

/// The files with the operator's Roles and ClusterRoles: every Role and
/// ClusterRole in them is bound to its ServiceAccount.
pub const RBAC_FILES: [&str; 5] = [
    "config/rbac/cluster_role.yaml",
    "config/rbac/leader_election_role.yaml",
    "config/rbac/webhook_role.yaml",
    "config/rbac/observer_role.yaml",
    "config/petstore/trust_role.yaml",
];

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not RBAC YAML: {source}")]
    Yaml {
        path: String,
        #[source]
        source: serde_norway::Error,
    },
    #[error("{path}: line {line} is not a request: {source}")]
    Request {
        path: String,
        line: usize,
        #[source]
        source: serde_json::Error,
    },
    #[error("no requests of the operator in {0}: the audit saw nothing, so it proves nothing")]
    NoRequests(String),
}

#[derive(Debug, Deserialize)]
struct Object {
    kind: String,
    metadata: Metadata,
    #[serde(default)]
    rules: Vec<RuleSpec>,
}

#[derive(Debug, Deserialize)]
struct Metadata {
    name: String,
    namespace: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RuleSpec {
    #[serde(default)]
    api_groups: Vec<String>,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    resource_names: Vec<String>,
    #[serde(default, rename = "nonResourceURLs")]
    non_resource_urls: Vec<String>,
    verbs: Vec<String>,
}

/// One rule of one role: where it applies (`None`: every namespace).
#[derive(Clone, Debug)]
pub struct Rule {
    pub role: String,
    pub namespace: Option<String>,
    pub api_groups: Vec<String>,
    /// `pets`, or `pets/status` for a subresource.
    pub resources: Vec<String>,
    pub resource_names: Vec<String>,
    pub non_resource_urls: Vec<String>,
    pub verbs: Vec<String>,
}

/// One distinct request, as the fixtures keep it.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct Request {
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    pub path: String,
    /// The authorizer's: `allow` or `forbid` (a 403 from admission, such as
    /// a namespace being deleted, is an `allow`).
    #[serde(default)]
    pub decision: String,
    pub code: u64,
}

impl Request {
    fn refused(&self) -> bool {
        self.decision == "forbid"
    }

    fn resource_path(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }

    fn is_non_resource(&self) -> bool {
        self.resource.is_empty()
    }
}

impl std::fmt::Display for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_non_resource() {
            return write!(f, "{} {} ({})", self.verb, self.path, self.code);
        }
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(f, "{} {}/{}", self.verb, group, self.resource_path())?;
        if !self.namespace.is_empty() {
            write!(f, " in {}", self.namespace)?;
        }
        if !self.name.is_empty() {
            write!(f, " named {}", self.name)?;
        }
        write!(f, " ({})", self.code)
    }
}

/// Reads the rules of every role in `files` (under `root`).
pub fn read_rules(root: &Path, files: &[&str]) -> Result<Vec<Rule>, AuditError> {
    let mut rules = Vec::new();
    for file in files {
        let path = root.join(file);
        let text = std::fs::read_to_string(&path).map_err(|source| AuditError::Read {
            path: path.display().to_string(),
            source,
        })?;
        rules.extend(rules_in(&text).map_err(|source| AuditError::Yaml {
            path: path.display().to_string(),
            source,
        })?);
    }
    Ok(rules)
}

fn rules_in(text: &str) -> Result<Vec<Rule>, serde_norway::Error> {
    let mut rules = Vec::new();
    for document in serde_norway::Deserializer::from_str(text) {
        let value = serde_norway::Value::deserialize(document)?;
        if value.is_null() {
            continue;
        }
        let object: Object = serde_norway::from_value(value)?;
        let namespace = match object.kind.as_str() {
            "Role" => object.metadata.namespace.clone(),
            "ClusterRole" => None,
            _ => continue,
        };
        for spec in object.rules {
            rules.push(Rule {
                role: format!("{} {}", object.kind, object.metadata.name),
                namespace: namespace.clone(),
                api_groups: spec.api_groups,
                resources: spec.resources,
                resource_names: spec.resource_names,
                non_resource_urls: spec.non_resource_urls,
                verbs: spec.verbs,
            });
        }
    }
    Ok(rules)
}

/// Reads every request kept in `dir`, each with the files (one per story
/// and API server) it was kept in.
pub fn read_requests(dir: &Path) -> Result<BTreeMap<Request, BTreeSet<String>>, AuditError> {
    let mut requests: BTreeMap<Request, BTreeSet<String>> = BTreeMap::new();
    let entries = std::fs::read_dir(dir).map_err(|source| AuditError::Read {
        path: dir.display().to_string(),
        source,
    })?;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|ext| ext != "jsonl") {
            continue;
        }
        let text = std::fs::read_to_string(&path).map_err(|source| AuditError::Read {
            path: path.display().to_string(),
            source,
        })?;
        for (index, line) in text.lines().enumerate() {
            let request: Request =
                serde_json::from_str(line).map_err(|source| AuditError::Request {
                    path: path.display().to_string(),
                    line: index + 1,
                    source,
                })?;
            let source = path
                .file_stem()
                .map(|stem| stem.to_string_lossy().into_owned())
                .unwrap_or_default();
            requests.entry(request).or_default().insert(source);
        }
    }
    if requests.is_empty() {
        return Err(AuditError::NoRequests(dir.display().to_string()));
    }
    Ok(requests)
}

fn url_matches(pattern: &str, path: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => path.starts_with(prefix),
        None => pattern == path,
    }
}

/// Whether `rule` allows `request`, and so whether the request uses it.
pub fn allows(rule: &Rule, request: &Request) -> bool {
    if !rule.verbs.iter().any(|v| v == &request.verb || v == "*") {
        return false;
    }
    if request.is_non_resource() {
        return rule
            .non_resource_urls
            .iter()
            .any(|pattern| url_matches(pattern, &request.path));
    }
    let in_namespace = rule
        .namespace
        .as_ref()
        .is_none_or(|namespace| namespace == &request.namespace);
    let group = rule
        .api_groups
        .iter()
        .any(|g| g == &request.group || g == "*");
    let resource = rule
        .resources
        .iter()
        .any(|r| r == &request.resource_path() || r == "*");
    let name = rule.resource_names.is_empty() || rule.resource_names.contains(&request.name);
    in_namespace && group && resource && name
}

/// What Kubernetes grants every authenticated account (the bootstrap
/// roles system:discovery, system:basic-user, system:public-info-viewer
/// and system:service-account-issuer-discovery): not the operator's RBAC
/// to grant.
fn granted_to_everyone(request: &Request) -> bool {
    if request.is_non_resource() {
        return [
            "/api",
            "/api/*",
            "/apis",
            "/apis/*",
            "/version",
            "/version/",
            "/healthz",
            "/livez",
            "/readyz",
            "/openapi/*",
            "/.well-known/openid-configuration",
            "/openid/v1/jwks",
        ]
        .iter()
        .any(|pattern| url_matches(pattern, &request.path));
    }
    matches!(
        (request.group.as_str(), request.resource.as_str()),
        (
            "authorization.k8s.io",
            "selfsubjectaccessreviews" | "selfsubjectrulesreviews"
        ) | ("authentication.k8s.io", "selfsubjectreviews")
    )
}

/// Each rule's verbs, one per resource and name it names, as
/// `role: verb resource [name]`.
fn grants(rule: &Rule) -> Vec<(String, Request)> {
    let mut grants = Vec::new();
    for verb in &rule.verbs {
        for url in &rule.non_resource_urls {
            grants.push((
                format!("{}: {verb} {url}", rule.role),
                Request {
                    verb: verb.clone(),
                    path: url.clone(),
                    ..Request::default()
                },
            ));
        }
        for group in &rule.api_groups {
            for resource in &rule.resources {
                let (resource, subresource) = resource
                    .split_once('/')
                    .map_or((resource.as_str(), ""), |(r, s)| (r, s));
                let names: Vec<&str> = if rule.resource_names.is_empty() {
                    vec![""]
                } else {
                    rule.resource_names.iter().map(String::as_str).collect()
                };
                for name in names {
                    let group_name = if group.is_empty() { "core" } else { group };
                    let scope = rule
                        .namespace
                        .as_ref()
                        .map(|ns| format!(" in {ns}"))
                        .unwrap_or_default();
                    let named = if name.is_empty() {
                        String::new()
                    } else {
                        format!(" named {name}")
                    };
                    let sub = if subresource.is_empty() {
                        String::new()
                    } else {
                        format!("/{subresource}")
                    };
                    grants.push((
                        format!(
                            "{}: {verb} {group_name}/{resource}{sub}{scope}{named}",
                            rule.role
                        ),
                        Request {
                            verb: verb.clone(),
                            group: group.clone(),
                            resource: resource.to_owned(),
                            subresource: subresource.to_owned(),
                            namespace: rule.namespace.clone().unwrap_or_default(),
                            name: name.to_owned(),
                            ..Request::default()
                        },
                    ));
                }
            }
        }
    }
    grants
}

/// Whether `request` used `grant` (one verb on one resource, and name when
/// the rule names one).
fn uses(grant: &Request, request: &Request) -> bool {
    if request.refused() || grant.verb != request.verb {
        return false;
    }
    if grant.resource.is_empty() {
        return request.is_non_resource() && url_matches(&grant.path, &request.path);
    }
    grant.group == request.group
        && grant.resource == request.resource
        && grant.subresource == request.subresource
        && (grant.namespace.is_empty() || grant.namespace == request.namespace)
        && (grant.name.is_empty() || grant.name == request.name)
}

/// The comparison's findings.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Findings {
    /// Granted, never used.
    pub unused: Vec<String>,
    /// Used (or tried), not granted.
    pub missing: Vec<String>,
}

pub fn compare(rules: &[Rule], requests: &BTreeSet<Request>) -> Findings {
    let mut findings = Findings::default();
    for rule in rules {
        for (what, grant) in grants(rule) {
            if !requests.iter().any(|request| uses(&grant, request)) {
                findings.unused.push(what);
            }
        }
    }
    for request in requests {
        let allowed = rules.iter().any(|rule| allows(rule, request));
        if request.refused() || (!allowed && !granted_to_everyone(request)) {
            findings.missing.push(request.to_string());
        }
    }
    findings.missing.sort();
    findings.missing.dedup();
    findings
}

/// A request line, as the fixtures write it (for the tests).
pub fn request_from(value: &Value) -> Option<Request> {
    serde_json::from_value(value.clone()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ROLES: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: op}
rules:
  - apiGroups: ["petstore.example.com"]
    resources: ["pets"]
    verbs: ["get", "watch"]
  - apiGroups: ["petstore.example.com"]
    resources: ["pets/status"]
    verbs: ["patch"]
  - nonResourceURLs: ["/openid/v1/jwks"]
    verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: certs, namespace: ops}
rules:
  - apiGroups: [""]
    resources: ["secrets"]
    resourceNames: ["tls"]
    verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: ignored, namespace: ops}
"#;

    fn request(value: Value) -> Request {
        request_from(&value).expect("a request")
    }

    fn used_as_granted() -> BTreeSet<Request> {
        [
            json!({"verb": "get", "group": "petstore.example.com", "resource": "pets", "subresource": "", "namespace": "a", "name": "x", "path": "", "code": 200}),
            json!({"verb": "watch", "group": "petstore.example.com", "resource": "pets", "subresource": "", "namespace": "", "name": "", "path": "", "code": 200}),
            json!({"verb": "patch", "group": "petstore.example.com", "resource": "pets", "subresource": "status", "namespace": "a", "name": "x", "path": "", "code": 200}),
            json!({"verb": "get", "group": "", "resource": "", "subresource": "", "namespace": "", "name": "", "path": "/openid/v1/jwks", "code": 200}),
            // A 404 still used the verb, and so did a 403 from admission.
            json!({"verb": "get", "group": "petstore.example.com", "resource": "pets", "subresource": "", "namespace": "gone", "name": "x", "path": "", "decision": "allow", "code": 403}),
            json!({"verb": "get", "group": "", "resource": "secrets", "subresource": "", "namespace": "ops", "name": "tls", "path": "", "code": 404}),
            // Discovery: every account may.
            json!({"verb": "get", "group": "", "resource": "", "subresource": "", "namespace": "", "name": "", "path": "/apis/petstore.example.com/v1", "code": 200}),
        ]
        .into_iter()
        .map(request)
        .collect()
    }

    fn rules() -> Vec<Rule> {
        rules_in(ROLES).expect("rules")
    }

    #[test]
    fn roles_equal_to_use_find_nothing() {
        assert_eq!(compare(&rules(), &used_as_granted()), Findings::default());
    }

    #[test]
    fn a_verb_nothing_uses_is_found_unused() {
        let mut requests = used_as_granted();
        requests.retain(|r| r.verb != "watch");
        let findings = compare(&rules(), &requests);
        assert_eq!(
            findings.unused,
            ["ClusterRole op: watch petstore.example.com/pets"]
        );
        assert!(findings.missing.is_empty());
    }

    #[test]
    fn a_refused_request_and_one_no_rule_allows_are_found_missing() {
        let mut requests = used_as_granted();
        requests.insert(request(json!({"verb": "delete", "group": "petstore.example.com", "resource": "pets", "subresource": "", "namespace": "a", "name": "x", "path": "", "decision": "forbid", "code": 403})));
        // Allowed only by a binding from elsewhere: still not ours.
        requests.insert(request(json!({"verb": "list", "group": "", "resource": "pods", "subresource": "", "namespace": "a", "name": "", "path": "", "code": 200})));
        let findings = compare(&rules(), &requests);
        assert_eq!(
            findings.missing,
            [
                "delete petstore.example.com/pets in a named x (403)",
                "list core/pods in a (200)",
            ]
        );
    }

    #[test]
    fn a_role_counts_only_in_its_namespace_and_for_its_names() {
        let mut requests = used_as_granted();
        requests.retain(|r| r.resource != "secrets");
        // The same Secret's name in another namespace, another name here.
        requests.insert(request(json!({"verb": "get", "group": "", "resource": "secrets", "subresource": "", "namespace": "other", "name": "tls", "path": "", "code": 200})));
        requests.insert(request(json!({"verb": "get", "group": "", "resource": "secrets", "subresource": "", "namespace": "ops", "name": "db", "path": "", "code": 200})));
        let findings = compare(&rules(), &requests);
        assert_eq!(
            findings.unused,
            ["Role certs: get core/secrets in ops named tls"]
        );
        assert_eq!(
            findings.missing,
            [
                "get core/secrets in ops named db (200)",
                "get core/secrets in other named tls (200)",
            ]
        );
    }

    #[test]
    fn the_config_rbac_files_read() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let rules = read_rules(&root, &RBAC_FILES).expect("config/'s RBAC");
        assert!(
            rules
                .iter()
                .any(|r| r.role == "ClusterRole petstore-operator")
        );
        assert!(
            rules
                .iter()
                .any(|r| r.namespace.as_deref() == Some("petstore"))
        );
    }
}
