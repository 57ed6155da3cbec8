//! What every request asks the database about its caller, kept for a moment: the API key and
//! its user, the quotas and the organization. A busy program submits thousands of tasks a
//! second with one key; reading the same rows for each would cost more than storing the task.
//!
//! Staleness is bounded twice. Every change this server makes to accounts (a key revoked, a
//! member disabled, a role or quota changed) clears the cache at once and tells the other
//! servers of the database to clear theirs ([`crate::replicas::Signal::Accounts`]); and nothing
//! is kept longer than [`KEEP_FOR`], for changes made where no signal reaches (the offline
//! admin commands, a lost notification).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use moka::sync::Cache;

use crate::store::{
    Accounts, ApiKeyRecord, QuotaRecord, QuotaScope, StoreResult, TenantRecord, UserRecord,
};

/// The longest a cached row is believed.
pub const KEEP_FOR: Duration = Duration::from_secs(2);

/// Rows kept per kind: enough for every active caller of a large installation.
const CAPACITY: u64 = 100_000;

/// An API key as stored, with the user it acts for (`None`: the user is gone).
#[derive(Debug, Clone)]
pub struct KeyWithUser {
    pub key: ApiKeyRecord,
    pub user: Option<UserRecord>,
}

pub struct AccountCache {
    keys: Cache<String, Option<KeyWithUser>>,
    quotas: Cache<(QuotaScope, String), QuotaRecord>,
    tenants: Cache<String, Option<TenantRecord>>,
    /// Bumped by every clearing, so that a read that raced with a change does not put what it
    /// read before the change back into the cache.
    generation: AtomicU64,
}

/// A cache that forgets each entry after [`KEEP_FOR`].
fn brief<K, V>() -> Cache<K, V>
where
    K: std::hash::Hash + Eq + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    Cache::builder()
        .max_capacity(CAPACITY)
        .time_to_live(KEEP_FOR)
        .build()
}

impl Default for AccountCache {
    fn default() -> Self {
        AccountCache {
            keys: brief(),
            quotas: brief(),
            tenants: brief(),
            generation: AtomicU64::new(0),
        }
    }
}

impl AccountCache {
    /// Accounts changed: forget everything.
    pub fn clear(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.keys.invalidate_all();
        self.quotas.invalidate_all();
        self.tenants.invalidate_all();
    }

    /// Reads through `cache`: a value read while nothing changed is kept.
    async fn through<K, V, F>(&self, cache: &Cache<K, V>, key: K, read: F) -> StoreResult<V>
    where
        K: std::hash::Hash + Eq + Send + Sync + 'static,
        V: Clone + Send + Sync + 'static,
        F: std::future::Future<Output = StoreResult<V>>,
    {
        if let Some(v) = cache.get(&key) {
            return Ok(v);
        }
        let generation = self.generation.load(Ordering::SeqCst);
        let v = read.await?;
        if self.generation.load(Ordering::SeqCst) == generation {
            cache.insert(key, v.clone());
        }
        Ok(v)
    }

    /// The key whose digest is `hash`, and its user.
    pub async fn api_key(
        &self,
        store: &dyn Accounts,
        hash: &str,
    ) -> StoreResult<Option<KeyWithUser>> {
        self.through(&self.keys, hash.to_owned(), async {
            let Some(key) = store.api_key_by_hash(hash).await? else {
                return Ok(None);
            };
            let user = store.user(&key.user_id).await?;
            Ok(Some(KeyWithUser { key, user }))
        })
        .await
    }

    /// The key's last use was just recorded.
    pub fn key_used(&self, hash: &str, at: i64) {
        if let Some(Some(mut k)) = self.keys.get(hash) {
            k.key.last_used_at = Some(at);
            self.keys.insert(hash.to_owned(), Some(k));
        }
    }

    pub async fn quota(
        &self,
        store: &dyn Accounts,
        scope: QuotaScope,
        subject: &str,
    ) -> StoreResult<QuotaRecord> {
        self.through(
            &self.quotas,
            (scope, subject.to_owned()),
            store.quota(scope, subject),
        )
        .await
    }

    pub async fn tenant(
        &self,
        store: &dyn Accounts,
        id: &str,
    ) -> StoreResult<Option<TenantRecord>> {
        self.through(&self.tenants, id.to_owned(), store.tenant(id))
            .await
    }
}
