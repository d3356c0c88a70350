//! The agent's edges to the API server, below every step: its counted client, the node's attempts and their conditions, Events, the node Lease, and what launch, supervision and cleanup share about one attempt.

pub mod api_requests;
pub mod attempt_ctx;
pub mod attempts;
pub mod conditions;
pub mod events;
pub mod lease;
