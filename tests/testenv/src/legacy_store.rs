//! A stand-in for the original pet store (the Go one from the book): a real
//! gRPC server on 127.0.0.1 that offers only the four original RPCs. It
//! keeps no idempotency keys, and GetPets and SetIdempotencyKeys answer
//! UNIMPLEMENTED with the message grpc-go gives for an unknown method.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use futures::Stream;
use petstore_proto::petstore as pb;
use petstore_proto::{PetStore, PetStoreServer};
use tonic::{Request, Response, Status};

use crate::{Result, io};

#[derive(Default)]
struct Legacy {
    pets: Mutex<(u64, BTreeMap<String, pb::Pet>)>,
}

fn unknown(method: &str) -> Status {
    Status::unimplemented(format!(
        "unknown method {method} for service petstore.PetStore"
    ))
}

impl Legacy {
    fn pets(&self) -> std::sync::MutexGuard<'_, (u64, BTreeMap<String, pb::Pet>)> {
        self.pets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[tonic::async_trait]
impl PetStore for Legacy {
    async fn add_pets(
        &self,
        request: Request<pb::AddPetsReq>,
    ) -> std::result::Result<Response<pb::AddPetsResp>, Status> {
        let mut state = self.pets();
        let mut ids = Vec::new();
        for mut pet in request.into_inner().pets {
            state.0 += 1;
            pet.id = format!("legacy-{}", state.0);
            // The original store has no field 5: the key is dropped.
            pet.idempotency_key.clear();
            ids.push(pet.id.clone());
            state.1.insert(pet.id.clone(), pet);
        }
        // Nor field 2 of the response: it never says whether it created.
        Ok(Response::new(pb::AddPetsResp {
            ids,
            created: Vec::new(),
        }))
    }

    async fn update_pets(
        &self,
        request: Request<pb::UpdatePetsReq>,
    ) -> std::result::Result<Response<pb::UpdatePetsResp>, Status> {
        let mut state = self.pets();
        for mut pet in request.into_inner().pets {
            if !state.1.contains_key(&pet.id) {
                return Err(Status::not_found(format!("no pet {}", pet.id)));
            }
            pet.idempotency_key.clear();
            state.1.insert(pet.id.clone(), pet);
        }
        Ok(Response::new(pb::UpdatePetsResp {}))
    }

    async fn delete_pets(
        &self,
        request: Request<pb::DeletePetsReq>,
    ) -> std::result::Result<Response<pb::DeletePetsResp>, Status> {
        let mut state = self.pets();
        for id in request.into_inner().ids {
            state.1.remove(&id);
        }
        Ok(Response::new(pb::DeletePetsResp {}))
    }

    type SearchPetsStream =
        Pin<Box<dyn Stream<Item = std::result::Result<pb::Pet, Status>> + Send + 'static>>;

    async fn search_pets(
        &self,
        _request: Request<pb::SearchPetsReq>,
    ) -> std::result::Result<Response<Self::SearchPetsStream>, Status> {
        let pets: Vec<_> = self.pets().1.values().cloned().map(Ok).collect();
        Ok(Response::new(Box::pin(futures::stream::iter(pets))))
    }

    async fn get_pets(
        &self,
        _request: Request<pb::GetPetsReq>,
    ) -> std::result::Result<Response<pb::GetPetsResp>, Status> {
        Err(unknown("GetPets"))
    }

    async fn set_idempotency_keys(
        &self,
        _request: Request<pb::SetIdempotencyKeysReq>,
    ) -> std::result::Result<Response<pb::SetIdempotencyKeysResp>, Status> {
        Err(unknown("SetIdempotencyKeys"))
    }
}

/// The running server; it stops when this is dropped.
pub struct LegacyStore {
    pub addr: String,
    state: Arc<Legacy>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl LegacyStore {
    pub fn start() -> Result<Self> {
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").map_err(io("binding the legacy store"))?;
        listener
            .set_nonblocking(true)
            .map_err(io("binding the legacy store"))?;
        let addr = listener
            .local_addr()
            .map_err(io("binding the legacy store"))?
            .to_string();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(io("starting the legacy store's runtime"))?;
        let state = Arc::new(Legacy::default());
        let service = PetStoreServer::from_arc(Arc::clone(&state));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready, started) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            runtime.block_on(async move {
                let incoming = tokio::net::TcpListener::from_std(listener)
                    .map(tonic::transport::server::TcpIncoming::from);
                let incoming = match incoming {
                    Ok(incoming) => incoming,
                    Err(err) => {
                        let _ = ready.send(Err(err));
                        return;
                    }
                };
                let _ = ready.send(Ok(()));
                let _ = tonic::transport::Server::builder()
                    .add_service(service)
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = stopped.await;
                    })
                    .await;
            });
        });
        started
            .recv()
            .map_err(|_| std::io::Error::other("the legacy store's thread ended"))
            .and_then(|r| r)
            .map_err(io("starting the legacy store"))?;
        Ok(Self {
            addr,
            state,
            _stop: stop,
        })
    }

    /// The IDs of every pet the store holds.
    pub fn ids(&self) -> Vec<String> {
        self.state.pets().1.keys().cloned().collect()
    }
}
