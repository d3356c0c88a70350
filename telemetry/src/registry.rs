//! Registering a binary's metrics: each is made, registered under its name and help, and kept
//! by the caller in one step. prometheus-client's metrics are shared handles, so the copy the
//! registry encodes and the one the binary bumps count together.

use prometheus_client::registry::{Metric, Registry};

/// A new `M` (its default: a counter or gauge at 0, an empty family) registered as `name`.
pub fn registered<M>(registry: &mut Registry, name: &str, help: &str) -> M
where
    M: Metric + Clone + Default,
{
    registered_as(registry, name, help, M::default())
}

/// `metric` (one with no useful default, such as a histogram and its buckets) registered as
/// `name`.
pub fn registered_as<M>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M
where
    M: Metric + Clone,
{
    registry.register(name, help, metric.clone());
    metric
}

#[cfg(test)]
mod tests {
    use prometheus_client::metrics::counter::Counter;

    use super::*;

    #[test]
    fn the_kept_handle_is_the_registered_metric() {
        let mut registry = Registry::with_prefix("t");
        let c: Counter = registered(&mut registry, "things", "Things seen");
        c.inc();
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        assert!(out.contains("# HELP t_things Things seen"), "{out}");
        assert!(out.contains("t_things_total 1"), "{out}");
    }
}
