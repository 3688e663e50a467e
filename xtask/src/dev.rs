//! `cargo xtask dev`: a Docker-free local environment (a real control plane
//! on 127.0.0.1, the durable pet store and the operator, with the CRD and
//! samples applied). `cargo xtask cluster`: the one-node cluster of the Tilt
//! quick start (real node, registry on localhost:5005, context
//! `kind-petstore`; needs root), for `tilt up` without kind. Both run until
//! Ctrl-C, then stop everything and remove their files.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fixtures::{Env, Storage};

/// The one-node cluster, until Ctrl-C.
pub fn cluster(stop: &AtomicBool) -> fixtures::Result<()> {
    eprintln!("starting the one-node cluster (the first run builds and caches its parts)...");
    let cluster = fixtures::cluster::Cluster::start()?;
    println!(
        "
A one-node cluster is running (context kind-petstore, registry on localhost:5005).

  export KUBECONFIG={kubeconfig}
  export PATH={bin}:$PATH     # tilt and the node's binaries
  tilt up

Logs: {dir}/*.log

Press Ctrl-C to stop it and remove everything.",
        kubeconfig = cluster.kubeconfig.display(),
        bin = cluster.bin_dir.display(),
        dir = cluster.dir().display(),
    );
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("stopping...");
    let left = cluster.shutdown();
    if !left.is_empty() {
        eprintln!("left behind:\n{}", left.join("\n"));
    }
    Ok(())
}

pub fn dev(stop: &AtomicBool) -> fixtures::Result<()> {
    // The pet store and the operator, into the target directory and profile
    // this command runs from, so that it works from a fresh clone.
    fixtures::build_binaries()?;
    eprintln!(
        "starting etcd, kube-apiserver and the namespace controller (the first run builds them)..."
    );
    let env = Env::start(Storage::Durable)?;
    // As config/default has it: the CRD is not deleted while Pets exist.
    fixtures::env::install_crd_guard(&env.cp)?;
    let operator = env.start_operator("petstore-operator-dev")?;
    env.apply_samples()?;
    let dir = env.cp.dir().display().to_string();
    println!(
        "
The pet store operator is running against a local control plane.

  export KUBECONFIG={kubeconfig}
  kubectl get pets
  grpcurl -plaintext {store} petstore.PetStore/SearchPets

grpcurl is at {grpcurl}.
Logs: {dir}/*.log   (operator: {dir}/petstore-operator-dev.log)

Press Ctrl-C to stop and clean up.",
        kubeconfig = env.cp.kubeconfig.display(),
        store = env.store.addr,
        grpcurl = fixtures::Tools::get()?.bin("grpcurl").display(),
    );
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("stopping...");
    drop(operator);
    drop(env);
    Ok(())
}
