#![warn(missing_docs)]

//! `weft-router`: the feedback-aware router.
//!
//! - [`model`]: the fitted state (decayed per tenant x context x candidate statistics) and
//!   its versioned snapshot file;
//! - [`features`], [`learner`], [`live`]: the contextual model of the default policy,
//!   `squarecb` (hashed context x candidate features, online regression, SquareCB
//!   exploration), learnt at once from feedback and reconciled with ClickHouse;
//! - [`decide`]: one decision in stages (limits, constraints, choice, the decision built);
//! - [`overlay`]: this replica's feedback not yet in the aggregates, counted at once;
//! - [`policy`]: greedy, epsilon-greedy, Thompson sampling, UCB and static choice, each with
//!   its propensity, under the request's constraints;
//! - [`eval`]: off-policy estimates (IPS, SNIPS, DR) with bootstrap intervals;
//! - [`store`]: reading the aggregates and the logged decisions through `weft-store`;
//! - [`service`]: the HTTP service (`weft router`).

pub mod decide;
pub mod error;
pub mod eval;
pub mod features;
pub mod learner;
pub mod live;
pub mod metrics;
pub mod model;
pub mod overlay;
pub mod policy;
pub mod rng;
pub mod service;
pub mod store;
