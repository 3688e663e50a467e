//! The pet store wire contract: generated messages, the tonic client and
//! server for `petstore.PetStore`, and the encoded descriptor set used for
//! gRPC reflection.

/// Messages and service for package `petstore`.
pub mod petstore {
    #![allow(clippy::doc_lazy_continuation, clippy::large_enum_variant)]
    tonic::include_proto!("petstore");
}

/// `google.type.Date`, written for this project in `proto/google/type/date.proto`.
pub mod google {
    pub mod r#type {
        tonic::include_proto!("google.r#type");
    }
}

pub mod convert;

/// Encoded `FileDescriptorSet` of every file in `proto/`, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/petstore_descriptor.bin"));

pub use petstore::pet_store_client::PetStoreClient;
pub use petstore::pet_store_server::{PetStore, PetStoreServer};
