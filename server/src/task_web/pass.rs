//! Passes into a task's app. The platform's own cookie never reaches an app's origin, so the
//! person carries a one-minute, single-use ticket there (made on the platform's origin, where
//! they are signed in), and the app's origin trades it for a pass cookie of its own.
//!
//! Both are JWTs under a key derived for apps alone: neither can stand for a platform session
//! or a task token, nor those for them.

use jsonwebtoken::{decode, encode, Algorithm, DecodingKey, EncodingKey, Header};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::origin::AppHost;
use crate::auth::{Caller, CallerVia};

/// The pass cookie on an app's origin; taken out of every request the app is sent.
pub const PASS_COOKIE: &str = "autodl_app";
pub const TICKET_SECS: i64 = 60;
/// A pass lasts a working day at most; the sign-in it came from is checked on every request.
pub const PASS_SECS: i64 = 12 * 3600;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Ticket,
    Pass,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AppClaims {
    pub kind: Kind,
    /// The user it was made for.
    pub sub: String,
    pub task: String,
    pub port: u16,
    /// The platform session or API key it was made from.
    pub sid: Option<String>,
    pub key: Option<String>,
    pub jti: String,
    pub exp: i64,
}

impl AppClaims {
    pub fn via(&self) -> Option<CallerVia> {
        match (&self.sid, &self.key) {
            (Some(sid), None) => Some(CallerVia::Session {
                sid: sid.clone(),
                from_cookie: false,
            }),
            (None, Some(id)) => Some(CallerVia::ApiKey { id: id.clone() }),
            _ => None,
        }
    }
}

pub struct AppKeys {
    encoding: EncodingKey,
    decoding: DecodingKey,
    /// Tickets already traded (a ticket is good once), until they expire by the clock.
    spent: std::sync::Mutex<std::collections::HashMap<String, i64>>,
}

impl AppKeys {
    pub fn new(platform_secret: &[u8]) -> AppKeys {
        let mut h = Sha256::new();
        h.update(b"autodl apps\0");
        h.update(platform_secret);
        let key = h.finalize();
        AppKeys {
            encoding: EncodingKey::from_secret(&key),
            decoding: DecodingKey::from_secret(&key),
            spent: Default::default(),
        }
    }

    /// A ticket for `caller` into `app`.
    pub fn ticket(&self, caller: &Caller, app: &AppHost, now_ms: i64) -> anyhow::Result<String> {
        let (sid, key) = match &caller.via {
            CallerVia::Session { sid, .. } => (Some(sid.clone()), None),
            CallerVia::ApiKey { id } => (None, Some(id.clone())),
        };
        self.sign(&AppClaims {
            kind: Kind::Ticket,
            sub: caller.user.id.clone(),
            task: app.task_id.clone(),
            port: app.port,
            sid,
            key,
            jti: uuid::Uuid::new_v4().to_string(),
            exp: now_ms / 1000 + TICKET_SECS,
        })
    }

    /// Trades a ticket for `app` for a pass (once); `None` if it is not a live, unspent
    /// ticket for exactly this app.
    pub fn trade(&self, ticket: &str, app: &AppHost, now_ms: i64) -> Option<(String, AppClaims)> {
        let t = self.verify(ticket, Kind::Ticket, app, now_ms)?;
        {
            let mut spent = self.spent.lock().unwrap_or_else(|p| p.into_inner());
            // An expired ticket is refused by `verify`: only live ones need remembering.
            spent.retain(|_, exp_ms| *exp_ms > now_ms);
            if spent.insert(t.jti.clone(), t.exp * 1000).is_some() {
                return None;
            }
        }
        let pass = AppClaims {
            kind: Kind::Pass,
            jti: uuid::Uuid::new_v4().to_string(),
            exp: now_ms / 1000 + PASS_SECS,
            ..t
        };
        let token = self.sign(&pass).ok()?;
        Some((token, pass))
    }

    /// The claims of a live token of `kind` made for exactly `app`.
    pub fn verify(&self, token: &str, kind: Kind, app: &AppHost, now_ms: i64) -> Option<AppClaims> {
        let mut v = crate::auth::session::signed_only();
        v.set_required_spec_claims(&["exp", "sub", "jti"]);
        decode::<AppClaims>(token, &self.decoding, &v)
            .ok()
            .map(|d| d.claims)
            .filter(|c| {
                c.kind == kind
                    && c.exp * 1000 > now_ms
                    && c.task == app.task_id
                    && c.port == app.port
                    && c.via().is_some()
            })
    }

    fn sign(&self, c: &AppClaims) -> anyhow::Result<String> {
        Ok(encode(&Header::new(Algorithm::HS256), c, &self.encoding)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::UserRecord;

    fn caller() -> Caller {
        Caller {
            user: UserRecord {
                id: "u1".into(),
                email: "ada@example.com".into(),
                password_hash: String::new(),
                tenant_id: "org".into(),
                role: autodl_common::api::Role::Member,
                platform_admin: false,
                disabled: false,
                created_at: 0,
            },
            role: autodl_common::api::Role::Member,
            via: CallerVia::Session {
                sid: "s1".into(),
                from_cookie: true,
            },
        }
    }

    fn app(port: u16) -> AppHost {
        AppHost {
            task_id: "t1".into(),
            port,
        }
    }

    #[test]
    fn a_ticket_is_traded_once_for_its_own_app() {
        let keys = AppKeys::new(b"secret");
        let now = 1_000_000;
        let t = keys.ticket(&caller(), &app(8888), now).unwrap();
        assert!(keys.trade(&t, &app(6006), now).is_none(), "another port");
        let (pass, claims) = keys.trade(&t, &app(8888), now).unwrap();
        assert_eq!(claims.sub, "u1");
        assert!(keys.trade(&t, &app(8888), now).is_none(), "spent");
        assert!(keys.verify(&pass, Kind::Pass, &app(8888), now).is_some());
        assert!(keys.verify(&pass, Kind::Ticket, &app(8888), now).is_none());
        assert!(keys.verify(&t, Kind::Pass, &app(8888), now).is_none());
        let late = now + (PASS_SECS + 1) * 1000;
        assert!(keys.verify(&pass, Kind::Pass, &app(8888), late).is_none());
    }

    #[test]
    fn tickets_expire_and_keys_do_not_cross() {
        let keys = AppKeys::new(b"secret");
        let t = keys.ticket(&caller(), &app(8888), 0).unwrap();
        assert!(keys
            .trade(&t, &app(8888), (TICKET_SECS + 1) * 1000)
            .is_none());
        let other = AppKeys::new(b"another secret");
        let t = keys.ticket(&caller(), &app(8888), 0).unwrap();
        assert!(other.trade(&t, &app(8888), 0).is_none());
        // A platform session signed with the platform secret itself is no pass either.
        let platform = crate::auth::session::SessionKeys::new(b"secret", 3600, false);
        let session = platform
            .issue(&crate::auth::session::Claims {
                sub: "u1".into(),
                sid: "s1".into(),
                csrf: "c".into(),
                iat: 0,
                exp: 3600,
            })
            .unwrap();
        assert!(keys.verify(&session, Kind::Pass, &app(8888), 0).is_none());
    }
}
