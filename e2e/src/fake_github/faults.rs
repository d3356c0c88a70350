//! Injected faults: per endpoint, the next N answers replaced or delayed.

use serde::{Deserialize, Serialize};

use super::endpoint::Endpoint;

/// One queued fault. `latency_ms` alone delays a normal answer; with `status` the answer is
/// replaced; `drop_connection` closes the connection without an answer; `lose_body` lets the
/// request take effect and then breaks the answer's body after its status (a 201 whose body
/// never arrives: the registration exists, its JIT is lost).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Fault {
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(default)]
    pub retry_after_secs: Option<u64>,
    #[serde(default)]
    pub latency_ms: u64,
    #[serde(default)]
    pub drop_connection: bool,
    #[serde(default)]
    pub lose_body: bool,
}

/// Admin request body: `POST /_admin/faults`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FaultRequest {
    pub endpoint: Endpoint,
    #[serde(default = "one")]
    pub count: u32,
    #[serde(flatten)]
    pub fault: Fault,
}

fn one() -> u32 {
    1
}
