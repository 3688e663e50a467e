//! The pet store: a tonic gRPC service over a storage trait, with durable
//! (redb), in-memory and PostgreSQL backends.

pub mod admission;
pub mod auth;
pub mod metrics;
pub mod model;
pub mod observe;
pub mod per_client;
pub mod rpc;
pub mod server;
pub mod service;
pub mod storage;
pub mod tenancy;
pub mod tls;
pub mod validate;
pub mod watch;
pub mod wire;
