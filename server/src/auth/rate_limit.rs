//! Throttles on guessing: password checks per account *and client address* (a flood from one
//! address slows only that address's guesses, and cannot lock the owner out from another),
//! every password check per address (spraying many accounts), and sign-ups per address
//! (creating accounts, and probing which emails have one).

use std::net::IpAddr;
use std::num::NonZeroU32;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};

use crate::error::ApiError;

pub struct LoginLimiter {
    per_account: DefaultKeyedRateLimiter<(String, Option<IpAddr>)>,
    per_address: DefaultKeyedRateLimiter<IpAddr>,
    signups: DefaultKeyedRateLimiter<IpAddr>,
}

fn refuse(not_until: governor::NotUntil<governor::clock::QuantaInstant>) -> ApiError {
    let clock = DefaultClock::default();
    ApiError::RateLimited {
        retry_after_secs: not_until.wait_time_from(clock.now()).as_secs().max(1),
    }
}

impl LoginLimiter {
    pub fn new(
        per_account_per_minute: u32,
        per_address_per_minute: u32,
        signups_per_minute: u32,
    ) -> Self {
        let quota = |n: u32| Quota::per_minute(NonZeroU32::new(n.max(1)).expect("at least one"));
        LoginLimiter {
            per_account: DefaultKeyedRateLimiter::keyed(quota(per_account_per_minute)),
            per_address: DefaultKeyedRateLimiter::keyed(quota(per_address_per_minute)),
            signups: DefaultKeyedRateLimiter::keyed(quota(signups_per_minute)),
        }
    }

    /// Before checking a password of `account` (login, or the current password on a
    /// password change) for a client at `address`.
    pub fn check(&self, account: &str, address: Option<IpAddr>) -> Result<(), ApiError> {
        if let Some(addr) = address {
            self.per_address.check_key(&addr).map_err(refuse)?;
        }
        self.per_account
            .check_key(&(account.to_owned(), address))
            .map_err(refuse)?;
        Ok(())
    }

    pub fn check_signup(&self, address: Option<IpAddr>) -> Result<(), ApiError> {
        match address {
            Some(addr) => self.signups.check_key(&addr).map_err(refuse),
            None => Ok(()),
        }
    }

    /// Drops idle keys so the limiter's memory does not grow with every address ever seen.
    pub fn shrink(&self) {
        self.per_account.retain_recent();
        self.per_address.retain_recent();
        self.signups.retain_recent();
    }
}
