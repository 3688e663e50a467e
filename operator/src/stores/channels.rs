//! Channels shared by the store objects that name one endpoint.
//!
//! Each `PetStore` and `ClusterPetStore` is opened on its first use. When
//! many name one store process (a `PetStore/default` in each of 200
//! namespaces, say), a channel each would be a connection each: past the
//! store's bound on one client's connections (`--max-connections-per-client`,
//! 64), the store closes the rest as they come, and their calls fail
//! (measured: 67 objects on one store, 46,524 connections refused while
//! converging). So the objects with the same endpoint share a channel, and
//! with it the call budget, which protects the store process, not the
//! object. At most [`OBJECTS_PER_CHANNEL`] share one, bounding the calls
//! one connection carries at once (the store serves at most 256 streams
//! on one connection). The objects of one endpoint read one change feed
//! (`controller/feed.rs`), whichever channels they use.

use std::collections::{HashMap, HashSet};

use super::StoreId;

/// How many store objects share one channel at most.
pub const OBJECTS_PER_CHANNEL: usize = 32;

/// What makes two store objects' channels the same: where the store is,
/// and how it is trusted. The audience is not in it: it is the token's,
/// carried by each call.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ChannelKey {
    pub address: String,
    pub ca: Option<Vec<u8>>,
    pub server_name: Option<String>,
}

struct Shared<T> {
    channel: T,
    users: HashSet<StoreId>,
}

/// The open channels, by endpoint, and the store objects using each.
pub struct ChannelPool<T> {
    by_key: HashMap<ChannelKey, Vec<Shared<T>>>,
}

impl<T> Default for ChannelPool<T> {
    fn default() -> Self {
        Self {
            by_key: HashMap::new(),
        }
    }
}

impl<T: Clone> ChannelPool<T> {
    /// The channel store object `id` uses to reach `key`: the one it
    /// already shares, else one with room, else a new one from `open`. An
    /// object whose endpoint changed leaves its old channel.
    pub fn join<E>(
        &mut self,
        key: ChannelKey,
        id: &StoreId,
        open: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        self.leave_where(id, |other| *other != key);
        let shared = self.by_key.entry(key.clone()).or_default();
        if let Some(found) = shared.iter().find(|s| s.users.contains(id)) {
            return Ok(found.channel.clone());
        }
        if let Some(room) = shared
            .iter_mut()
            .find(|s| s.users.len() < OBJECTS_PER_CHANNEL)
        {
            room.users.insert(id.clone());
            return Ok(room.channel.clone());
        }
        let channel = match open() {
            Ok(channel) => channel,
            Err(error) => {
                if shared.is_empty() {
                    self.by_key.remove(&key);
                }
                return Err(error);
            }
        };
        shared.push(Shared {
            channel: channel.clone(),
            users: HashSet::from([id.clone()]),
        });
        Ok(channel)
    }

    /// Store object `id` is closed: a channel no object uses any longer is
    /// dropped, and its connection closes with the last client on it.
    pub fn leave(&mut self, id: &StoreId) {
        self.leave_where(id, |_| true);
    }

    fn leave_where(&mut self, id: &StoreId, which: impl Fn(&ChannelKey) -> bool) {
        self.by_key.retain(|key, shared| {
            if which(key) {
                for channel in shared.iter_mut() {
                    channel.users.remove(id);
                }
                shared.retain(|channel| !channel.users.is_empty());
            }
            !shared.is_empty()
        });
    }

    /// How many channels are open.
    pub fn len(&self) -> usize {
        self.by_key.values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(address: &str) -> ChannelKey {
        ChannelKey {
            address: address.into(),
            ca: Some(b"CA".to_vec()),
            server_name: Some("petstore".into()),
        }
    }

    fn ids(n: usize) -> Vec<StoreId> {
        (0..n)
            .map(|i| StoreId::namespaced(&format!("team-{i}"), "default"))
            .collect()
    }

    /// A pool whose channels are numbered in the order they were opened.
    struct Counting {
        pool: ChannelPool<usize>,
        opened: usize,
    }

    impl Counting {
        fn new() -> Self {
            Self {
                pool: ChannelPool::default(),
                opened: 0,
            }
        }

        fn join(&mut self, address: &str, id: &StoreId) -> usize {
            let next = self.opened + 1;
            let channel = self
                .pool
                .join(key(address), id, || Ok::<_, ()>(next))
                .expect("opens");
            self.opened = self.opened.max(channel);
            channel
        }
    }

    #[test]
    fn objects_naming_one_endpoint_share_a_channel_up_to_the_bound() {
        let mut pool = Counting::new();
        let objects = ids(OBJECTS_PER_CHANNEL + 8);
        let channels: Vec<usize> = objects
            .iter()
            .map(|id| pool.join("petstore:6742", id))
            .collect();
        assert!(channels[..OBJECTS_PER_CHANNEL].iter().all(|c| *c == 1));
        assert!(channels[OBJECTS_PER_CHANNEL..].iter().all(|c| *c == 2));
        assert_eq!((pool.opened, pool.pool.len()), (2, 2));
        // Joining again (a later Pet of the same object) opens nothing.
        assert_eq!(pool.join("petstore:6742", &objects[3]), 1);
        assert_eq!(pool.opened, 2);
    }

    #[test]
    fn other_endpoints_and_other_trust_get_channels_of_their_own() {
        let mut pool = Counting::new();
        let [a, b, c] = <[StoreId; 3]>::try_from(ids(3)).expect("three");
        assert_eq!(pool.join("store-a:6742", &a), 1);
        assert_eq!(pool.join("store-b:6742", &b), 2);
        let other_ca = ChannelKey {
            ca: Some(b"another CA".to_vec()),
            ..key("store-a:6742")
        };
        let channel = pool.pool.join(other_ca, &c, || Ok::<_, ()>(3));
        assert_eq!(channel, Ok(3));
        assert_eq!(pool.pool.len(), 3);
    }

    #[test]
    fn a_channel_goes_with_its_last_object_and_a_moved_object_leaves_its_old_one() {
        let mut pool = Counting::new();
        let [a, b] = <[StoreId; 2]>::try_from(ids(2)).expect("two");
        pool.join("store-a:6742", &a);
        pool.join("store-a:6742", &b);
        pool.pool.leave(&a);
        assert_eq!(pool.pool.len(), 1, "b still uses it");
        // b's spec now names another address: it leaves store-a's channel,
        // which no one uses any more.
        assert_eq!(pool.join("store-b:6742", &b), 2);
        assert_eq!(pool.pool.len(), 1);
        pool.pool.leave(&b);
        assert!(pool.pool.is_empty());
        // Opened anew on the next use.
        assert_eq!(pool.join("store-a:6742", &a), 3);
    }

    #[test]
    fn a_channel_that_cannot_be_opened_records_nothing() {
        let mut pool: ChannelPool<usize> = ChannelPool::default();
        let [a] = <[StoreId; 1]>::try_from(ids(1)).expect("one");
        assert_eq!(
            pool.join(key("bad"), &a, || Err("no address")),
            Err("no address")
        );
        assert!(pool.is_empty());
        assert_eq!(pool.join(key("bad"), &a, || Ok::<_, &str>(7)), Ok(7));
    }
}
