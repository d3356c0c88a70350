//! What a person reads: `/metrics` and health, and the closed vocabularies they are labelled with.

pub mod health;
pub mod labels;
pub mod metrics;
