//! What carries the decisions out: the writes to the API server (`writes`, `ledger_batch`), housekeeping of attempts (`attempts`), the attempts' GitHub side (`supervisor`) and Events (`events`).

pub mod attempts;
pub mod events;
pub mod ledger_batch;
pub mod supervisor;
pub mod writes;
