//! The end-to-end tests, one module per story. They run the real binaries
//! (built by cargo into the same target directory) against a real
//! kube-apiserver and etcd on 127.0.0.1 (see the `fixtures` crate), and
//! drive them the way users do: `kubectl`, `grpcurl`, `tilt`.
//!
//! One story: `cargo test -p e2e -- ownership::`. The Tilt quick start needs
//! root and runs in a phase of its own in hack/test.sh: `cargo test -p e2e
//! -- tilt:: --nocapture`.

mod admission;
mod attacks;
mod book_rpcs;
mod capabilities;
mod change_feed;
mod chaos;
mod conversion;
mod deploy;
mod drift;
mod drift_storm;
mod fairness;
mod faults;
mod health;
mod helm;
mod import;
mod installation_claim;
mod krew;
mod kubernetes;
mod monitoring;
mod oci;
mod ownership;
mod pacing;
mod plans;
mod plans_restart;
mod plans_soak;
mod plugin_tenancy;
mod postgres_replicas;
mod rebuild;
mod rotation;
mod security;
mod source_times;
mod store_feeds;
mod stores;
mod tenancy;
mod tilt;
mod traces;
mod typed;
mod uninstall;
mod upgrade;
mod user_story;

/// A kube client with the test's own (admin) kubeconfig, for stories whose
/// polls need milliseconds where kubectl takes tens.
async fn admin_client(
    env: &fixtures::Env,
) -> Result<kube::Client, Box<dyn std::error::Error + Send + Sync>> {
    let kubeconfig = kube::config::Kubeconfig::read_from(&env.cp.kubeconfig)?;
    let options = kube::config::KubeConfigOptions::default();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options).await?;
    Ok(kube::Client::try_from(config)?)
}
