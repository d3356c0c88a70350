//! Docker for native jobs (issue 31 item 1): each attempt of a policy with `spec.docker` gets
//! its own rootless engine ([`engine`]) and, as its `DOCKER_HOST`, a socket the agent serves
//! ([`proxy`]) that checks and labels every request ([`rules`]) before the engine sees it.

pub mod engine;
pub mod proxy;
pub mod rules;
pub mod served;

pub use served::DockerJobs;
