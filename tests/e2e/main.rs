//! The end-to-end tests, one module per story. They run the real binaries
//! (built by cargo into the same target directory) against a real
//! kube-apiserver and etcd on 127.0.0.1 (see the `fixtures` crate), and
//! drive them the way users do: `kubectl`, `grpcurl`, `tilt`.
//!
//! One story: `cargo test -p e2e -- ownership::`. The Tilt quick start needs
//! root and runs in a phase of its own in hack/test.sh: `cargo test -p e2e
//! -- tilt:: --nocapture`.

mod admission;
mod book_rpcs;
mod change_feed;
mod chaos;
mod conversion;
mod deploy;
mod drift;
mod faults;
mod health;
mod kubernetes;
mod monitoring;
mod ownership;
mod plans;
mod plans_soak;
mod postgres_replicas;
mod security;
mod tilt;
mod traces;
mod uninstall;
mod upgrade;
mod user_story;
