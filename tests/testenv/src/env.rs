//! A whole installation on the local control plane: the CRD and the shipped
//! RBAC applied, the pet store running, and operators that authenticate as
//! the shipped ServiceAccount (so every test also proves RBAC suffices).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::petstore::StoreTls;
use crate::{
    ControlPlane, Operator, OperatorOptions, PetStoreServer, Result, Storage, repo_root, wait_for,
};

pub const OPERATOR_NAMESPACE: &str = "petstore-system";
pub const OPERATOR_ACCOUNT: &str = "petstore-operator";

pub struct Env {
    pub store: PetStoreServer,
    /// Kubeconfig holding a token of the operator's ServiceAccount.
    pub operator_kubeconfig: PathBuf,
    pub tls: Option<StoreTls>,
    pub cp: ControlPlane,
}

impl Env {
    pub fn start(storage: Storage) -> Result<Self> {
        Self::start_with(storage, false)
    }

    /// With `mutual_tls`, the store serves TLS and requires a client
    /// certificate; [`Env::operator_options`] then carries the flags.
    pub fn start_with(storage: Storage, mutual_tls: bool) -> Result<Self> {
        let cp = ControlPlane::start()?;
        install_crd_and_rbac(&cp)?;
        let operator_kubeconfig =
            cp.service_account_kubeconfig(OPERATOR_NAMESPACE, OPERATOR_ACCOUNT)?;
        let tls = if mutual_tls {
            let (cert, key) = cp.pki().issue_server("petstore")?;
            let (client_cert, client_key) = cp.pki().issue_client("petstore-operator")?;
            Some(StoreTls {
                ca: cp.pki().ca_cert.clone(),
                cert,
                key,
                client_cert,
                client_key,
            })
        } else {
            None
        };
        let store = PetStoreServer::start_with(cp.dir(), storage, tls.clone())?;
        Ok(Self {
            store,
            operator_kubeconfig,
            tls,
            cp,
        })
    }

    pub fn operator_options(&self, identity: &str) -> OperatorOptions {
        OperatorOptions {
            kubeconfig: self.operator_kubeconfig.clone(),
            store_addr: self.store.addr.clone(),
            leader_election: true,
            lease_namespace: OPERATOR_NAMESPACE.into(),
            identity: identity.into(),
            poll_interval: "2s",
            backoff_max: "2s",
            fault: None,
            log_filter: "info,petstore_operator=debug",
            extra_args: self
                .tls
                .iter()
                .flat_map(|tls| {
                    [
                        "--petstore-ca-file".into(),
                        tls.ca.clone().into_os_string(),
                        "--petstore-cert-file".into(),
                        tls.client_cert.clone().into_os_string(),
                        "--petstore-key-file".into(),
                        tls.client_key.clone().into_os_string(),
                    ]
                })
                .collect(),
        }
    }

    pub fn start_operator(&self, identity: &str) -> Result<Operator> {
        self.start_operator_with(&self.operator_options(identity))
    }

    pub fn start_operator_with(&self, options: &OperatorOptions) -> Result<Operator> {
        Operator::start(
            options,
            &self.cp.dir().join(format!("{}.log", options.identity)),
        )
    }

    /// `kubectl get pet <name> -n <namespace> -o json`.
    pub fn pet(&self, namespace: &str, name: &str) -> Result<Value> {
        let out = self
            .cp
            .kubectl(&["get", "pet", name, "-n", namespace, "-o", "json"])?;
        serde_json::from_str(&out).map_err(|e| crate::Error::Command {
            command: "kubectl get pet".into(),
            status: "unparsable".into(),
            stderr: e.to_string(),
        })
    }

    /// Waits until the Pet is Ready=True for its current generation and
    /// returns its status.id.
    pub fn wait_ready(&self, namespace: &str, name: &str, timeout: Duration) -> Result<String> {
        wait_for(timeout, &format!("Pet {namespace}/{name} Ready"), || {
            let pet = self.pet(namespace, name).ok()?;
            is_ready(&pet).then(|| pet["status"]["id"].as_str().map(str::to_owned))?
        })
    }

    /// Who holds the operator's leader Lease.
    pub fn lease_holder(&self) -> Result<String> {
        self.cp.kubectl(&[
            "get",
            "lease",
            "petstore-operator",
            "-n",
            OPERATOR_NAMESPACE,
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ])
    }

    /// The store's pets, sorted by name.
    pub fn store_pets(&self) -> Result<Vec<Value>> {
        let mut pets = self.store.all_pets()?;
        pets.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        Ok(pets)
    }
}

/// Applies the generated CRD and the shipped RBAC (creating the operator's
/// namespace), and waits until the API server serves Pets.
pub fn install_crd_and_rbac(cp: &ControlPlane) -> Result<()> {
    let config = repo_root().join("config");
    let crd = config.join("crd/petstore.example.com_pets.yaml");
    cp.kubectl(&["apply", "-f", &crd.to_string_lossy()])?;
    cp.kubectl(&["create", "namespace", OPERATOR_NAMESPACE])?;
    cp.kubectl(&["apply", "-k", &config.join("rbac").to_string_lossy()])?;
    cp.kubectl(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/pets.petstore.example.com",
    ])?;
    Ok(())
}

/// Ready=True, for the Pet's current generation, with an ID in status.
pub fn is_ready(pet: &Value) -> bool {
    let generation = &pet["metadata"]["generation"];
    pet["status"]["id"].is_string()
        && condition(pet, "Ready")
            .is_some_and(|c| c["status"] == "True" && c["observedGeneration"] == *generation)
}

pub fn condition<'a>(pet: &'a Value, type_: &str) -> Option<&'a Value> {
    pet["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}
