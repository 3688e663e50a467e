//! The pet store's RPCs as the server's tower layers see them: by request
//! path (`/petstore.PetStore/AddPets`), with the static names their spans
//! and metric labels use.

/// One `petstore.PetStore` RPC.
#[derive(Debug, PartialEq, Eq)]
pub struct Rpc {
    /// `petstore.PetStore/AddPets`: the span's `otel.name`.
    pub full_name: &'static str,
    /// `AddPets`: the `method` label and the span's `rpc.method`.
    pub method: &'static str,
}

pub const SERVICE: &str = "petstore.PetStore";

macro_rules! rpcs {
    ($($method:literal),* $(,)?) => {
        &[$(Rpc { full_name: concat!("petstore.PetStore/", $method), method: $method }),*]
    };
}

/// Every RPC of `petstore.PetStore` (proto/petstore.proto).
pub const RPCS: &[Rpc] = rpcs![
    "AddPets",
    "UpdatePets",
    "DeletePets",
    "SearchPets",
    "ChangeSampler",
    "SetIdempotencyKeys",
    "GetPets",
    "WatchPets",
    "ClaimInstallation",
];

/// The pet store RPC a request's path names; `None` for other services
/// (health, reflection) and unknown methods.
pub fn by_path(path: &str) -> Option<&'static Rpc> {
    let full_name = path.strip_prefix('/')?;
    RPCS.iter().find(|rpc| rpc.full_name == full_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_pet_store_rpcs_only() {
        let add = by_path("/petstore.PetStore/AddPets").expect("AddPets");
        assert_eq!(
            (add.full_name, add.method),
            ("petstore.PetStore/AddPets", "AddPets")
        );
        assert_eq!(
            by_path("/petstore.PetStore/WatchPets").map(|rpc| rpc.method),
            Some("WatchPets")
        );
        for other in [
            "/grpc.health.v1.Health/Check",
            "/petstore.PetStore/Nope",
            "petstore.PetStore/AddPets",
            "/petstore.PetStore/",
        ] {
            assert_eq!(by_path(other), None, "{other}");
        }
    }

    // A method missing from the table would go unobserved and unbounded.
    #[test]
    fn the_table_names_every_method_of_the_service() {
        use prost::Message as _;
        let set = prost_types::FileDescriptorSet::decode(petstore_proto::FILE_DESCRIPTOR_SET)
            .expect("descriptor set");
        let mut declared: Vec<String> = set
            .file
            .iter()
            .filter(|file| file.package() == "petstore")
            .flat_map(|file| &file.service)
            .filter(|service| service.name() == "PetStore")
            .flat_map(|service| &service.method)
            .map(|method| method.name().to_owned())
            .collect();
        declared.sort();
        let mut listed: Vec<String> = RPCS.iter().map(|rpc| rpc.method.to_owned()).collect();
        listed.sort();
        assert_eq!(listed, declared);
        assert!(RPCS.iter().all(|rpc| rpc.full_name.starts_with(SERVICE)));
    }
}
