//! The loop: the leader's `Controller<ScalePolicy>` and its triggers (`runtime`), the pure trigger index its mappers read (`index`), the reflector caches (`cache`) and leader election (`leader`).

pub mod cache;
pub mod index;
pub mod leader;
pub mod runtime;
