//! The pet store: a tonic gRPC service over a storage trait, with a durable
//! (redb) and an in-memory backend.

pub mod model;
pub mod server;
pub mod service;
pub mod storage;
pub mod validate;
pub mod wire;
