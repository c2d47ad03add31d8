//! [`AuthSlot`]: the access control in force on one node, and
//! [`AuthReload`], the handle that replaces it on every node attached.

use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};

use crate::access::Auth;
use crate::config::{AuthConfig, NamespacesConfig};
use crate::error::AuthError;

/// The access control in force on one node. A reload
/// ([`AuthReload::replace`]) swaps it whole; each request reads it once
/// ([`AuthSlot::load`]) and is judged by one version throughout.
#[derive(Debug)]
pub struct AuthSlot(RwLock<Arc<Auth>>);

impl AuthSlot {
    /// A slot holding `auth`.
    pub fn new(auth: Auth) -> Self {
        Self(RwLock::new(Arc::new(auth)))
    }

    /// The access control in force now.
    pub fn load(&self) -> Arc<Auth> {
        Arc::clone(&self.0.read().unwrap_or_else(PoisonError::into_inner))
    }

    fn store(&self, auth: Auth) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(auth);
    }
}

/// Reloads the access control of the nodes started with a
/// server config holding it: `herald serve` calls
/// [`AuthReload::replace`] on SIGHUP when the config file's `[auth]` or
/// `[namespaces]` changed (API keys, JWT keys, namespace rules, publish
/// rates, `protect_metrics`, `history_resume_window`), and
/// [`AuthReload::reload_jwt_keys`] when they did not, so that a key added
/// to the JWKS file for a rotation is accepted without a restart. Clones
/// share the same nodes. It is not a setting: two handles compare equal.
#[derive(Clone, Default)]
pub struct AuthReload(Arc<Mutex<Vec<Weak<AuthSlot>>>>);

impl AuthReload {
    /// Has the access control in `slot` reloaded by this handle from now
    /// on.
    pub fn attach(&self, slot: &Arc<AuthSlot>) {
        let mut nodes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        nodes.retain(|node| node.strong_count() > 0);
        nodes.push(Arc::downgrade(slot));
    }

    /// The slots of the nodes still running.
    fn slots(&self) -> Vec<Arc<AuthSlot>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// Reads the JWT key files of every running node attached again; the
    /// number of keys they hold now (summed over the nodes).
    ///
    /// # Errors
    /// [`AuthError::KeyReload`] naming the file that cannot be read or
    /// holds no usable key; that node keeps the keys in force.
    pub fn reload_jwt_keys(&self) -> Result<usize, AuthError> {
        let mut keys = 0;
        for slot in self.slots() {
            keys += slot.load().reload_jwt_keys()?;
        }
        Ok(keys)
    }

    /// Puts `config` and `namespaces` in force on every running node
    /// attached, checked as at the start ([`Auth::new`]: key files read
    /// again). Requests from then on are judged by them; subscriptions
    /// already open stay open (a token's still end at its `exp`). The
    /// publish rate buckets start full again. The cluster secret in force
    /// stays: the forwarder sends the one it started with, so a new one
    /// takes effect at the next restart. Returns the number of nodes
    /// whose access control was replaced.
    ///
    /// # Errors
    /// [`AuthError::Config`] naming the setting that is wrong, or when
    /// the new settings would turn access control off (no API key, no
    /// `[auth.jwt]`) on a node that has it on: that needs a restart, which
    /// checks the exposure again. The settings in force stay.
    pub fn replace(
        &self,
        config: &AuthConfig,
        namespaces: &NamespacesConfig,
    ) -> Result<usize, AuthError> {
        let slots = self.slots();
        let mut built = Vec::with_capacity(slots.len());
        for slot in &slots {
            let current = slot.load();
            let mut next = Auth::new(config, namespaces, current.jwks_fetch())?;
            if current.enabled() && !next.enabled() {
                return Err(AuthError::Config(
                    "the new [auth] has neither API keys nor [auth.jwt]: turning access control \
                     off needs a restart"
                        .to_owned(),
                ));
            }
            next.keep_cluster_secret(&current);
            built.push(next);
        }
        for (slot, next) in slots.iter().zip(built) {
            slot.store(next);
        }
        Ok(slots.len())
    }
}

impl std::fmt::Debug for AuthReload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthReload")
    }
}

/// Not a setting: every handle equals every other.
impl PartialEq for AuthReload {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for AuthReload {}
