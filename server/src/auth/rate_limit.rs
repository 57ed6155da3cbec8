//! Login throttling per account and per client address, so a password cannot be guessed by
//! brute force against one account nor sprayed across many from one address.

use std::net::IpAddr;
use std::num::NonZeroU32;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};

use crate::error::ApiError;

pub struct LoginLimiter {
    per_account: DefaultKeyedRateLimiter<String>,
    per_address: DefaultKeyedRateLimiter<IpAddr>,
}

impl LoginLimiter {
    pub fn new(per_account_per_minute: u32, per_address_per_minute: u32) -> Self {
        let quota = |n: u32| Quota::per_minute(NonZeroU32::new(n.max(1)).expect("at least one"));
        LoginLimiter {
            per_account: DefaultKeyedRateLimiter::keyed(quota(per_account_per_minute)),
            per_address: DefaultKeyedRateLimiter::keyed(quota(per_address_per_minute)),
        }
    }

    pub fn check(&self, account: &str, address: Option<IpAddr>) -> Result<(), ApiError> {
        let clock = DefaultClock::default();
        let refuse = |not_until: governor::NotUntil<_>| ApiError::RateLimited {
            retry_after_secs: not_until.wait_time_from(clock.now()).as_secs().max(1),
        };
        if let Some(addr) = address {
            self.per_address.check_key(&addr).map_err(refuse)?;
        }
        self.per_account
            .check_key(&account.to_owned())
            .map_err(refuse)?;
        Ok(())
    }

    /// Drops idle keys so the limiter's memory does not grow with every address ever seen.
    pub fn shrink(&self) {
        self.per_account.retain_recent();
        self.per_address.retain_recent();
    }
}
