//! A concluded attempt taken apart in order, and what the orphan sweep finds and remembers.

pub mod abandoned;
pub mod cleanup;
pub mod orphans;
