//! Primary rate limits: one budget per bucket (`x-ratelimit-resource`), reset every window.

use axum::http::{HeaderMap, HeaderValue};
use serde::{Deserialize, Serialize};

use super::endpoint::Resource;

/// Which status an exhausted bucket answers with (GitHub uses both).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum ExceededStatus {
    #[default]
    #[serde(rename = "403")]
    Forbidden,
    #[serde(rename = "429")]
    TooManyRequests,
}

#[derive(Debug, Clone)]
pub struct Bucket {
    pub limit: u64,
    pub used: u64,
    pub reset_at: i64,
    pub window_secs: i64,
    pub exceeded_status: ExceededStatus,
}

impl Bucket {
    #[must_use]
    pub fn new(limit: u64, window_secs: i64, now: i64) -> Self {
        Self {
            limit,
            used: 0,
            reset_at: now + window_secs,
            window_secs,
            exceeded_status: ExceededStatus::default(),
        }
    }

    /// GitHub's defaults: 5,000 core calls an hour for an installation; 10,000 registrations.
    #[must_use]
    pub fn default_for(resource: Resource, now: i64) -> Self {
        match resource {
            Resource::Core => Self::new(5000, 3600, now),
            Resource::ActionsRunnerRegistration => Self::new(10_000, 3600, now),
            // GraphQL counts points; the fake counts one per query.
            Resource::Graphql => Self::new(5000, 3600, now),
        }
    }

    fn roll(&mut self, now: i64) {
        if now >= self.reset_at {
            self.used = 0;
            self.reset_at = now + self.window_secs;
        }
    }

    /// Takes one call from the budget; `false` when it is exhausted.
    pub fn take(&mut self, now: i64) -> bool {
        self.roll(now);
        if self.used >= self.limit {
            return false;
        }
        self.used += 1;
        true
    }

    /// Returns a call taken for a request that turned out free (a 304).
    pub fn give_back(&mut self) {
        self.used = self.used.saturating_sub(1);
    }

    #[must_use]
    pub fn remaining(&self) -> u64 {
        self.limit.saturating_sub(self.used)
    }

    pub fn write_headers(&self, resource: Resource, headers: &mut HeaderMap) {
        headers.insert("x-ratelimit-limit", HeaderValue::from(self.limit));
        headers.insert("x-ratelimit-remaining", HeaderValue::from(self.remaining()));
        headers.insert("x-ratelimit-reset", HeaderValue::from(self.reset_at));
        headers.insert("x-ratelimit-used", HeaderValue::from(self.used));
        headers.insert(
            "x-ratelimit-resource",
            HeaderValue::from_static(resource.as_str()),
        );
    }

    #[must_use]
    pub fn to_json(&self, now: i64) -> serde_json::Value {
        let mut b = self.clone();
        b.roll(now);
        serde_json::json!({
            "limit": b.limit, "remaining": b.remaining(), "reset": b.reset_at, "used": b.used,
        })
    }
}
